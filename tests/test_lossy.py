"""Relaxed acceptance and measured TV: the lossy references against their exact model
(simulators/lossy.py, written apart in numpy), and the calibration of the TV interval
(spectest.statistics.tv) against the exact TV those models give."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from spectest.simulators.lossy import lossy_chain, relaxed_accepted, typical_accepted

from spectest.cases.toy_models import distribution_pairs
from spectest.implementations.lossy import RelaxedTopK, TypicalAcceptance
from spectest.protocol import build_model
from spectest.statistics.checks import DistributionCheck
from spectest.statistics.chisquare import Group, chisquare_groups
from spectest.statistics.tv import view_bounds

LEVEL = 1e-6
RULES = {
    "typical": (TypicalAcceptance(), lambda p: typical_accepted(p, 0.09, 0.3), "argmax", "sample"),
    "typical-sampled": (
        TypicalAcceptance(posterior_threshold=0.2, posterior_alpha=0.5, fallback="sample"),
        lambda p: typical_accepted(p, 0.2, 0.5),
        "sample",
        "sample",
    ),
    "relaxed": (
        RelaxedTopK(relaxed_topk=3, relaxed_delta=0.3),
        lambda p: relaxed_accepted(p, 3, 0.3),
        "argmax",
        "argmax",
    ),
    "relaxed-greedy": (RelaxedTopK(), lambda p: relaxed_accepted(p, 1, 0.0), "argmax", "argmax"),
}


def batch(seed: int, b: int, k: int, v: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    pairs = [distribution_pairs(rng, k + 1, v, "dirichlet", kind) for kind in ("close", "far", "equal")]
    target = np.stack([pairs[r % 3][0] for r in range(b)])
    draft = np.stack([pairs[r % 3][1][:k] for r in range(b)])
    return target, draft


def run(model, target: np.ndarray, draft: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """[reps, B, K + 1] emitted tokens of ``reps`` calls on fresh drafts."""
    b, k, v = draft.shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.tensor(draft).repeat(reps, 1, 1)
    drafts = torch.multinomial(q.reshape(-1, v), 1, generator=gen).view(reps * b, k)
    out = model.verify(drafts, q, torch.tensor(target).repeat(reps, 1, 1), generator=gen)
    return out.numpy().reshape(reps, b, k + 1)


def position_counts(out: np.ndarray, v: int) -> np.ndarray:
    """[B * (K + 1), V] counts of the token emitted at each reached (row, position)."""
    _, b, k1 = out.shape
    cells = (np.arange(b)[None, :, None] * k1 + np.arange(k1)[None, None, :]) * v + out
    return np.bincount(cells[out >= 0], minlength=b * k1 * v).reshape(b * k1, v)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_reference_follows_its_exact_model(rule):
    """Every reached position's token and the tokens per call, against the numpy model."""
    model, accepted, fallback, bonus = RULES[rule]
    target, draft = batch(7, 6, 3, 5)
    exact = lossy_chain(target, draft, accepted(target[:, :3]), fallback=fallback, bonus=bonus)
    out = run(model, target, draft, 40_000, seed=1)
    counts = position_counts(out, 5)
    groups = [Group(c, p) for c, p in zip(counts, exact.outputs.reshape(-1, 5), strict=True) if c.sum()]
    fit = chisquare_groups(f"{rule} per position", groups, alpha=LEVEL)
    assert fit.p_value > LEVEL, fit.summary()
    impossible = (exact.outputs.reshape(-1, 5) == 0) & (counts > 0)
    assert not impossible.any(), "a token the exact model rules out came out"
    lengths = (out >= 0).sum(-1)  # [reps, B]
    for r in range(6):
        observed = np.bincount(lengths[:, r] - 1, minlength=4)
        fit = chisquare_groups("tokens per call", [Group(observed, exact.tokens.probs[r])], alpha=LEVEL)
        assert fit.p_value > LEVEL / 6, fit.summary()


def test_lossy_rules_never_accept_a_zero_probability_draft():
    p = np.array([[0.5, 0.5, 0.0, 0.0]])
    assert not relaxed_accepted(p, 4, 1.0)[0, 2:].any()
    assert not typical_accepted(p, 0.09, 0.3)[0, 2:].any()
    target = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25] * 4]], dtype=torch.float64)
    for model in (RelaxedTopK(relaxed_topk=4, relaxed_delta=1.0), TypicalAcceptance()):
        out = model.verify(torch.tensor([[2]]), torch.full((1, 1, 4), 0.25), target, generator=torch.Generator())
        assert out[0, 0] != 2 and out[0, 1] == -1


def test_knobs_are_validated_and_models_declare_lossy():
    with pytest.raises(ValueError, match="fallback"):
        TypicalAcceptance(fallback="nearest")
    with pytest.raises(ValueError, match="relaxed_topk"):
        RelaxedTopK(relaxed_topk=0)
    model = TypicalAcceptance()
    assert build_model("t", "t", model, model.verify).max_tv == 1.0
    model.spectest_max_tv = 0.2
    assert build_model("t", "t", model, model.verify).max_tv == 0.2
    model.spectest_max_tv = 2
    with pytest.raises(ValueError, match="spectest_max_tv"):
        build_model("t", "t", model, model.verify)


CALIBRATION_RUNS = 20
CALIBRATION_ALPHA = 0.01
MAX_MISSES = 4  # P(>= 4 misses in 20 runs | miss rate <= 0.01) = 4.3e-5


@pytest.mark.parametrize("rule", ["typical", "relaxed"])
def test_tv_interval_covers_the_exact_tv(rule):
    """The calibration: over independent runs, every reached (row, position)'s simultaneous
    interval (bins planned by the check, as in a property) must cover that position's exact TV.
    Each run misses with probability <= alpha = 0.01, so 4 or more misses in 20 runs has
    probability <= 5e-5 for a correct interval; and the interval must be informative: it
    excludes 0 where the exact TV is large, and its mean width stays below 0.25."""
    model, accepted, fallback, bonus = RULES[rule]
    target, draft = batch(11, 4, 2, 4)
    exact = lossy_chain(target, draft, accepted(target[:, :2]), fallback=fallback, bonus=bonus)
    true_tv = exact.tv(target).ravel()
    misses, detected, widths = 0, [], []
    for run_index in range(CALIBRATION_RUNS):
        check = DistributionCheck(
            "calibration",
            target.reshape(-1, 4),
            alpha=CALIBRATION_ALPHA,
            tolerance=0.05,
            min_draws=100,
            max_draws=3000,
            reach=exact.reach.ravel(),
            measured=(1.0, 1),
        )
        out = run(model, target, draft, check.planned, seed=100 + run_index)
        check.add(position_counts(out, 4), check.planned)
        indices = [view.bin_index for view in check.views]
        share = CALIBRATION_ALPHA / len(indices)
        bounds = [view_bounds(check.counts, check.probs, index, share) for index in indices]
        lower = np.max([b[0] for b in bounds], axis=0)
        upper = np.min([b[1] for b in bounds], axis=0)
        reached = check.counts.sum(axis=1) > 0
        covered = (lower <= true_tv + 1e-12) & (true_tv <= upper + 1e-12)
        misses += int(not covered[reached].all())
        detected.append(bool((lower[true_tv > 0.3] > 0).all()))
        widths.append(float((upper - lower)[reached].mean()))
    assert misses < MAX_MISSES, (
        f"the interval missed the exact TV in {misses} of {CALIBRATION_RUNS} runs at alpha {CALIBRATION_ALPHA} "
        f"(probability {stats.binom.sf(misses - 1, CALIBRATION_RUNS, CALIBRATION_ALPHA):.2g} for a valid interval)"
    )
    assert all(detected), "a position with exact TV above 0.3 had an interval reaching down to 0"
    assert np.mean(widths) < 0.25, f"intervals are uninformative: mean width {np.mean(widths):.3f}"


def test_exact_samples_never_exceed_a_zero_limit_and_loss_is_detected():
    """Lossy mode's verdict: an exact sampler passes limit 0 (its lower end stays at 0), and
    a shifted one fails it with the worst group named."""
    rng = np.random.default_rng(5)
    t = rng.dirichlet(np.ones(6), size=3)
    shifted = t.copy()
    shifted[1] = 0.6 * t[1] + 0.4 * np.eye(6)[0]
    for truth, should_pass in ((t, True), (shifted, False)):
        check = DistributionCheck("x", t, alpha=1e-6, tolerance=0.05, min_draws=10, max_draws=8000, measured=(0.0, 1))
        counts = np.stack([rng.multinomial(check.planned, row) for row in truth])
        check.add(counts, check.planned)
        result = check.result()
        assert result.measured is not None and result.passed == should_pass, result.summary()
        if not should_pass:
            assert result.measured.worst_interval[0] > 0 and "lower end above the limit" in result.summary()
