"""The goodness-of-fit engine: pooling rules, degenerate cases, calibration and power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from spectest.statistics.chisquare import (
    MIN_EXPECTED,
    FitResult,
    Group,
    chisquare_groups,
    impossible_cells,
    min_detectable_tv,
    pool_cells,
)


@given(st.lists(st.floats(0, 50), min_size=1, max_size=300), st.randoms(use_true_random=False))
def test_pooled_bins_meet_the_minimum_expected_count(expected, rnd):
    expected = np.array(expected)
    order = np.arange(expected.size)
    rnd.shuffle(order)
    bins = pool_cells(expected, order)
    assert (bins[expected == 0] == -1).all()
    used = bins[bins >= 0]
    if used.size == 0:
        return
    sums = np.bincount(used, weights=expected[bins >= 0])
    assert set(np.unique(used)) == set(range(sums.size)), "bin ids are contiguous"
    if expected.sum() >= MIN_EXPECTED:
        assert (sums >= MIN_EXPECTED - 1e-9).all(), sums
    else:
        assert sums.size == 1
    # Contiguity along the order: bin ids never decrease as the walk goes on.
    walked = bins[order][bins[order] >= 0]
    assert (np.diff(walked) >= 0).all()


def test_pooling_never_looks_at_observed_counts():
    probs = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
    a = chisquare_groups("x", [Group(np.array([500, 300, 150, 40, 10]), probs)], alpha=0.01)
    b = chisquare_groups("x", [Group(np.array([10, 40, 150, 300, 500]), probs)], alpha=0.01)
    assert a.df == b.df


def test_degenerate_distribution_is_a_pass_without_nan():
    result = chisquare_groups("one token", [Group(np.array([0, 1000, 0]), np.array([0.0, 1.0, 0.0]))], alpha=1e-6)
    assert result.passed and result.df == 0 and result.p_value == 1.0
    assert not np.isnan(result.statistic)


def test_impossible_cells_are_found_exactly():
    assert impossible_cells(np.array([3, 0, 1]), np.array([0.5, 0.5, 0.0])).tolist() == [2]


def test_gross_deviation_fails_with_a_useful_summary():
    probs = np.full(10, 0.1)
    counts = np.array([300] + [78] * 9)
    result = chisquare_groups("uniform", [Group(counts, probs)], alpha=1e-6)
    assert not result.passed
    text = result.summary()
    assert "token 0: expected 100.2, observed 300" in text


def test_null_p_values_are_uniform():
    """Under the null the summed, pooled Pearson test is calibrated (KS test over seeds)."""
    rng = np.random.default_rng(7)
    p_values = []
    for _ in range(400):
        groups = []
        for _ in range(20):
            probs = rng.dirichlet(np.full(30, 0.5))
            groups.append(Group(rng.multinomial(200, probs), probs))
        p_values.append(chisquare_groups("null", groups, alpha=0.01).p_value)
    assert stats.kstest(p_values, "uniform").pvalue > 1e-4


@pytest.mark.parametrize("n,df", [(1000, 5), (20000, 500), (60000, 2000)])
def test_min_detectable_tv_is_detected_with_the_promised_power(n, df):
    """Plant the worst-case deviation at the reported TV: the test rejects with power >= 0.99."""
    alpha = 1e-4
    tv = min_detectable_tv(n, df, alpha)
    cells = df + 1
    base = np.full(cells, 1.0 / cells)
    shift = np.where(np.arange(cells) < cells // 2, 1.0, -1.0)
    shift -= shift.mean()
    alternative = base + shift / np.abs(shift).sum() * 2 * tv
    assert abs(0.5 * np.abs(alternative - base).sum() - tv) < 1e-9
    noncentrality = n * ((alternative - base) ** 2 / base).sum()
    power = stats.ncx2.sf(stats.chi2.isf(alpha, df), df, noncentrality)
    assert power >= 0.99
    # And by simulation, at a modest size where it is cheap.
    if n <= 20000:
        rng = np.random.default_rng(1)
        rejections = sum(
            not chisquare_groups("power", [Group(rng.multinomial(n, alternative), base)], alpha=alpha).passed
            for _ in range(200)
        )
        assert rejections >= 190  # binomial(200, 0.99) falls below 190 with probability < 1e-4


def test_required_noncentrality_meets_its_power_by_inversion_and_by_search(monkeypatch):
    """The noncentrality a plan rests on, from scipy's inversion and from the root search it falls back to (forced
    here): equal within 1e-9, and the test at it has at least the stated power, never just under it."""
    from scipy import special

    from spectest.statistics import chisquare

    grid = [
        (df, alpha, power) for df in (1, 7, 150, 4000, 90000) for alpha in (0.05, 1e-6, 1e-13) for power in (0.8, 0.99)
    ]
    direct = [chisquare.required_noncentrality.__wrapped__(*point) for point in grid]
    monkeypatch.setattr(special, "chndtrinc", lambda *args: math.nan)
    searched = [chisquare.required_noncentrality.__wrapped__(*point) for point in grid]
    for (df, alpha, power), one, other in zip(grid, direct, searched, strict=True):
        assert one == pytest.approx(other, rel=1e-9), (df, alpha, power)
        critical = stats.chi2.isf(alpha, df)
        for noncentrality in (one, other):
            assert stats.ncx2.sf(critical, df, noncentrality) >= power, (df, alpha, power, noncentrality)


@settings(max_examples=30)
@given(st.integers(10, 10**6), st.integers(1, 5000))
def test_min_detectable_tv_shrinks_with_more_samples(n, df):
    assert min_detectable_tv(4 * n, df, 1e-5) <= min_detectable_tv(n, df, 1e-5) + 1e-12


def test_a_check_too_sparse_to_pool_falls_back_to_monte_carlo_where_its_level_is_reachable():
    """Eight draws over three cells leave no pooled degree of freedom: at alpha = 0.01 a Monte
    Carlo test judges them (all eight on a 1% cell is rejected, a typical sample is not); at
    1e-7 no affordable resampling reaches the level, and the check says it is too sparse."""
    probs = np.array([0.49, 0.5, 0.01])
    wrong = chisquare_groups("sparse", [Group(np.array([0, 0, 8]), probs)], alpha=0.01, seed=1)
    assert wrong.method == "monte-carlo" and not wrong.passed
    right = chisquare_groups("sparse", [Group(np.array([4, 4, 0]), probs)], alpha=0.01, seed=1)
    assert right.method == "monte-carlo" and right.passed
    tiny = chisquare_groups("sparse", [Group(np.array([0, 0, 8]), probs)], alpha=1e-7, seed=1)
    assert tiny.method == "too sparse for this level" and tiny.passed and tiny.min_detectable_tv == 1.0


def test_a_sequential_rejection_states_e_values_past_the_float_range():
    """A gross bug's e-value passes e^709 within a few hundred draws: the message gives its size and
    the anytime-valid p-value, not 1e304 (the largest float) and p <= 0."""
    fit = FitResult(
        check="bonus",
        statistic=0.0,
        df=1,
        p_value=0.0,
        alpha=1.25e-6,
        n=181,
        observed_tv=0.5,
        min_detectable_tv=0.05,
        method="sequential",
        log_e_value=2000.0,
        e_alpha=1.25e-6,
        stopped_early=True,
        planned_draws=181,
        draws=181,
    )
    head = fit.summary().splitlines()[0]
    assert "e-value 3.88e+868 >= 1/alpha = 8e+05" in head and "anytime-valid p <= 2.58e-869" in head, head
    assert not fit.passed


def probs_and_drawn(rng: np.random.Generator, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Six groups of 40 cells, the first three of probability zero, and what is drawn instead: the same, or with
    ``shift`` more mass on cell 3 (renormalised)."""
    probs = rng.dirichlet(np.full(40, 0.5), size=6)
    probs[:, :3] = 0.0
    probs /= probs.sum(axis=1, keepdims=True)
    drawn = probs.copy()
    drawn[:, 3] += shift
    drawn /= drawn.sum(axis=1, keepdims=True)
    return probs, drawn


@pytest.mark.parametrize("shift", [0.0, 0.08])
def test_counts_kept_on_their_device_give_the_same_verdict_as_numpy_counts(shift):
    """A check fed torch tensors (as on a GPU, where the counts stay on the device and only bin totals cross) draws
    the same verdict, p-value, e-value and impossible cell as the same counts fed as numpy arrays. Run here on CPU
    tensors: the code path is the device's."""
    import torch

    from spectest.statistics.checks import DistributionCheck

    rng = np.random.default_rng(3)
    probs, drawn = probs_and_drawn(rng, shift)
    checks = [DistributionCheck("x", probs, alpha=1e-4, tolerance=0.1, min_draws=20, max_draws=5000) for _ in range(2)]
    batches = []
    while not checks[0].done:
        n = checks[0].next_batch(400)
        counts = np.stack([rng.multinomial(n, row) for row in drawn])
        batches.append((counts, n))
        checks[0].add(counts, n)
        checks[1].add(torch.from_numpy(counts.copy()), n)
        assert checks[0].done == checks[1].done and checks[0].log_e == pytest.approx(checks[1].log_e, rel=1e-12)
    assert checks[1].done and np.array_equal(checks[0].counts, checks[1].counts)
    first, second = checks[0].result(), checks[1].result()
    assert (first.passed, first.p_value, first.statistic) == (second.passed, second.p_value, second.statistic)
    assert first.passed == (shift == 0.0)
    planted = batches[0][0].copy()
    planted[2, 1] = 5  # a count in a cell of probability zero
    for check, counts in ((checks[0], planted), (checks[1], torch.from_numpy(planted))):
        check.add(counts, 1)
        assert check.impossible() == (2, 1, 5)
    with pytest.raises(TypeError, match="every batch"):
        checks[1].add(planted, 1)


@pytest.mark.parametrize("shift", [0.0, 0.08])
def test_cells_one_by_one_give_the_same_verdict_as_count_tables(shift):
    """A check fed each token's flat cell (``add_cells``, what a CPU run hands it: a call at V = 256000 emits a few
    dozen tokens into a million cells) draws the same verdict, p-value, e-value, counts and impossible cell as the
    same draws fed as count tables, whether the cells come as numpy or as a torch tensor."""
    import torch

    from spectest.statistics.checks import DistributionCheck

    rng = np.random.default_rng(5)
    probs, drawn = probs_and_drawn(rng, shift)
    checks = [DistributionCheck("x", probs, alpha=1e-4, tolerance=0.1, min_draws=20, max_draws=5000) for _ in range(3)]
    while not checks[0].done:
        n = checks[0].next_batch(400)
        counts = np.stack([rng.multinomial(n, row) for row in drawn])
        cells = np.repeat(np.arange(counts.size), counts.ravel())
        rng.shuffle(cells)
        checks[0].add(counts, n)
        checks[1].add_cells(cells, n)
        checks[2].add_cells(torch.from_numpy(cells.copy()), n)
        for check in checks[1:]:
            assert check.done == checks[0].done and check.log_e == pytest.approx(checks[0].log_e, rel=1e-12)
            assert check.impossible() is None
    fits = [check.result() for check in checks]
    for check, fit in zip(checks[1:], fits[1:], strict=True):
        assert np.array_equal(check.counts, checks[0].counts)
        assert (fit.passed, fit.p_value, fit.statistic) == (fits[0].passed, fits[0].p_value, fits[0].statistic)
    assert fits[0].passed == (shift == 0.0)
    for check in checks[1:]:
        check.add_cells(np.array([2 * 40 + 1] * 5 + [2 * 40 + 7]), 1)  # five tokens in a cell of probability zero
        assert check.impossible() == (2, 1, 5)
    with pytest.raises(ValueError, match="outside"):
        checks[1].add_cells(np.array([probs.size]), 1)
