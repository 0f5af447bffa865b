"""The sparse-regime identity test (spectest.statistics.sparse): exact bounds, the regime, and what it sees."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from spectest.statistics.checks import DistributionCheck
from spectest.statistics.sparse import (
    chernoff_log_sf,
    in_sparse_regime,
    repeat_probability,
    sparse_identity_test,
)
from tests.verifiers.buggy_inputs import lumped_distribution


@pytest.mark.parametrize("chance, trials", [(0.01, 1000), (0.2, 60), (1e-4, 50000)])
def test_the_chernoff_bound_is_never_below_the_exact_binomial_tail(chance, trials):
    chances = np.full(trials, chance)
    mean = chance * trials
    for observed in np.unique(np.linspace(mean, trials, 40).astype(int)):
        exact = stats.binom.sf(observed - 1, trials, chance)
        bound = math.exp(chernoff_log_sf(observed, chances))
        assert bound >= exact * (1 - 1e-9), (observed, bound, exact)
    assert chernoff_log_sf(mean - 1, chances) == 0.0  # at or below the mean: the trivial bound


def test_repeat_probability_matches_the_binomial_where_the_formula_would_cancel():
    n = np.array([10.0, 1000.0, 5000.0, 3.0])
    p = np.array([1e-9, 2e-7, 1e-3, 0.4])
    assert np.allclose(repeat_probability(p, n), stats.binom.sf(1, n.astype(int), p), rtol=1e-6, atol=0)


def test_the_regime_is_sparse_only_where_many_tokens_are_expected_below_once():
    flat = np.full((1, 32000), 1 / 32000)
    assert in_sparse_regime(flat, np.array([2000.0]))
    small = np.full((1, 50), 1 / 50)
    assert not in_sparse_regime(small, np.array([2000.0]))
    assert not in_sparse_regime(flat, np.array([1.0]))  # one draw cannot repeat anything


def _counts(rng, rows, draws):
    return np.stack([rng.multinomial(draws, row) for row in rows])


def test_a_correct_sampler_passes_and_a_lumped_one_fails_at_32000_tokens():
    rng = np.random.default_rng(0)
    logits = 2.0 * rng.standard_normal((2, 32000))
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    strata = np.zeros(2, dtype=int)
    exact = sparse_identity_test(_counts(rng, p, 1500), p, strata, alpha=1e-6)
    assert exact is not None and exact.p_value > 1e-3
    lumped = lumped_distribution(p, torch.bfloat16)
    caught = sparse_identity_test(_counts(rng, lumped, 1500), p, strata, alpha=1e-6)
    assert caught.p_value < 1e-10, caught.describe()
    assert caught.worst and caught.worst[0][2] >= 2  # names a token that came out too often
    assert 0 < exact.min_detectable_tv < 1


def test_null_p_values_stay_within_their_level():
    """Simulated from p itself: at level 0.05 the exact bound rejects at most 5% (it is conservative)."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(20000), size=2)
    values = [
        sparse_identity_test(_counts(rng, p, 400), p, np.zeros(2, dtype=int), alpha=0.05).p_value for _ in range(60)
    ]
    assert np.mean(np.array(values) <= 0.05) <= 0.05


def test_a_distribution_check_adds_the_sparse_test_only_in_its_regime_and_names_it_when_it_decides():
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.ones(32000), size=1)
    check = DistributionCheck(
        "lumped", p, alpha=1e-4, tolerance=0.05, min_draws=100, max_draws=2000, strata=np.zeros(1, dtype=int)
    )
    assert check.sparse  # most of 32000 tokens expected below once at 2000 draws
    lumped = lumped_distribution(p, torch.float16)
    check.add(rng.multinomial(check.planned, lumped[0])[None, :], check.planned)
    fit = check.result()
    assert not fit.passed and fit.rule == "lumped"
    assert fit.sparse is not None and fit.sparse_decided and "every token its own cell" in fit.summary()
    small = DistributionCheck(
        "small", np.full((1, 20), 0.05), alpha=1e-4, tolerance=0.05, min_draws=10, max_draws=10**5, strata=np.zeros(1)
    )
    assert not small.sparse
