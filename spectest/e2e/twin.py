"""Speculation on against speculation off: a two-sample test of a server's output against a twin endpoint.

Where no local checkpoint can score the served target (``--spec-target``), a second endpoint of the same
model with speculative decoding off (``--spec-reference-url``) is the reference: for one prompt with one
set of parameters, repeated in every request of a call (inside the usual crowd), the engine's and the
twin's outputs are two samples of the same law if the engine is exact. At each position the token counts
of the two samples form a 2 x V table, tested for homogeneity (Pearson's chi-square, ``scipy.stats``);
ids drawn fewer than ``MIN_COUNT`` times in both samples together are pooled into one cell so the
chi-square approximation holds; the positions are combined by Bonferroni, and the test runs at the
check's share of the run's false-failure budget.

What it detects: any change in the marginal law of a position's token, from the first token on (a wrong
filter, temperature, seed stream, another request's parameters); its power is stated per run as the
smallest total-variation shift at one position it detects at power 0.99 (two samples of n draws, a
shift of TV d moves the chi-square noncentrality by at least 2 n d^2, counting mass moved among ids
drawn ``MIN_COUNT`` times or more). What it cannot: dependence between positions that leaves every
marginal intact, and anything the twin gets wrong too (it is trusted, as the checkpoint is otherwise).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from spectest import rules
from spectest.e2e.cases import EngineCase
from spectest.e2e.first_tokens import one_prompt
from spectest.protocol import OutsideTheImplementation
from spectest.statistics.chisquare import required_noncentrality

if TYPE_CHECKING:
    from spectest.e2e.run import EngineRun

MIN_COUNT = 10  # pooled below this: the chi-square approximation wants expected counts of about 5 per cell
MIN_CALLS, MAX_CALLS = 8, 1024  # calls of a few requests each (the rest of the call is the crowd)
POWER = 0.99


class TwinError(OutsideTheImplementation):
    """The reference endpoint failed: not the engine's failure, and no verdict on it."""


def homogeneity(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """(p, degrees of freedom) of the chi-square homogeneity test of two count vectors over one
    vocabulary, rare ids pooled into one cell; p = 1 when fewer than two cells remain."""
    total = a + b
    keep = total >= MIN_COUNT
    table = np.stack([a[keep], b[keep]], axis=0).astype(float)
    rare = np.array([[a[~keep].sum()], [b[~keep].sum()]], dtype=float)
    if rare.sum() > 0:
        table = np.concatenate([table, rare], axis=1)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0, 0
    result = stats.chi2_contingency(table, correction=False)
    return float(result.pvalue), int(result.dof)


def detectable_tv(draws: int, dof: int, level: float) -> float:
    """The smallest TV shift at one position detected at power ``POWER`` with ``draws`` per sample."""
    if draws == 0 or dof == 0:
        return float("inf")
    return float(np.sqrt(required_noncentrality(dof, level, POWER) / (2 * draws)))


def check_against_twin(spec: EngineRun, case: EngineCase) -> None:
    """Calls of ``case.requests`` copies of one prompt to the engine and to its twin, until the test can
    detect a TV shift of ``--spec-tolerance`` at a position (or its time); the homogeneity verdict."""
    __tracebackhide__ = True
    started = time.perf_counter()
    engine = spec.engine
    vocab = engine.vocab_size
    prompt, params = one_prompt(case, vocab, engine.prompt_tokens, engine.prompt_prefix)
    positions = case.max_new_tokens
    ours = np.zeros((positions, vocab), dtype=np.int64)
    theirs = np.zeros_like(ours)
    rng = np.random.default_rng([case.seed, 11])
    allowance = spec.shared_allowance(1)
    spent_before = spec.ledger.total("calls")
    level = spec.alpha / positions
    calls = 0
    while True:
        seed, twin_seed = (int(s) for s in rng.integers(0, 2**31 - 1, 2))  # independent draws on each side
        for counts, outputs in (
            (ours, spec.generate([prompt] * case.requests, params, positions, seed)),
            (theirs, twin_generate(spec, [prompt] * case.requests, params, positions, twin_seed)),
        ):
            for row in outputs:
                counts[np.arange(positions), row] += 1
        calls += 1
        draws = calls * case.requests
        dof = max(int((np.maximum(ours, theirs) > 0).sum(axis=1).max()) - 1, 1)
        planned = detectable_tv(draws, dof, level) <= spec.session.tolerance
        out_of_time = allowance is not None and spec.ledger.total("calls") - spent_before >= allowance
        if calls >= MAX_CALLS or (calls >= MIN_CALLS and (planned or out_of_time)):
            break
    tests = [homogeneity(ours[t], theirs[t]) for t in range(positions)]
    worst = int(np.argmin([p for p, _ in tests]))
    p = min(1.0, positions * tests[worst][0])
    shift = detectable_tv(draws, max(d for _, d in tests) or 1, level)
    tv = 0.5 * float(np.abs(ours[worst] - theirs[worst]).sum()) / draws
    spec.record(
        {
            "e2e": case.describe(),
            "check": rules.TWIN,
            "calls": calls,
            "draws_per_sample": draws,
            "p_value": p,
            "alpha": spec.alpha,
            "worst_position": worst + 1,
            "tv_at_worst_position": tv,
            "detectable_tv": shift,
            "time_limited": shift > spec.session.tolerance,
            "passed": p > spec.alpha,
            "duration_s": time.perf_counter() - started,
        }
    )
    spec.conclude_exact_law(
        p > spec.alpha,
        rules.TWIN,
        f"prompt {prompt} repeated in {case.requests} requests per call ({params.describe_row(0)}), "
        f"{positions} new tokens, {calls} calls: {draws} outputs from the engine and {draws} from its twin "
        f"without speculation; at position {worst + 1} the token counts differ by TV {tv:.3f} (chi-square "
        f"homogeneity p={tests[worst][0]:.3g}, {tests[worst][1]} degrees of freedom); Bonferroni over "
        f"{positions} positions p={p:.3g} at level {spec.alpha:.2g}; the run detects a TV shift of "
        f"{shift:.3f} at one position at power {POWER}",
    )


def twin_generate(spec: EngineRun, prompts, params, max_new_tokens: int, seed: int) -> list[list[int]]:
    """The twin's outputs for the same requests; a failure of the twin is a usage error, never the
    engine's verdict."""
    __tracebackhide__ = True
    from spectest.e2e.http import ServerError

    twin = spec.engine.engine.twin
    try:
        with spec.ledger.measure("calls"):
            outputs = twin.generate(prompts, params, max_new_tokens, seed)
    except ServerError as exc:
        raise TwinError(
            f"the reference endpoint (--spec-reference-url) failed, so there is no verdict: {exc}"
        ) from None
    vocab = spec.engine.vocab_size
    if len(outputs) != len(prompts) or any(
        len(o) != max_new_tokens or not all(0 <= t < vocab for t in o) for o in outputs
    ):
        raise TwinError(
            f"the reference endpoint {twin.name} returned outputs that are not {len(prompts)} rows of "
            f"{max_new_tokens} ids in [0, {vocab}): {[o[:20] for o in outputs[:3]]}"
        )
    return [[int(t) for t in o] for o in outputs]
