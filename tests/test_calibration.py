"""Calibration and power of the statistical engine, shown rather than assumed.

Every rate here is checked with an exact binomial test at level 1e-4, so these tests
themselves fail a correct engine with probability below 1e-4 each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from spectest import strategies as sst
from spectest.cases import RepeatedBatch, to_tensor
from spectest.checks import DistributionCheck, token_id_orders
from spectest.reference import verify
from spectest.sampling import make_generator
from spectest.sequential import MixtureEProcess
from spectest.stats import Group, chisquare_groups

META_ALPHA = 1e-4


def rate_at_most(failures: int, trials: int, rate: float) -> bool:
    """False only if the observed count makes 'true rate <= rate' implausible (p < META_ALPHA)."""
    return stats.binomtest(failures, trials, rate, alternative="greater").pvalue >= META_ALPHA


def rate_at_least(successes: int, trials: int, rate: float) -> bool:
    return stats.binomtest(successes, trials, rate, alternative="less").pvalue >= META_ALPHA


def reference_check(seed: int, alpha: float, tolerance: float) -> DistributionCheck:
    """The per-position check of the suite, run on the reference sampler for one small case."""
    case = sst.ChainCase(batch=6, k=3, vocab=12, kinds=(("dirichlet", "far"), ("sparse", "close")), seed=seed)
    target_np, draft_np = sst.build_chain(case)
    b, k, v = case.batch, case.k, case.vocab
    check = DistributionCheck(
        "per-position", target_np.reshape(b * (k + 1), v), alpha=alpha, tolerance=tolerance, min_draws=50,
        max_draws=5000, views={"by probability": [None] * (b * (k + 1)), "by token id": token_id_orders(b * (k + 1), v)},
    )  # fmt: skip
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


def test_reference_p_values_are_uniform_and_false_failures_stay_nominal():
    """Under the null (the reference sampler), the fixed test's p-values are uniform (KS), and a
    check at alpha = 0.05 fails a correct sampler at most 5% of the time."""
    p_values, failures, runs = [], 0, 300
    for seed in range(runs):
        check = reference_check(seed, alpha=0.05, tolerance=0.2)
        groups = [Group(check.counts[g], check.probs[g]) for g in range(check.probs.shape[0])]
        p_values.append(chisquare_groups("null", groups, alpha=0.05).p_value)
        failures += not check.result().passed
    assert stats.kstest(p_values, "uniform").pvalue >= META_ALPHA
    assert rate_at_most(failures, runs, 0.05), f"{failures}/{runs} false failures at alpha = 0.05"


def test_eprocess_under_continuous_monitoring_keeps_its_level():
    """Look after every single observation of 300 null streams: sup E >= 1/alpha in at most alpha."""
    rng = np.random.default_rng(5)
    alpha, streams, length = 0.1, 3000, 300
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
    assert rate_at_most(int(crossed.sum()), streams, alpha), f"{crossed.sum()}/{streams} crossed 1/alpha"
    # The batch implementation agrees with the observation-by-observation one.
    process = MixtureEProcess(mass, np.zeros(mass.size, dtype=np.int64))
    process.update(counts[0])
    assert process.log_e == pytest.approx(log_e[0], abs=1e-8)


@pytest.mark.parametrize("tolerance", [0.05, 0.1])
def test_planted_deviation_at_the_tolerance_is_detected_with_the_promised_power(tolerance):
    """Draw from an alternative exactly ``tolerance`` away in TV, at the planned sample size:
    the check (sequential or fixed) rejects in at least 99% of trials."""
    rng = np.random.default_rng(int(tolerance * 1000))
    cells = 20
    null = np.full(cells, 1 / cells)
    alternative = null + np.where(np.arange(cells) % 2 == 0, 1, -1) * (2 * tolerance / cells)
    assert 0.5 * np.abs(alternative - null).sum() == pytest.approx(tolerance)
    rejections, trials = 0, 300
    for _ in range(trials):
        check = DistributionCheck(
            "power", null[None, :], alpha=1e-6, tolerance=tolerance, min_draws=10, max_draws=10**7
        )
        while not check.done:
            batch = check.next_batch(10**6)
            check.add(rng.multinomial(batch, alternative)[None, :], batch)
        rejections += not check.result().passed
    assert rate_at_least(rejections, trials, 0.99), f"detected {rejections}/{trials}"


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
