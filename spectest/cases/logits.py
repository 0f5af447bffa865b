"""Logits-level cases: logits, per-row sampling parameters, and the processed distributions.

A :class:`LogitsCase` is a small recipe (sizes, mix of parameters, a seed), drawn by
Hypothesis and replayed from its repr. :func:`build_logits` turns it into float32 logits and
per-row :class:`~spectest.sampling_params.SamplingParams`, choosing every parameter away from
its decision boundaries at every position of the row (a top-p that lands within rounding of a
cumulative sum, or a tie at a top-k cut or an argmax, would make "the processed distribution"
depend on float order rather than on the parameters). Its processed target and draft
distributions (float64) are what exact speculative output must follow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from spectest.cases.sizes import draft_lengths, seeds, vocab_sizes
from spectest.protocol import DEFAULT_ORDER, PARAMETERS
from spectest.sampling_params import NO_SEED, SamplingParams, process_logits

# Distances from decision boundaries that float32 implementations resolve like float64 ones.
ARGMAX_GAP = 1e-3  # logits: the top logit (exact ties allowed) minus the next one below it
TOP_K_GAP = 1e-4  # relative, between the k-th and (k+1)-th probability
TOP_P_GAP = 2e-4  # absolute, between top_p and any cumulative sum
MIN_P_GAP = 1e-3  # relative, between min_p and any probability / top probability
TRIES = 8


@dataclass(frozen=True)
class LogitsCase:
    """One batch of logits with per-row parameters; shares are fractions of rows."""

    batch: int
    k: int
    vocab: int
    seed: int
    greedy_share: float = 0.25
    filter_share: float = 0.5
    masked_share: float = 0.3  # rows whose target forbids tokens (logit -inf)
    scale: float = 2.0  # logit spread: larger means peakier distributions
    tie_share: float = 0.0  # rows whose target logits tie exactly at the top (as bf16 logits often do)
    seeded: bool = False  # give every row its own seed (per-row-seeds capability)
    # "random": each filter on with probability filter_share; "one each": row r uses only
    # filter r mod 3 (so a bug in one filter moves whole rows, not a slice of a pooled test).
    filter_plan: str = "random"


@st.composite
def logits_cases(
    draw: st.DrawFn,
    *,
    batch: st.SearchStrategy[int] | None = None,
    k: st.SearchStrategy[int] | None = None,
    vocab: st.SearchStrategy[int] | None = None,
    greedy_share: st.SearchStrategy[float] | None = None,
    seeded: bool = False,
) -> LogitsCase:
    """Logits cases mixing greedy rows, temperatures and filters row by row."""
    return LogitsCase(
        batch=draw(batch if batch is not None else st.integers(1, 64)),
        k=draw(k if k is not None else draft_lengths(max_k=8)),
        vocab=draw(vocab if vocab is not None else vocab_sizes(max_size=4096)),
        seed=draw(seeds()),
        greedy_share=draw(greedy_share if greedy_share is not None else st.sampled_from((0.0, 0.25, 0.5))),
        filter_share=draw(st.sampled_from((0.0, 0.5, 1.0))),
        masked_share=draw(st.sampled_from((0.0, 0.3))),
        scale=draw(st.sampled_from((0.5, 2.0, 5.0))),
        seeded=seeded,
        tie_share=draw(st.sampled_from((0.0, 0.5))),
    )


@dataclass
class LogitsInputs:
    target_logits: np.ndarray  # float32 [B, K+1, V]
    draft_logits: np.ndarray  # float32 [B, K, V]
    params: SamplingParams  # on the CPU
    target: np.ndarray  # float64 [B, K+1, V], processed
    draft: np.ndarray  # float64 [B, K, V], processed

    def row_labels(self) -> list[str]:
        return [f" ({self.params.describe_row(r)})" for r in range(self.params.batch_size)]

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, SamplingParams]:
        return (
            torch.as_tensor(self.draft_logits, device=device),
            torch.as_tensor(self.target_logits, device=device),
            self.params.to(device),
        )


def _row_logits(rng: np.random.Generator, case: LogitsCase) -> tuple[np.ndarray, np.ndarray]:
    k, v = case.k, case.vocab
    scale = case.scale * rng.uniform(0.5, 1.5)
    target = rng.normal(size=(k + 1, v)) * scale
    if v >= 3 and rng.random() < case.masked_share:
        masked = rng.random((k + 1, v)) < rng.uniform(0.3, 0.7)
        masked[np.arange(k + 1)[:, None], rng.permuted(np.tile(np.arange(v), (k + 1, 1)), axis=1)[:, :2]] = False
        target = np.where(masked, -np.inf, target)
    if v >= 2 and case.tie_share > 0 and rng.random() < case.tie_share:  # 2 or 3 tokens share the top logit exactly
        top = target.max(axis=-1, keepdims=True)
        tied = rng.permuted(np.tile(np.arange(v), (k + 1, 1)), axis=1)[:, : min(v, int(rng.integers(2, 4)))]
        target[np.arange(k + 1)[:, None], tied] = top
    style = rng.choice(("equal", "close", "far", "unrelated"))
    if style == "unrelated":
        draft = rng.normal(size=(k, v)) * scale
    else:
        noise = {"equal": 0.0, "close": 0.3, "far": 2.0}[style] * scale
        finite = np.where(np.isfinite(target[:k]), target[:k], rng.normal(size=(k, v)) * scale - scale)
        draft = finite + noise * rng.normal(size=(k, v))
    return target.astype(np.float32), draft.astype(np.float32)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def _top_k_ok(sorted_probs: np.ndarray, k: int) -> bool:
    """The k-th probability clear of the next at every position, or exactly tied with it: top-k
    keeps every token tied with the k-th (transformers', vLLM's and spectest's rule), so a cut
    through a tie keeps the whole tie, and then the end of the tie must be clear of what follows."""
    kth, nxt = sorted_probs[:, k - 1], sorted_probs[:, k]
    end = (sorted_probs >= kth[:, None]).sum(axis=-1)  # tokens kept: the tie included
    after = np.where(
        end < sorted_probs.shape[-1],
        sorted_probs[np.arange(len(end)), np.minimum(end, sorted_probs.shape[-1] - 1)],
        0.0,
    )
    clear = (kth == 0) | (kth > nxt * (1 + TOP_K_GAP))
    tie_then_clear = (kth == nxt) & (kth > after * (1 + TOP_K_GAP))
    return bool(np.all(clear | tie_then_clear))


def _top_p_ok(sorted_probs: np.ndarray, p: float) -> bool:
    """Mass clear of p at every prefix, and the last kept token strictly above the first dropped
    one (a cut through exactly tied tokens keeps an arbitrary subset of them)."""
    cumulative = np.cumsum(sorted_probs, axis=-1)
    if not np.all(np.abs(cumulative - p) > TOP_P_GAP):
        return False
    last = np.minimum((cumulative < p).sum(axis=-1), sorted_probs.shape[-1] - 1)
    after = np.minimum(last + 1, sorted_probs.shape[-1] - 1)
    rows = np.arange(sorted_probs.shape[0])
    kept, dropped = sorted_probs[rows, last], sorted_probs[rows, after]
    return bool(np.all((after == last) | (kept > dropped * (1 + TOP_K_GAP))))


def _min_p_ok(sorted_probs: np.ndarray, m: float) -> bool:
    ratio = sorted_probs / sorted_probs[:, :1]
    return bool(np.all(np.abs(ratio - m) > MIN_P_GAP * m))


def _choose_filter(rng: np.random.Generator, name: str, probs: np.ndarray) -> float | int | None:
    """A value for one filter that is clear of its boundaries at every position, or None."""
    v = probs.shape[-1]
    ordered = -np.sort(-probs, axis=-1)
    tied_top = v > 2 and bool(np.any(ordered[:, 0] == ordered[:, 1]))
    for attempt in range(TRIES):
        if name == "top_k" and v > 2:
            # A row whose top logits tie first tries a cut through the tie (k = 1).
            k = 1 if tied_top and attempt == 0 else int(rng.integers(1, min(v - 1, 64) + 1))
            if _top_k_ok(ordered, k):
                return k
        elif name == "top_p":
            p = float(np.float32(rng.uniform(0.2, 0.98)))
            if _top_p_ok(ordered, p):
                return p
        elif name == "min_p":
            m = float(np.float32(np.exp(rng.uniform(np.log(1e-2), np.log(0.5)))))
            if _min_p_ok(ordered, m):
                return m
    return None


def _apply(name: str, probs: np.ndarray, value: float) -> np.ndarray:
    ordered = -np.sort(-probs, axis=-1)
    if name == "top_k":
        keep = probs >= ordered[:, int(value) - 1 : int(value)]
    elif name == "top_p":
        before = np.cumsum(ordered, axis=-1) - ordered
        count = (before < value).sum(axis=-1, keepdims=True)
        keep = probs >= np.take_along_axis(ordered, count - 1, axis=-1)
    else:
        keep = probs >= value * ordered[:, :1]
    kept = np.where(keep, probs, 0.0)
    return kept / kept.sum(axis=-1, keepdims=True)


def _row_params(
    rng: np.random.Generator,
    case: LogitsCase,
    row: int,
    logits: np.ndarray,
    supported: tuple[str, ...],
    order: tuple[str, ...],
) -> dict[str, float]:
    """One row's parameters, drawn in the model's filter order from the row's actual logits."""
    params: dict[str, float] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    # Greedy rows: the top logit exactly tied or clear of the next by ARGMAX_GAP (a near-tie could
    # flip under a kernel's own rounding, and greedy exactness would then depend on it).
    top = logits.max(axis=-1, keepdims=True)
    below = np.where(logits < top, logits, -np.inf).max(axis=-1)
    if rng.random() < case.greedy_share and np.all(top[:, 0] - below > ARGMAX_GAP):
        params["temperature"] = 0.0
        return params
    if rng.random() >= 0.2:
        params["temperature"] = float(np.float32(rng.uniform(0.3, 2.0)))
    tempered = _softmax(logits.astype(np.float64) / np.float64(np.float32(params["temperature"])))
    # Each filter's value is drawn clear of its boundaries on the distribution it acts on: untempered
    # before "temperature" in the order (llama.cpp, MLX-LM, OpenVINO's top-k), tempered after it.
    probs = _softmax(logits.astype(np.float64)) if "temperature" in order else tempered
    filters = [name for name in order if name != "temperature"]
    for name in order:
        if name == "temperature":
            kept = np.where(probs > 0, tempered, 0.0)
            probs = kept / kept.sum(axis=-1, keepdims=True)
            continue
        index = filters.index(name)
        if case.filter_plan == "one each":
            wanted = row % len(filters) == index
        else:
            wanted = rng.random() < case.filter_share
        if name in supported and wanted:
            value = _choose_filter(rng, name, probs)
            if value is not None:
                params[name] = value
                probs = _apply(name, probs, value)
    return params


def build_logits(
    case: LogitsCase, *, supported: tuple[str, ...] = PARAMETERS, order: tuple[str, ...] = DEFAULT_ORDER
) -> LogitsInputs:
    """Logits, per-row parameters (only those ``supported``, filters in ``order``) and the
    processed distributions for a case."""
    rng = np.random.default_rng(case.seed)
    rows = [_row_logits(rng, case) for _ in range(case.batch)]
    target_logits = np.stack([t for t, _ in rows])
    draft_logits = np.stack([d for _, d in rows])
    chosen = [
        _row_params(rng, case, row, np.concatenate([t, d]), supported, order)
        for row, (t, d) in enumerate(zip(target_logits, draft_logits, strict=True))
    ]
    seeds = rng.choice(2**31, size=case.batch, replace=False) if case.seeded else [NO_SEED] * case.batch
    params = SamplingParams.build(
        case.batch, **{name: [row[name] for row in chosen] for name in PARAMETERS}, seed=[int(s) for s in seeds]
    )
    target = process_logits(torch.as_tensor(target_logits, dtype=torch.float64), params, order=order).numpy()
    draft = process_logits(torch.as_tensor(draft_logits, dtype=torch.float64), params, order=order).numpy()
    return LogitsInputs(target_logits, draft_logits, params, target, draft)
