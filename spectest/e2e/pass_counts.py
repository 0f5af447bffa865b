"""Tokens per pass from the counters real engines report: the exact law of a call's pass count.

Real engines do not say which tokens each pass emitted; they count (vLLM: ``spec_decode_num_drafts``,
``num_draft_tokens``, ``num_accepted_tokens``; OpenVINO GenAI: draft and accepted tokens). An adapter
turns its engine's counters into ``pass_counts`` after every ``generate``: ``passes``, the target passes
that verified drafts over the call's requests, and ``draft_tokens``, the drafts they verified (K per
pass: the law below needs K fixed).

Given the engine's output, the pass count has an exact law. Under standard rejection the token at
position t came from an accepted draft with probability r_t = min(p_t, q_t)(y_t) / p_t(y_t) given that
y_t came out, independently across positions, so the passes are a renewal chain along the text
(:func:`spectest.simulators.text.passes_law`, by dynamic programming, tail-safe: a pass that runs past
the end counts once, and what it accepted beyond the end, which vLLM's accepted-token counter includes,
plays no part). Requests are independent given their outputs, calls too: the law of every call's count
is a convolution, and the run's total is tested against the convolution of all of them, two-sided, by
its exact tail probabilities. A loop that throws a bonus or accepted drafts away needs more passes than
its own acceptance allows; one that counts passes it never ran, or accepts more than it may, fewer.

Looks: after 4, 8, 16, ... calls at alpha/2 * 2^-(j+1) for the j-th look (a gross bug stops in seconds),
and at the end at alpha/2: Bonferroni over the looks, so the check's false-failure probability is at
most its alpha. The run ends once the smallest relative shift in passes it detects at power 0.99 is
within ``--spec-tolerance`` (that depends on the outputs only, never on the counts under test), or at
the property's time budget, saying what it could detect.

``spectest_first_token`` says where a request's first new token comes from: ``drafted`` (default: the
first pass drafts from the prompt, as transformers does) or ``prefill`` (the prompt's own pass samples
it with no drafts and is not counted; vLLM V1). An engine that does not declare standard rejection has
its tokens per pass measured against the chain's expectation under standard rejection and token match
(r_t = q_t(y_t): a draft kept while it equals the target's sample), reported in the skip, never failed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from scipy.signal import fftconvolve
from scipy.stats import norm

from spectest import rules
from spectest.e2e.cases import EngineCase
from spectest.e2e.output import MAX_CALLS, MIN_CALLS, Scored, draft_rows, score
from spectest.e2e.protocol import TOKEN_WISE
from spectest.simulators.text import passes_law

if TYPE_CHECKING:
    from spectest.e2e.run import EngineRun

POWER = 0.99
FIRST_LOOK = 4  # calls before the first look (then 8, 16, ...)


def request_law(realized: np.ndarray, k: int, first_token: str) -> np.ndarray:
    """The law of one request's counted passes (index = passes) from its per-token acceptances."""
    counted = realized[1:] if first_token == "prefill" else realized
    return passes_law(counted, k) if counted.size else np.ones(1)


def convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The law of the sum of two independent counts (FFT for long supports; clipped and renormalised)."""
    out = np.convolve(a, b) if min(a.size, b.size) < 64 else fftconvolve(a, b)
    out = np.clip(out, 0.0, None)
    return out / out.sum()


def two_sided_p(law: np.ndarray, observed: int) -> float:
    """Exact two-sided p-value of ``observed`` under a discrete law on 0, 1, ...: twice the smaller tail."""
    if not 0 <= observed < law.size:
        return 0.0
    lower, upper = law[: observed + 1].sum(), law[observed:].sum()
    return float(min(1.0, 2 * min(lower, upper)))


def realized_acceptance(scored: Scored, q: torch.Tensor, token_wise: bool) -> np.ndarray:
    """[M] P(token t came from an accepted draft | it came out): min(p, q)(y) / p(y) under standard
    rejection, q(y) under token match (the draft equals the target's own sample)."""
    rows = torch.arange(len(scored.tokens))
    own = scored.probs[rows, scored.tokens]
    drafted = q[rows, scored.tokens]
    if not token_wise:
        return drafted.clamp(0, 1).numpy()
    return (torch.minimum(own, drafted) / own.clamp_min(1e-300)).clamp(0, 1).numpy()


@dataclass
class PassCountTest:
    """The run's observed passes against the convolution of every call's exact law."""

    alpha: float
    law: np.ndarray = field(default_factory=lambda: np.ones(1))
    observed: int = 0
    looks: int = 0
    rejected_at: float | None = None  # the level of the interim look that rejected

    def add(self, law: np.ndarray, observed: int) -> None:
        self.law = convolve(self.law, law)
        self.observed += observed

    @property
    def mean(self) -> float:
        return float(np.arange(self.law.size) @ self.law)

    @property
    def sd(self) -> float:
        n = np.arange(self.law.size)
        return float(np.sqrt(max(0.0, (n * n) @ self.law - self.mean**2)))

    def p_value(self) -> float:
        return two_sided_p(self.law, self.observed)

    def look(self) -> bool:
        """An interim look at its share of alpha; True when it rejects."""
        level = self.alpha / 2 * 2.0 ** -(self.looks + 1)
        self.looks += 1
        if self.p_value() < level:
            self.rejected_at = level
        return self.rejected_at is not None

    @property
    def final_level(self) -> float:
        return self.rejected_at if self.rejected_at is not None else self.alpha / 2

    @property
    def passed(self) -> bool:
        return self.rejected_at is None and self.p_value() >= self.alpha / 2

    def detectable_shift(self) -> float:
        """The smallest relative shift in expected passes the final look detects at power 0.99."""
        z = norm.isf(self.alpha / 4) + norm.isf(1 - POWER)
        return z * self.sd / self.mean if self.mean > 0 else float("inf")


def counted(spec: EngineRun, requests: int) -> tuple[int, int]:
    """(passes, K) from the engine's ``pass_counts`` after a call."""
    __tracebackhide__ = True
    counts = spec.pass_record(requests).counts
    passes, drafts = counts["passes"], counts["draft_tokens"]
    return passes, (drafts // passes if passes and drafts % passes == 0 else 0)


def check_pass_counts(spec: EngineRun, case: EngineCase) -> None:
    """Calls of ``case`` until the pass-count test can detect a shift of ``--spec-tolerance``; its verdict."""
    __tracebackhide__ = True
    started = time.perf_counter()
    token_wise = TOKEN_WISE in spec.engine.capabilities
    first = spec.engine.first_token
    allowance = spec.shared_allowance(1)
    spent_before = spec.ledger.total("calls")
    test = PassCountTest(spec.alpha)
    match = PassCountTest(spec.alpha)  # token match's expectation, reported beside standard rejection's
    calls = tokens = prefills = 0
    k = None
    while True:
        reqs = spec.requests(case, calls)
        outputs = spec.generate(reqs.prompts, reqs.params, case.max_new_tokens, reqs.seed)
        passes, call_k = counted(spec, len(outputs))
        calls += 1
        if k is None and passes == 0:
            pytest.skip(f"{spec.engine.name} counted no passes with drafts in its first call ({case.describe()})")
        if passes and (not call_k or (k is not None and call_k != k)):
            pytest.skip(
                f"{spec.engine.name}'s passes verify a varying number of drafts (pass_counts gave "
                f"{spec.pass_record(len(outputs)).counts}): the exact pass-count law needs a fixed K"
            )
        k = k or call_k
        scored = score(spec, reqs, outputs)
        q = draft_rows(spec, scored)
        for chain, standard in ((test, True), (match, False)):
            realized = realized_acceptance(scored, q, token_wise=standard)
            law = np.ones(1)
            for r in range(len(outputs)):
                law = convolve(law, request_law(realized[scored.request == r], k, first))
            chain.add(law, passes)
        tokens += len(scored.tokens)
        prefills += len(outputs) if first == "prefill" else 0
        if token_wise and calls >= FIRST_LOOK and calls & (calls - 1) == 0 and test.look():
            break
        out_of_time = allowance is not None and spec.ledger.total("calls") - spent_before >= allowance
        planned = test.detectable_shift() <= spec.session.tolerance
        if calls >= MAX_CALLS or (calls >= MIN_CALLS and (planned or out_of_time)):
            break
    measured = tokens / (test.observed + prefills)
    expected = tokens / (test.mean + prefills)
    figures = {
        "e2e": case.describe(),
        "passes_counted": test.observed,
        "passes_expected": test.mean,
        "passes_sd": test.sd,
        "tokens_per_pass_measured": measured,
        "tokens_per_pass_expected": expected,
        "tokens_per_pass_token_match": tokens / (match.mean + prefills),
        "draft_tokens_per_pass": k,
        "first_token": first,
        "calls": calls,
    }
    context = (
        f"{case.describe()}; {calls} calls, {tokens} tokens, K={k}, first token {first}: the engine counted "
        f"{test.observed} passes with drafts ({measured:.3f} tokens per pass), standard rejection along its own "
        f"output expects {test.mean:.1f} (sd {test.sd:.1f}; {expected:.3f} tokens per pass) and token match "
        f"{match.mean:.1f}"
    )
    if not token_wise:
        efficiency = (measured - 1) / (expected - 1) if expected > 1 else float("nan")
        spec.record(figures | {"acceptance_efficiency_from_counts": efficiency})
        pytest.skip(
            f"{spec.engine.name} does not declare standard-rejection: not held to its chain. From its counters: "
            f"{context}; accepted drafts per pass {efficiency:.3f} of standard rejection's"
        )
    p, shift = test.p_value(), test.detectable_shift()
    limited = shift > spec.session.tolerance and test.rejected_at is None
    spec.record(
        figures
        | {
            "check": rules.PASS_COUNTS,
            "p_value": p,
            "alpha": spec.alpha,
            "level": test.final_level,
            "interim_looks": test.looks,
            "detectable_relative_shift": shift,
            "time_limited": limited,
            "passed": test.passed,
            "duration_s": time.perf_counter() - started,
        }
    )
    relative = (test.observed - test.mean) / test.mean
    spec.conclude_exact_law(
        test.passed,
        rules.PASS_COUNTS,
        f"{context}. Relative shift in passes {relative:+.3f} ({(test.observed - test.mean) / max(test.sd, 1e-12):+.1f} "
        f"sd); exact two-sided p={p:.3g} at level {test.final_level:.3g} (alpha {spec.alpha:.2g} split over "
        f"{test.looks} interim looks and the last); the run detects a relative shift in passes of {shift:.3f} at "
        f"power {POWER}" + (" (time-limited: short of --spec-tolerance)" if limited else ""),
    )
