"""Calibration and power of the statistics, shown rather than assumed.

Every rate here is checked by a binomial test sized in advance (``RatePlan``): it fails a correct
engine with probability at most 1e-4, and misses the shortfall it is sized for with probability
at most 0.01; the failure message states both.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy import stats

from spectest import strategies as sst
from spectest.cases.tensors import RepeatedBatch, to_tensor
from spectest.implementations.reference import verify
from spectest.sampling import make_generator
from spectest.statistics.checks import DistributionCheck, token_id_orders
from spectest.statistics.chisquare import Group, chisquare_groups
from spectest.statistics.sequential import MixtureEProcess

META_ALPHA = 1e-4  # probability that a calibration test fails a correct engine
META_BETA = 0.01  # probability that it misses the shortfall it is sized for


@dataclasses.dataclass(frozen=True)
class RatePlan:
    """A one-sided binomial test sized in advance: ``trials`` trials, and a verdict that a rate is
    at most ``claimed`` unless more than ``threshold`` events occur. Both error rates are exact:
    P(fail | rate = claimed) <= META_ALPHA and P(pass | rate = shortfall) <= META_BETA."""

    claimed: float
    shortfall: float
    trials: int
    threshold: int

    @classmethod
    def size(cls, claimed: float, shortfall: float) -> RatePlan:
        trials = 50
        while True:
            threshold = int(stats.binom.isf(META_ALPHA, trials, claimed))  # P(X > threshold) <= META_ALPHA
            if stats.binom.cdf(threshold, trials, shortfall) <= META_BETA:
                return cls(claimed, shortfall, trials, threshold)
            trials = int(trials * 1.1) + 1

    def holds(self, events: int) -> bool:
        return events <= self.threshold

    def describe(self, events: int, what: str) -> str:
        return (
            f"{events}/{self.trials} {what}; the claim (rate <= {self.claimed}) allows at most {self.threshold} "
            f"(this test fails a correct engine with probability <= {META_ALPHA:g}, and misses a rate of "
            f"{self.shortfall} with probability <= {META_BETA:g})"
        )


# Checks at alpha = 0.2 fail a correct sampler 20% of the time: sized to see 28% (1.4 times the level).
FALSE_FAILURES = RatePlan.size(0.2, 0.28)
# A planted deviation exactly at the tolerance is missed at most 1% of the time: sized to see 3%.
MISSES = RatePlan.size(0.01, 0.03)
# Null e-processes monitored after every observation cross 1/alpha in at most alpha of the streams.
CROSSINGS = RatePlan.size(0.1, 0.13)


def reference_check(seed: int, alpha: float, tolerance: float) -> DistributionCheck:
    """The per-position check of the suite, run on the reference sampler for one small case."""
    case = sst.ChainCase(batch=6, k=3, vocab=12, kinds=(("dirichlet", "far"), ("sparse", "close")), seed=seed)
    target_np, draft_np = sst.build_chain(case)
    b, k, v = case.batch, case.k, case.vocab
    check = DistributionCheck(
        "per-position",
        target_np.reshape(b * (k + 1), v),
        alpha=alpha,
        tolerance=tolerance,
        min_draws=50,
        max_draws=5000,
        views={"by probability": [None] * (b * (k + 1)), "by token id": token_id_orders(b * (k + 1), v)},
    )
    batch = RepeatedBatch(
        to_tensor(target_np, device="cpu", dtype="float64"), to_tensor(draft_np, device="cpu", dtype="float64")
    )
    draft_gen, verify_gen = make_generator(seed), make_generator(seed + 10**6)
    slots = torch.arange(k + 1)
    while not check.done:
        reps = check.next_batch(5000)
        emitted = verify(*batch.draw(reps, draft_gen), generator=verify_gen)
        present = emitted != -1
        rows = torch.arange(b).repeat(reps).unsqueeze(1)
        cell = (rows * (k + 1) + slots) * v + emitted.clamp_min(0)
        check.add(torch.bincount(cell[present], minlength=b * (k + 1) * v).view(b * (k + 1), v).numpy(), reps)
    return check


def test_a_check_at_its_plan_detects_the_tv_it_planned_for_where_most_groups_are_small():
    """Rows and positions reached rarely (a ragged batch's later positions) pool into one bin at the plan, and the fit
    leaves such a group out, its samples too: the plan counts only the groups it can test, or the check ends at its
    planned draws short of its planned TV (0.105 for 0.09 here when the plan counted them all)."""
    rng = np.random.default_rng(11)
    vocab, often, rare = 40, 10, 2000
    probs = rng.dirichlet(np.ones(vocab), size=often + rare)
    reach = np.r_[np.ones(often), np.full(rare, 0.004)]
    check = DistributionCheck(
        "per-position", probs, alpha=1e-5, tolerance=0.09, reach=reach, min_draws=20, max_draws=10**6
    )
    counts = np.stack([rng.multinomial(rng.binomial(check.planned, r), p) for p, r in zip(probs, reach, strict=True)])
    check.add(counts, check.planned)
    result = check.result()
    assert result.draws == result.planned_draws and result.min_detectable_tv <= 0.09, result.summary()


@pytest.mark.slow
@pytest.mark.cost(35)
def test_reference_p_values_are_uniform_and_false_failures_stay_nominal():
    """Under the null (the reference sampler), the fixed test's p-values are uniform (KS), and a
    check at alpha = 0.2 (sequential and fixed parts together) fails a correct sampler at most 20%
    of the time. (A level this large makes a miscalibration cheap to see; at the suite's far
    smaller levels only the p-values' uniformity speaks for the tail.)"""
    plan = FALSE_FAILURES
    p_values, failures = [], 0
    for seed in range(plan.trials):
        check = reference_check(seed, alpha=plan.claimed, tolerance=0.2)
        groups = [Group(check.counts[g], check.probs[g]) for g in range(check.probs.shape[0])]
        p_values.append(chisquare_groups("null", groups, alpha=plan.claimed).p_value)
        failures += not check.result().passed
    assert stats.kstest(p_values, "uniform").pvalue >= META_ALPHA
    assert plan.holds(failures), plan.describe(failures, f"false failures at alpha = {plan.claimed}")


def test_eprocess_under_continuous_monitoring_keeps_its_level():
    """Look after every single observation of null streams (300 observations each): sup E >= 1/alpha
    in at most alpha of them (Ville's inequality)."""
    rng = np.random.default_rng(5)
    alpha, streams, length = CROSSINGS.claimed, CROSSINGS.trials, 300
    mass = np.array([0.4, 0.3, 0.2, 0.1])
    prior = mass * mass.size
    draws = rng.choice(mass.size, size=(streams, length), p=mass)
    counts = np.zeros((streams, mass.size))
    log_e = np.zeros(streams)
    crossed = np.zeros(streams, dtype=bool)
    for t in range(length):
        x = draws[:, t]
        predictive = (prior[x] + counts[np.arange(streams), x]) / (prior.sum() + t)
        log_e += np.log(predictive) - np.log(mass[x])
        counts[np.arange(streams), x] += 1
        crossed |= log_e >= math.log(1 / alpha)
    assert CROSSINGS.holds(int(crossed.sum())), CROSSINGS.describe(int(crossed.sum()), "null streams crossed 1/alpha")
    # The batch implementation agrees with the observation-by-observation one.
    process = MixtureEProcess(mass, np.zeros(mass.size, dtype=np.int64))
    process.update(counts[0])
    assert process.log_e == pytest.approx(log_e[0], abs=1e-8)


@pytest.mark.parametrize("tolerance", [0.05, pytest.param(0.1, marks=pytest.mark.slow)])
def test_planted_deviation_at_the_tolerance_is_detected_with_the_promised_power(tolerance):
    """Draw from an alternative exactly ``tolerance`` away in TV, at the planned sample size:
    the check (sequential or fixed) rejects in at least 99% of trials."""
    rng = np.random.default_rng(int(tolerance * 1000))
    cells = 20
    null = np.full(cells, 1 / cells)
    alternative = null + np.where(np.arange(cells) % 2 == 0, 1, -1) * (2 * tolerance / cells)
    assert 0.5 * np.abs(alternative - null).sum() == pytest.approx(tolerance)
    plan = MISSES
    misses = 0
    for _ in range(plan.trials):
        check = DistributionCheck(
            "power", null[None, :], alpha=1e-6, tolerance=tolerance, min_draws=10, max_draws=10**7
        )
        while not check.done:
            batch = check.next_batch(10**6)
            check.add(rng.multinomial(batch, alternative)[None, :], batch)
        misses += check.result().passed
    assert plan.holds(misses), plan.describe(misses, f"planted deviations of TV {tolerance} missed")


def test_gross_bug_stops_after_a_few_hundred_draws():
    """A planted TV of 0.3 is caught by the e-process long before the planned size."""
    null = np.full(10, 0.1)
    alternative = np.r_[np.full(5, 0.16), np.full(5, 0.04)]
    check = DistributionCheck("gross", null[None, :], alpha=4e-6, tolerance=0.05, min_draws=10, max_draws=10**7)
    rng = np.random.default_rng(0)
    while not check.done:
        batch = check.next_batch(10**6)
        check.add(rng.multinomial(batch, alternative)[None, :], batch)
    result = check.result()
    assert result.stopped_early and not result.passed
    assert result.draws <= 1024 < check.planned
    assert "sequential test rejected after" in result.summary()
