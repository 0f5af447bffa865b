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
from collections.abc import Callable
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
    """An order-1 Markov model whose every forward pass costs what a decoder's does.

    Two parts, as on any accelerator: reading ``weight_mb`` megabytes of weights once per pass
    (memory-bound, the same for one position or K + 1: why verifying K + 1 positions costs about
    one step), and ``layers`` [n, H] x [H, H] products over the n positions scored (the
    arithmetic that grows with positions). Both feed the output (as s - s, exactly zero, yet
    computed), so nothing can be skipped; the output is exactly ``table[tokens]``.
    """

    context_window: int | None = 1

    def __init__(
        self,
        table: np.ndarray | torch.Tensor,
        *,
        hidden: int,
        layers: int,
        weight_mb: float = 0.0,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.device = torch.device(device)
        self.table = torch.as_tensor(table, dtype=torch.float32, device=self.device)
        self.vocab_size = self.table.shape[1]
        gen = make_generator(seed, self.device)
        self.embedding = torch.randn((self.vocab_size + 1, hidden), generator=gen, device=self.device) / hidden**0.5
        self.weights = [
            torch.randn((hidden, hidden), generator=gen, device=self.device) / hidden**0.5 for _ in range(layers)
        ]
        rows = int(weight_mb * 2**20 / 4 / 256)
        self.bulk = torch.randn((rows, 256), generator=gen, device=self.device) if rows else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embedding[tokens]
        for weight in self.weights:
            hidden = torch.tanh(hidden @ weight)  # bounded: s - s below is exactly 0, never NaN
        s = hidden.sum(dim=-1, keepdim=True)
        if self.bulk is not None:
            s = s + self.bulk.sum()  # one read of every weight, finite
        return self.table[tokens] + (s - s)


def rolled_table(row: np.ndarray, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """[V + 1, V] float32 whose row c is ``row`` rotated left by c: a view of 2V numbers, so a
    Markov table at V = 128256 costs 1 MB, and every row holds the same values (a permutation)."""
    values = torch.as_tensor(np.asarray(row, dtype=np.float32), device=torch.device(device))
    return torch.cat([values, values]).unfold(0, values.numel(), 1)


def uniform_acceptance_pair(
    vocab: int, mix: float, *, seed: int = 0, concentration: float = 0.3, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Target and draft tables [V + 1, V] (float32 views) whose acceptance is the same in every context.

    The target row of context c is one base distribution p rotated by c, and the draft row is
    the same rotation of (1 - mix) p + mix * uniform, so each draft is accepted with probability
    a = sum min(p, draft) wherever it is: tokens per pass follow the i.i.d. model exactly. The
    returned a is computed from the float32 values the models hold.
    """
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.full(vocab, concentration)).astype(np.float32)
    mixed = ((1 - mix) * base.astype(np.float64) + mix / vocab).astype(np.float32)
    acceptance = min(1.0, float(np.minimum(base, mixed).astype(np.float64).sum()))  # float32 rows sum to 1 +- 1e-7
    return rolled_table(base, device=device), rolled_table(mixed, device=device), acceptance


def acceptance_from_passes(tokens_per_pass: torch.Tensor, k: int) -> float:
    """Maximum-likelihood per-draft acceptance from tokens emitted per pass: every pass accepted
    L - 1 drafts and, unless it emitted K + 1 tokens, rejected one."""
    accepted = int((tokens_per_pass - 1).sum())
    rejected = int((tokens_per_pass <= k).sum())
    return accepted / max(1, accepted + rejected)


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, N]
    seconds: float  # on the clock the loop was given
    passes: int = 0
    tokens_per_pass: torch.Tensor | None = None  # per row and pass (speculative only)
    emitted: int = 0  # tokens produced over all rows (speculative rows may overshoot N)
    k: int = 0  # draft tokens per pass (speculative only)
    # Seconds per pass (speculative: draft, target, verify, other) or per step (plain: target,
    # other), when the loop was asked to time its phases.
    phases: np.ndarray | None = None

    @property
    def acceptance(self) -> float:
        """Maximum-likelihood per-draft acceptance: accepted / (accepted + rejected) drafts."""
        if self.tokens_per_pass is None:
            return float("nan")
        return acceptance_from_passes(self.tokens_per_pass, self.k)


SPECULATIVE_PHASES = ("draft", "target", "verify", "other")
PLAIN_PHASES = ("target", "other")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Laps:
    """Split each loop iteration into ``width`` phases on ``clock`` (synchronising a GPU at each
    boundary); costs nothing per iteration when phases are not wanted."""

    def __init__(self, clock: Callable[[], float], device: torch.device, wanted: bool, width: int) -> None:
        self.clock, self.device, self.wanted, self.width = clock, device, wanted, width
        self.laps: list[float] = []
        synchronize(device)
        self.started = self.last = clock()

    def lap(self) -> None:
        if self.wanted:
            synchronize(self.device)
            now = self.clock()
            self.laps.append(now - self.last)
            self.last = now

    def finish(self) -> tuple[float, np.ndarray | None]:
        synchronize(self.device)
        seconds = self.clock() - self.started
        return seconds, np.array(self.laps).reshape(-1, self.width) if self.wanted else None


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


def _next_context(model: CausalLM, history: torch.Tensor, lengths: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """The tokens that decide the distribution after ``extra``: the last ``context_window`` of
    context + extra (one position for a Markov model, as a cached decoder step scores one)."""
    tokens = _contexts(model, history, lengths, extra)
    window = getattr(model, "context_window", None)
    return tokens if window is None else tokens[:, -window:]


def _history(batch: int, size: int, start: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    history = torch.full((batch, size + 1), PAD, dtype=torch.int64, device=device)
    history[:, 0] = start  # the start context; generated tokens follow it
    return history, torch.ones(batch, dtype=torch.int64, device=device)


def plain_decode(
    target: CausalLM,
    *,
    batch: int,
    tokens: int,
    start: int,
    generator: torch.Generator,
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
    phases: bool = False,
) -> DecodeResult:
    """One target pass (over one new position) per token."""
    history, lengths = _history(batch, tokens, start, device)
    none = torch.empty((batch, 0), dtype=torch.int64, device=device)
    rows = torch.arange(batch, device=device)
    laps = _Laps(clock, device, phases, len(PLAIN_PHASES))
    for _ in range(tokens):
        probs = target.forward(_contexts(target, history, lengths, none))[:, -1]
        laps.lap()
        history[rows, lengths] = sample_categorical(probs, generator)
        lengths += 1
        laps.lap()
    seconds, timed = laps.finish()
    return DecodeResult(history[:, 1:], seconds, emitted=batch * tokens, phases=timed)


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
    clock: Callable[[], float] = time.perf_counter,
    phases: bool = False,
    passes: int | None = None,
) -> DecodeResult:
    """Per pass: K draft steps (one new position each), one target pass over K + 1 positions,
    one verify call. All rows advance in lockstep passes; each keeps what its verify emitted.
    Runs until every row holds ``tokens`` tokens, or exactly ``passes`` passes when given (so
    that tokens-per-pass counts are multinomial, with no stopping rule that looks at them)."""
    limit = passes
    if limit is not None:
        tokens = limit * (k + 1)
    history, lengths = _history(batch, tokens + k + 1, start, device)
    slots = torch.arange(k + 1, device=device)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    per_pass, passes = [], 0
    laps = _Laps(clock, device, phases, len(SPECULATIVE_PHASES))
    while passes < limit if limit is not None else bool((lengths <= tokens).any()):
        drafted = torch.empty((batch, 0), dtype=torch.int64, device=device)
        draft_rows = []
        for _ in range(k):
            q = draft.forward(_next_context(draft, history, lengths, drafted))[:, -1]
            drafted = torch.cat([drafted, sample_categorical(q, generator).unsqueeze(1)], dim=1)
            draft_rows.append(q)
        draft_probs = torch.stack(draft_rows, dim=1)
        laps.lap()
        target_probs = target.forward(_contexts(target, history, lengths, drafted))[:, -(k + 1) :]
        laps.lap()
        emitted = call_verify(verifier, drafted, draft_probs, target_probs, generator, timeout=timeout)
        laps.lap()
        present = emitted != PAD
        count = present.sum(dim=1)
        where = (lengths.unsqueeze(1) + slots).clamp(max=history.shape[1] - 1)
        history[rows.expand_as(where)[present], where[present]] = emitted[present]
        lengths += count
        per_pass.append(count)
        passes += 1
        laps.lap()
    seconds, timed = laps.finish()
    produced = int((lengths - 1).sum())
    return DecodeResult(
        history[:, 1 : tokens + 1], seconds, passes, torch.stack(per_pass, dim=1), produced, k, phases=timed
    )
