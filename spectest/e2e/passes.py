"""Tokens per pass, exactly: every draft a token-wise loop verifies is a trial the target can predict.

In a pass that proposes K drafts, the draft at offset j is verified in the context of the emitted
prefix (the drafts before it were accepted, so they are the emitted tokens). Under standard
rejection sampling it is accepted with probability a_t = sum_x min(p_t(x), q_t(x)), the processed
target and the engine's own processed draft at that prefix, both computable by teacher forcing the
engine's output; given everything before, the trials are independent. Tokens per pass are these
trials in a chain: L = 1 + the accepted run. So the chain law of every pass given its a_i is the
law of the trials, and their randomised PIT (a rejection: U = V (1 - a_t); an acceptance:
U = 1 - a_t + V a_t) is i.i.d. Uniform(0, 1) whatever the contexts. A loop that throws accepted
drafts away (or accepts more than it may) moves it; the statistics decides, grouped by the
offset in the pass (known before the trial).

What an engine reports (``tokens_per_pass`` and ``draft_lengths`` per prompt) says which tokens
were trials and how they ended: in a pass of K drafts emitting L tokens, offsets 0..L-2 were
accepted drafts, offset L-1 a rejection if L <= K (else the bonus, not a trial).

An engine that does not declare ``standard-rejection`` (one that samples the target and keeps a draft
while it equals the sample, as llama.cpp and MLX-LM do) is exact but accepts a draft from q with chance
sum_x p(x) q(x), not sum_x min(p(x), q(x)): for it the same trials measure its **acceptance efficiency**,
the accepted share of its trials over standard rejection's chance at the same contexts (with token
match's chance beside it), recorded and reported in the skip, never a failure.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from spectest import rules
from spectest.e2e.cases import EngineCase
from spectest.e2e.output import MAX_CALLS, MIN_CALLS, PitChecks, draft_rows, score
from spectest.e2e.pass_counts import check_pass_counts
from spectest.e2e.protocol import TOKEN_WISE
from spectest.e2e.targets import fragile
from spectest.sampling import make_generator

if TYPE_CHECKING:
    from spectest.e2e.run import EngineRun


def trials(tokens_per_pass: list[int], draft_lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token index, offset, accepted) of every verified draft of one request's passes."""
    index, offset, accepted = [], [], []
    start = 0
    for emitted, drafted in zip(tokens_per_pass, draft_lengths, strict=True):
        for j in range(min(emitted, drafted)):
            index.append(start + j)
            offset.append(j)
            accepted.append(j < emitted - 1)
        start += emitted
    return np.array(index, dtype=np.int64), np.array(offset, dtype=np.int64), np.array(accepted, dtype=bool)


def drafting_passes(tokens_per_pass: list[int], first_token: str) -> list[int]:
    """A request's passes after the prompt's: an engine whose prompt pass samples the first token
    (``prefill``) reports it as a pass of one token and no drafts, which the chain's tokens per pass leaves out."""
    return list(tokens_per_pass[1:]) if first_token == "prefill" else list(tokens_per_pass)


def trial_pit(acceptance: np.ndarray, accepted: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Randomised PIT of Bernoulli(acceptance) outcomes: uniform on [0, 1 - a) for a rejection, on
    [1 - a, 1) for an acceptance."""
    return np.where(accepted, 1 - acceptance + uniforms * acceptance, uniforms * (1 - acceptance)).clip(0, 1 - 1e-12)


def expected_tokens_per_pass(acceptance_by_offset: list[float]) -> float:
    """The chain's E[L] for per-offset acceptances a_0..a_{K-1}: 1 + sum_j prod_{i<=j} a_i."""
    return float(1 + np.cumprod(acceptance_by_offset).sum()) if acceptance_by_offset else 1.0


def check_acceptance(spec: EngineRun, case: EngineCase) -> None:
    """Calls of ``case`` until the acceptance-trial check has its planned draws; then its verdict."""
    __tracebackhide__ = True
    started = time.perf_counter()
    uniforms = make_generator(case.seed ^ 0x1B873593, "cpu")
    checks: PitChecks | None = None
    efficiency = Efficiency() if TOKEN_WISE not in spec.engine.capabilities else None
    sums = np.zeros(0)
    counts = np.zeros(0)
    calls = tokens = pass_tokens = emitted_passes = trial_count = skipped = 0
    while efficiency.open(calls) if efficiency else tally_open(checks, calls):
        reqs = spec.requests(case, calls)
        outputs = spec.generate(reqs.prompts, reqs.params, case.max_new_tokens, reqs.seed)
        record = spec.pass_record(len(reqs.prompts))
        if (record.tokens_per_pass is None or record.draft_lengths is None) and calls == 0 and record.counts:
            return check_pass_counts(spec, case)  # an engine that only counts: the exact law of its count
        if record.tokens_per_pass is None or record.draft_lengths is None:
            pytest.skip(
                f"{spec.engine.name} reports neither tokens_per_pass and draft_lengths nor pass_counts after a generate"
            )
        calls += 1
        scored = score(spec, reqs, outputs)
        q = draft_rows(spec, scored)
        acceptance = scored.acceptance(q).clamp(0, 1).numpy()
        shaky = fragile(scored.logits, scored.probs, scored.params, spec.order).numpy()
        base = np.concatenate([[0], np.cumsum([len(o) for o in outputs])])
        index, offset, accepted = [], [], []
        for r in range(len(outputs)):
            i, j, a = trials(record.tokens_per_pass[r], record.draft_lengths[r])
            if sum(record.tokens_per_pass[r]) != len(outputs[r]):
                spec.require(
                    False,
                    rules.E2E_PASSES,
                    f"{reqs.describe(r)}: tokens_per_pass {record.tokens_per_pass[r]} sums to "
                    f"{sum(record.tokens_per_pass[r])}, generate emitted {len(outputs[r])}",
                )
            index.append(base[r] + i)
            offset.append(j)
            accepted.append(a)
            after_prompt = drafting_passes(record.tokens_per_pass[r], spec.engine.first_token)
            emitted_passes += len(after_prompt)
            pass_tokens += sum(after_prompt)
        index, offset, accepted = np.concatenate(index), np.concatenate(offset), np.concatenate(accepted)
        keep = ~shaky[index]
        skipped += int((~keep).sum())
        index, offset, accepted = index[keep], offset[keep], accepted[keep]
        tokens += len(scored.tokens)
        trial_count += len(index)
        if efficiency is not None:
            match = scored.token_match(q).numpy()
            efficiency.add(accepted, acceptance[index], match[index])
            continue
        if checks is None:  # groups fixed by the engine's K, seen in the first call (never by an outcome)
            width = max(1, max(max(row, default=0) for row in record.draft_lengths))
            checks = PitChecks(
                spec,
                (rules.ACCEPTANCE_TRIALS,),
                [f"offset {j}" for j in range(width)],
                np.maximum(np.bincount(offset, minlength=width)[:width], 1e-3).astype(float),
                case.seed + 2,
            )
            sums, counts = np.zeros(width), np.zeros(width)
        offset = np.minimum(offset, len(checks.labels) - 1)
        np.add.at(sums, offset, acceptance[index])
        np.add.at(counts, offset, 1)
        v = torch.rand(len(index), generator=uniforms, dtype=torch.float64).numpy()
        checks.add(offset, [trial_pit(acceptance[index], accepted, v)])
    if efficiency is not None:
        efficiency.report(spec, case, calls, pass_tokens, emitted_passes, skipped)
    by_offset = [float(s / c) if c else 0.0 for s, c in zip(sums, counts, strict=True)]
    spec.record(
        {
            "e2e": case.describe(),
            "acceptance_by_offset": by_offset,
            "tokens_per_pass_measured": pass_tokens / max(1, emitted_passes),
            "tokens_per_pass_expected": expected_tokens_per_pass(by_offset),
            "trials": trial_count,
        }
    )
    context = (
        f"{case.describe()}; {calls} calls, {tokens} tokens, {pass_tokens} in {emitted_passes} drafting passes "
        f"({pass_tokens / max(1, emitted_passes):.3f} "
        f"per pass; {expected_tokens_per_pass(by_offset):.3f} from the mean acceptance by offset "
        f"{[round(a, 3) for a in by_offset]}), {trial_count} verified drafts ({skipped} at a filter's numerical edge left out)"
    )
    if checks is not None:
        for check in checks.checks:
            spec.conclude(check, context=context, started=started)


class Efficiency:
    """The acceptance efficiency of an engine that does not declare standard rejection: its accepted
    share of verified drafts over standard rejection's sum min(p, q) (and token match's sum p q) at the
    same contexts. A measurement (a Clopper-Pearson interval on the accepted share, divided by the
    mean chance), not a verdict."""

    TRIALS = 400  # enough for an interval about +-0.05 wide on the accepted share

    def __init__(self) -> None:
        self.accepted = self.trials = 0
        self.standard = self.match = 0.0

    def open(self, calls: int) -> bool:
        return calls < MIN_CALLS or (self.trials < self.TRIALS and calls < MAX_CALLS)

    def add(self, accepted: np.ndarray, standard: np.ndarray, match: np.ndarray) -> None:
        self.accepted += int(accepted.sum())
        self.trials += len(accepted)
        self.standard += float(standard.sum())
        self.match += float(match.sum())

    def report(self, spec: EngineRun, case: EngineCase, calls: int, tokens: int, passes: int, skipped: int) -> None:
        from scipy.stats import binomtest

        if self.trials == 0:
            pytest.skip(f"{spec.engine.name} verified no drafts in {calls} calls: no acceptance to measure")
        share = self.accepted / self.trials
        low, high = binomtest(self.accepted, self.trials).proportion_ci(0.95)
        standard, match = self.standard / self.trials, self.match / self.trials
        figures = {
            "e2e": case.describe(),
            "acceptance_measured": share,
            "acceptance_interval": [low, high],
            "acceptance_standard_rejection": standard,
            "acceptance_token_match": match,
            "acceptance_efficiency": share / standard if standard > 0 else None,
            "tokens_per_pass_measured": tokens / max(1, passes),
            "trials": self.trials,
        }
        spec.record(figures)
        efficiency = f"{share / standard:.3f} ({low / standard:.3f} to {high / standard:.3f})" if standard else "n/a"
        pytest.skip(
            f"{spec.engine.name} does not declare standard-rejection: not held to sum min(p, q). Its acceptance "
            f"efficiency against standard rejection: {efficiency}: accepted {self.accepted} of {self.trials} "
            f"verified drafts ({share:.3f}, 95% interval {low:.3f} to {high:.3f}) where standard rejection "
            f"accepts {standard:.3f} and token match {match:.3f} on average at the same contexts; "
            f"{tokens / max(1, passes):.2f} tokens per pass ({case.describe()}, {calls} calls, {skipped} trials at "
            "a filter's numerical edge left out)"
        )


def tally_open(checks: PitChecks | None, calls: int) -> bool:
    if calls >= MAX_CALLS:
        return False
    return calls < MIN_CALLS or checks is None or not (checks.done or checks.rejected)
