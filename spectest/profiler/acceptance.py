"""The acceptance profiler: how predictable is *this* text for a target/draft pair?

Both models score the text by teacher forcing (no sampling). At every position t the exact
acceptance rate a_t = sum min(p_t, q_t) of the (processed) next-token distributions is
recorded, and the per-token acceptance r_t = min(p_t, q_t)(y_t) / p_t(y_t) of the token the
text actually has; :mod:`simulators.text` turns the r_t into exact tokens per pass, slot
acceptances and the optimal K, and :mod:`simulators.speed` into speedup and break-even.

Model specs: ``ngram:N`` (byte-level, trained on ``--train`` files), ``hf:PATH`` (a local
transformers causal LM and its tokenizer; nothing is downloaded), ``toy:KIND`` (the harness's
Markov models, target and draft kinds as in ``spectest.cases.toy_models``; texts come from
``--generate``), and ``uniform`` (a draft that proposes every token of the target's
vocabulary with probability 1/V).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spectest.sampling_params import SamplingParams, process_logits
from spectest.simulators import CostModel, break_even_acceptance, expected_passes, slot_acceptance

MAX_K = 16
WINDOW = 64


class ProfileError(ValueError):
    """A problem with the user's models or texts (reported as a one-line error)."""


@dataclass
class Scorer:
    """A model that gives P(token t | tokens before t) for every position of a token sequence."""

    name: str
    vocabulary: str  # identity of the vocabulary: models must share it
    vocab_size: int
    next_probs: Callable[[Sequence[int]], np.ndarray]  # tokens [T] -> [T, V]
    encode: Callable[[bytes], list[int]] | None = None  # text -> tokens (None: texts are generated)


@dataclass
class TextProfile:
    name: str
    label: str
    tokens: np.ndarray  # [T] token ids
    acceptance: np.ndarray  # [T] a_t = sum min(p_t, q_t)
    realized: np.ndarray  # [T] r_t = min(p_t, q_t)(y_t) / p_t(y_t)
    impossible: int = 0  # tokens the processed target gives probability 0 (r_t set to a_t there)
    seconds: dict[str, float] = field(default_factory=dict)  # scoring time per model


def processed(probs: np.ndarray, params: SamplingParams | None) -> np.ndarray:
    """Apply temperature, top-k and top-p exactly as sampling would (spectest.sampling_params)."""
    if params is None:
        return probs
    with np.errstate(divide="ignore"):
        logits = torch.as_tensor(np.log(probs))[None]
    return process_logits(logits, params).numpy()[0]


def check_vocabulary(target: Scorer, draft: Scorer) -> None:
    """Speculative decoding needs one vocabulary: the draft proposes the target's tokens."""
    if target.vocabulary != draft.vocabulary or target.vocab_size != draft.vocab_size:
        raise ProfileError(
            f"target {target.name} ({target.vocabulary}, V={target.vocab_size}) and draft {draft.name} "
            f"({draft.vocabulary}, V={draft.vocab_size}) do not share a vocabulary: the draft must propose "
            "tokens of the target's vocabulary"
        )


def profile_tokens(
    target: Scorer,
    draft: Scorer,
    tokens: Sequence[int],
    *,
    name: str,
    label: str,
    params: SamplingParams | None = None,
) -> TextProfile:
    """Teacher-force both models over ``tokens`` and record a_t and r_t."""
    check_vocabulary(target, draft)
    if len(tokens) == 0:
        raise ProfileError(f"{name}: no tokens to profile")
    seconds = {}
    started = time.perf_counter()
    p = processed(target.next_probs(tokens), params)
    seconds["target"] = time.perf_counter() - started
    started = time.perf_counter()
    q = processed(draft.next_probs(tokens), params)
    seconds["draft"] = time.perf_counter() - started
    overlap = np.minimum(p, q)
    acceptance = overlap.sum(axis=-1)
    ids = np.asarray(tokens, dtype=np.int64)
    p_token = p[np.arange(ids.size), ids]
    possible = p_token > 0
    realized = np.where(possible, overlap[np.arange(ids.size), ids] / np.where(possible, p_token, 1.0), acceptance)
    return TextProfile(
        name, label, ids, np.clip(acceptance, 0, 1), np.clip(realized, 0, 1), int((~possible).sum()), seconds
    )


def below_stretches(acceptance: np.ndarray, threshold: float, window: int = WINDOW) -> list[tuple[int, int]]:
    """[start, end) token ranges whose moving-average acceptance (``window`` tokens) is below ``threshold``."""
    smooth = moving_average(acceptance, window)
    below = np.concatenate([[False], smooth < threshold, [False]])
    edges = np.flatnonzero(np.diff(below.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def moving_average(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Centred moving average; near the ends it averages the values that exist (no zero padding)."""
    window = max(1, min(window, values.size))
    kernel = np.ones(window)
    return np.convolve(values, kernel, mode="same") / np.convolve(np.ones(values.size), kernel, mode="same")


def summarize(profiles: Sequence[TextProfile], *, k: int, cost_ratio: float, name: str) -> dict[str, Any]:
    """Figures for one text or a group of texts (token-weighted; passes add over texts)."""
    acceptance = np.concatenate([p.acceptance for p in profiles])
    realized = np.concatenate([p.realized for p in profiles])
    tokens = int(acceptance.size)
    cost = CostModel(cost_ratio)

    def tokens_per_pass(kk: int) -> float:
        return tokens / sum(expected_passes(p.realized, kk) for p in profiles)

    per_k = {kk: tokens_per_pass(kk) for kk in range(1, MAX_K + 1)}
    speedups = {kk: per_k[kk] / cost.pass_cost(kk) for kk in per_k}
    best_k = max(speedups, key=speedups.get)
    break_even = break_even_acceptance(k, cost)
    slots = np.average(
        [slot_acceptance(p.realized, k) for p in profiles], axis=0, weights=[p.tokens.size for p in profiles]
    )
    windowed = moving_average(acceptance)
    stretches = [s for p in profiles for s in below_stretches(p.acceptance, break_even)] if break_even else []
    return {
        "name": name,
        "files": [p.name for p in profiles],
        "tokens": tokens,
        "mean_acceptance": float(acceptance.mean()),
        "acceptance_std": float(acceptance.std()),
        "acceptance_quantiles": {str(q): float(np.quantile(acceptance, q)) for q in (0.1, 0.5, 0.9)},
        "window_acceptance_range": [float(windowed.min()), float(windowed.max())],
        "mean_realized_acceptance": float(realized.mean()),
        "slot_acceptance": [float(x) for x in slots],
        "tokens_per_pass": per_k[k],
        "speedup": speedups[k],
        "break_even_acceptance": break_even,
        "margin": None if break_even is None else float(acceptance.mean() - break_even),
        "optimal_k": best_k if speedups[best_k] > 1 else 0,
        "optimal_speedup": max(speedups[best_k], 1.0),
        "tokens_below_break_even": int(sum(b - a for a, b in stretches)),
        "impossible_tokens": int(sum(p.impossible for p in profiles)),
    }


def measured_cost_ratio(profiles: Sequence[TextProfile]) -> float:
    """Draft scoring time over target scoring time, summed over the texts profiled."""
    target = sum(p.seconds.get("target", 0.0) for p in profiles)
    draft = sum(p.seconds.get("draft", 0.0) for p in profiles)
    return draft / target if target > 0 else 1.0


# ---------------------------------------------------------------- model specs


def ngram_scorer(order: int, train: Sequence[bytes]) -> Scorer:
    from spectest.profiler.ngram import NgramLM

    model = NgramLM(order, list(train))
    return Scorer(
        f"ngram:{order}",
        model.vocabulary,
        model.vocab_size,
        lambda tokens: model.next_probs(bytes(tokens)),
        encode=list,
    )


def markov_scorer(name: str, table: np.ndarray, vocabulary: str) -> Scorer:
    """Order-1 Markov model; position 0 is conditioned on the start context (row V)."""
    vocab = table.shape[1]

    def next_probs(tokens: Sequence[int]) -> np.ndarray:
        previous = np.concatenate([[vocab], np.asarray(tokens[:-1], dtype=np.int64)])
        return table[previous]

    return Scorer(name, vocabulary, vocab, next_probs)


def hf_scorer(path: str) -> Scorer:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ProfileError("hf:PATH needs transformers: pip install -e '.[hf]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    except OSError as exc:
        raise ProfileError(f"hf:{path}: cannot load a local model and tokenizer: {exc}") from None
    vocab = tokenizer.get_vocab()
    identity = f"hf-tokenizer/{len(vocab)}/{hash(tuple(sorted(vocab.items())))}"
    size = int(model.config.vocab_size)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id

    @torch.no_grad()
    def next_probs(tokens: Sequence[int]) -> np.ndarray:
        ids = torch.tensor([[bos if bos is not None else 0, *tokens]])
        logits = model(input_ids=ids[:, :-1]).logits[0].double()
        return torch.softmax(logits, dim=-1).numpy()

    def encode(text: bytes) -> list[int]:
        return tokenizer(text.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]

    return Scorer(f"hf:{path}", identity, size, next_probs, encode)


def uniform_scorer(like: Scorer) -> Scorer:
    def next_probs(tokens: Sequence[int]) -> np.ndarray:
        return np.full((len(tokens), like.vocab_size), 1.0 / like.vocab_size)

    return Scorer("uniform", like.vocabulary, like.vocab_size, next_probs, like.encode)


@dataclass
class Pair:
    target: Scorer
    draft: Scorer
    generate: Callable[[int, int], list[int]] | None = None  # (length, seed) -> tokens from the target


def build_pair(target: str, draft: str, *, train: Sequence[Path] = (), vocab: int = 8, seed: int = 0) -> Pair:
    """Scorers for the two specs (see the module docstring)."""
    texts = [Path(p).read_bytes() for p in train]
    if target.startswith("toy:") and (draft.startswith("toy:") or draft == "uniform"):
        from spectest.cases.toy_models import markov_pair

        draft_kind = draft.removeprefix("toy:") if draft != "uniform" else "uniform"
        try:
            t, d = markov_pair(np.random.default_rng(seed), vocab, target.removeprefix("toy:"), draft_kind)
        except ValueError as exc:
            raise ProfileError(str(exc)) from None
        identity = f"toy/{vocab}"
        pair = Pair(markov_scorer(target, t.table, identity), markov_scorer(draft, d.table, identity))

        def generate(length: int, sample_seed: int) -> list[int]:
            rng = np.random.default_rng(sample_seed)
            out, context = [], vocab
            for _ in range(length):
                context = int(rng.choice(vocab, p=t.table[context]))
                out.append(context)
            return out

        pair.generate = generate
        return pair
    scorers = []
    for spec in (target, draft):
        if spec == "uniform" and spec is draft:
            scorers.append(uniform_scorer(scorers[0]))
        elif spec.startswith("ngram:"):
            try:
                order = int(spec.removeprefix("ngram:"))
            except ValueError:
                raise ProfileError(f"{spec!r}: expected ngram:N with an integer order N") from None
            try:
                scorers.append(ngram_scorer(order, texts))
            except ValueError as exc:
                raise ProfileError(f"{spec}: {exc}") from None
        elif spec.startswith("hf:"):
            scorers.append(hf_scorer(spec.removeprefix("hf:")))
        elif spec.startswith("toy:"):
            scorers.append(Scorer(spec, f"toy/{vocab}", vocab, lambda tokens: np.empty(0)))
        else:
            raise ProfileError(f"unknown model {spec!r}: use ngram:N, hf:PATH, toy:KIND or (draft) uniform")
    return Pair(*scorers)
