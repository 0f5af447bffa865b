"""Plain and speculative decoding over a small causal-LM interface, with models of real cost.

``CausalLM.forward(tokens [B, n]) -> probs [B, n, V]``: the next-token distribution after each of
the n given tokens (what one batched pass over n positions yields). ``CostedMarkovLM`` has an
exactly known output (an order-1 Markov table) but does real tensor work on every pass: a stack
of matrix products over the positions scored, whose result is added to the output (as s - s,
exactly zero, yet computed), so nothing can be skipped and the cost grows with the number of
positions the way a transformer's does (weight reads dominate a few positions, arithmetic many).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from spectest.protocol import PAD, Model, call_verify
from spectest.sampling import make_generator, sample_categorical


class CausalLM(Protocol):
    """``forward(tokens [B, T]) -> probs [B, T, V]``: the next-token distribution after each token.

    ``context_window``: how many trailing tokens determine the next distribution (1 for an order-1
    Markov model; None for a real LM that needs its whole prefix, run with batch 1)."""

    vocab_size: int
    context_window: int | None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor: ...


class TransformersLM:
    """Adapter for a ``transformers`` causal LM (``AutoModelForCausalLM``-like): softmax of the
    logits over the whole prefix. Load weights from a local path; nothing is downloaded here."""

    context_window: int | None = None

    def __init__(self, model: object, *, start_token: int | None = None) -> None:
        self.model = model.eval()  # type: ignore[attr-defined]
        config = model.config  # type: ignore[attr-defined]
        self.vocab_size = int(config.vocab_size)
        bos = getattr(config, "bos_token_id", None)
        self.start_token = start_token if start_token is not None else (bos if bos is not None else 0)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model(input_ids=tokens).logits.float(), dim=-1)  # type: ignore[operator]


class CostedMarkovLM:
    """An order-1 Markov model whose every forward pass costs ``layers`` [n, H] x [H, H] products."""

    context_window: int | None = 1

    def __init__(
        self, table: np.ndarray, *, hidden: int, layers: int, device: torch.device | str = "cpu", seed: int = 0
    ):
        self.device = torch.device(device)
        self.table = torch.as_tensor(table, dtype=torch.float32, device=self.device)
        self.vocab_size = self.table.shape[1]
        gen = make_generator(seed, self.device)
        self.embedding = torch.randn((self.vocab_size + 1, hidden), generator=gen, device=self.device) / hidden**0.5
        self.weights = [
            torch.randn((hidden, hidden), generator=gen, device=self.device) / hidden**0.5 for _ in range(layers)
        ]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding[tokens]
        for weight in self.weights:
            hidden = torch.tanh(hidden @ weight)  # bounded: s - s below is exactly 0, never NaN
        s = hidden.sum(dim=-1, keepdim=True)
        return self.table[tokens] + (s - s)


def uniform_acceptance_pair(
    vocab: int, mix: float, *, seed: int = 0, concentration: float = 0.3
) -> tuple[np.ndarray, np.ndarray, float]:
    """Target and draft tables [V + 1, V] whose acceptance is the same in every context.

    Every target row is a permutation of one base distribution p, and the draft row is the same
    permutation of (1 - mix) p + mix * uniform, so each draft is accepted with probability
    a = sum min(p, draft) wherever it is: tokens per pass follow the i.i.d. model exactly.
    """
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.full(vocab, concentration))
    mixed = (1 - mix) * base + mix / vocab
    perms = [rng.permutation(vocab) for _ in range(vocab + 1)]
    target = np.stack([base[p] for p in perms])
    draft = np.stack([mixed[p] for p in perms])
    return target, draft, float(np.minimum(base, mixed).sum())


def acceptance_from_passes(tokens_per_pass: torch.Tensor, k: int) -> float:
    """Maximum-likelihood per-draft acceptance from tokens emitted per pass: every pass accepted
    L - 1 drafts and, unless it emitted K + 1 tokens, rejected one."""
    accepted = int((tokens_per_pass - 1).sum())
    rejected = int((tokens_per_pass <= k).sum())
    return accepted / max(1, accepted + rejected)


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, N]
    seconds: float
    passes: int = 0
    tokens_per_pass: torch.Tensor | None = None  # per row and pass (speculative only)
    emitted: int = 0  # tokens produced over all rows (speculative rows may overshoot N)
    k: int = 0  # draft tokens per pass (speculative only)

    @property
    def acceptance(self) -> float:
        """Maximum-likelihood per-draft acceptance: accepted / (accepted + rejected) drafts."""
        if self.tokens_per_pass is None:
            return float("nan")
        return acceptance_from_passes(self.tokens_per_pass, self.k)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _contexts(model: CausalLM, history: torch.Tensor, lengths: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """What to feed ``model``: each row's context (its whole history, or the last
    ``context_window`` tokens of it) followed by ``extra`` [B, m]."""
    window = getattr(model, "context_window", None)
    if window is None:
        if history.shape[0] != 1:
            raise ValueError("a model that needs its whole prefix (context_window None) decodes with batch 1")
        return torch.cat([history[:, : int(lengths[0])], extra], dim=1)
    # Rows that already finished keep running in lockstep (their output is discarded): keep
    # their reads inside the history however far they have overshot.
    index = (lengths.unsqueeze(1) - window + torch.arange(window, device=history.device)).clamp(0, history.shape[1] - 1)
    return torch.cat([history.gather(1, index), extra], dim=1)


def _history(batch: int, size: int, start: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    history = torch.full((batch, size + 1), PAD, dtype=torch.int64, device=device)
    history[:, 0] = start  # the start context; generated tokens follow it
    return history, torch.ones(batch, dtype=torch.int64, device=device)


def plain_decode(
    target: CausalLM, *, batch: int, tokens: int, start: int, generator: torch.Generator, device: torch.device
) -> DecodeResult:
    """One target pass (over one new position) per token."""
    history, lengths = _history(batch, tokens, start, device)
    none = torch.empty((batch, 0), dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(tokens):
        nxt = sample_categorical(target.forward(_contexts(target, history, lengths, none))[:, -1], generator)
        history[rows, lengths] = nxt
        lengths += 1
    synchronize(device)
    return DecodeResult(history[:, 1:], time.perf_counter() - started, emitted=batch * tokens)


def speculative_decode(
    target: CausalLM,
    draft: CausalLM,
    verifier: Model,
    *,
    batch: int,
    tokens: int,
    k: int,
    start: int,
    generator: torch.Generator,
    device: torch.device,
    timeout: float | None = None,
) -> DecodeResult:
    """Per pass: K draft passes over one new position each, one target pass over K + 1 positions,
    one verify call. All rows advance in lockstep passes; each keeps what its verify emitted."""
    history, lengths = _history(batch, tokens + k + 1, start, device)
    slots = torch.arange(k + 1, device=device)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    per_pass, passes = [], 0
    synchronize(device)
    started = time.perf_counter()
    while bool((lengths <= tokens).any()):
        drafted = torch.empty((batch, 0), dtype=torch.int64, device=device)
        draft_rows = []
        for _ in range(k):
            q = draft.forward(_contexts(draft, history, lengths, drafted))[:, -1]
            drafted = torch.cat([drafted, sample_categorical(q, generator).unsqueeze(1)], dim=1)
            draft_rows.append(q)
        target_probs = target.forward(_contexts(target, history, lengths, drafted))[:, -(k + 1) :]
        emitted = call_verify(
            verifier, drafted, torch.stack(draft_rows, dim=1), target_probs, generator, timeout=timeout
        )
        present = emitted != PAD
        count = present.sum(dim=1)
        where = (lengths.unsqueeze(1) + slots).clamp(max=history.shape[1] - 1)
        history[rows.expand_as(where)[present], where[present]] = emitted[present]
        lengths += count
        per_pass.append(count)
        passes += 1
    synchronize(device)
    seconds = time.perf_counter() - started
    produced = int((lengths - 1).sum())
    return DecodeResult(history[:, 1 : tokens + 1], seconds, passes, torch.stack(per_pass, dim=1), produced, k)
