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
    vocab_size: int

    def forward(self, tokens: torch.Tensor) -> torch.Tensor: ...


class CostedMarkovLM:
    """An order-1 Markov model whose every forward pass costs ``layers`` [n, H] x [H, H] products."""

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
        counts = self.tokens_per_pass
        accepted = int((counts - 1).sum())
        rejected = int((counts <= self.k).sum())
        return accepted / max(1, accepted + rejected)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_decode(
    target: CausalLM, *, batch: int, tokens: int, start: int, generator: torch.Generator, device: torch.device
) -> DecodeResult:
    """One target pass (over one position) per token."""
    out = torch.empty((batch, tokens), dtype=torch.int64, device=device)
    last = torch.full((batch, 1), start, dtype=torch.int64, device=device)
    synchronize(device)
    started = time.perf_counter()
    for t in range(tokens):
        nxt = sample_categorical(target.forward(last)[:, -1], generator)
        out[:, t] = nxt
        last = nxt.unsqueeze(1)
    synchronize(device)
    return DecodeResult(out, time.perf_counter() - started, emitted=batch * tokens)


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
    """Per pass: K draft passes over one position each, one target pass over K + 1 positions,
    one verify call. All rows advance in lockstep passes; each keeps what its verify emitted."""
    out = torch.full((batch, tokens + k + 1), PAD, dtype=torch.int64, device=device)
    lengths = torch.zeros(batch, dtype=torch.int64, device=device)
    last = torch.full((batch,), start, dtype=torch.int64, device=device)
    slots = torch.arange(k + 1, device=device)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    per_pass, passes = [], 0
    synchronize(device)
    started = time.perf_counter()
    while bool((lengths < tokens).any()):
        context, drafts, draft_rows = last, [], []
        for _ in range(k):
            q = draft.forward(context.unsqueeze(1))[:, -1]
            context = sample_categorical(q, generator)
            drafts.append(context)
            draft_rows.append(q)
        draft_ids = torch.stack(drafts, dim=1)
        target_probs = target.forward(torch.cat([last.unsqueeze(1), draft_ids], dim=1))
        emitted = call_verify(
            verifier, draft_ids, torch.stack(draft_rows, dim=1), target_probs, generator, timeout=timeout
        )
        present = emitted != PAD
        count = present.sum(dim=1)
        where = (lengths.unsqueeze(1) + slots).clamp(max=out.shape[1] - 1)
        out[rows.expand_as(where)[present], where[present]] = emitted[present]
        last = emitted.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
        lengths += count
        per_pass.append(count)
        passes += 1
    synchronize(device)
    seconds = time.perf_counter() - started
    return DecodeResult(out[:, :tokens], seconds, passes, torch.stack(per_pass, dim=1), int(lengths.sum()), k)
