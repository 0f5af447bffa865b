"""Measured loss: how far a lossy implementation's output is from the target, with a
simultaneous confidence interval on the total variation (TV) distance of every group.

Why not the plug-in. The plug-in estimate TV(p_hat, t) = 1/2 sum |p_hat_c - t_c| is biased
upward at finite n: E|p_hat_c - t_c| >= |p_c - t_c| cell by cell (Jensen), and for an exact
implementation (p = t) its mean is about 1/2 sum_c sqrt(2 t_c (1 - t_c) / (pi n)), which is
0.2 for 100 equally likely cells at n = 1000 although the true TV is 0. The interval here does
not start from the plug-in; it bounds each bin's probability and derives the TV bounds from that.

The interval. Cells are pooled into bins fixed before sampling (the check's views: their
bins were planned from the exact probabilities). Every bin of every group gets a two-sided
Clopper-Pearson interval [lo_B, hi_B] at a Bonferroni share of ``alpha``, so all hold together
with probability >= 1 - alpha. On that event, for each group:

* lower: 1/2 sum_B dist(t_B, [lo_B, hi_B]) <= binned TV <= TV (pooling never increases TV);
* upper: 1/2 sum_B u_B >= TV, with u_B = max(|lo_B - t_B|, |hi_B - t_B|) for a bin of one cell
  and u_B = hi_B + t_B for a bin of several (sum over its cells |p_c - t_c| <= p_B + t_B), plus
  the upper bound on the mass the implementation puts on cells of target probability 0.

Views (orderings of the same cells) each give valid bounds; the check intersects them, each
view at its share of the level. The interval of the worst group, [max_g lo_g, max_g hi_g],
holds on the same event, as does the n-weighted mean over groups.

Verdict. A check fails only when the worst group's lower end exceeds the declared limit:
a model whose TV stays within the limit everywhere fails with probability <= alpha. Power:
on the same event, a group whose TV exceeds the limit by more than that group's interval width
makes the check fail (its lower end is at least TV minus the width).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass
class MeasuredTV:
    """A measured check's figures: intervals at simultaneous level 1 - alpha, and the verdict."""

    limit: float  # declared maximum TV for this check (max per token times tokens per cell)
    alpha: float
    mean_estimate: float  # n-weighted plug-in over the groups (biased upward, see the module)
    mean_interval: tuple[float, float]
    worst_interval: tuple[float, float]  # [max_g lo_g, max_g hi_g]
    worst_group: str  # label of the group whose lower end is highest
    worst_width: float  # hi - lo of that group: an excess above the limit larger than this is caught
    groups: int
    tokens: int = 1  # emitted tokens per cell (L for an L-token joint)

    @property
    def passed(self) -> bool:
        return self.worst_interval[0] <= self.limit

    def summary(self) -> str:
        low, high = self.mean_interval
        worst_low, worst_high = self.worst_interval
        per = f" ({self.tokens} tokens per cell: {self.limit / self.tokens:g} per token)" if self.tokens > 1 else ""
        return "\n".join(
            [
                f"  measured TV distance to the target (lossy mode, limit {self.limit:g}{per}):",
                f"    mean over {self.groups} groups {self.mean_estimate:.4f} plug-in, "
                f"{1 - self.alpha:.6g} simultaneous interval [{low:.4f}, {high:.4f}]",
                f"    worst group {self.worst_group.strip(': ') or '(one group)'}: [{worst_low:.4f}, {worst_high:.4f}]"
                + (
                    f": lower end above the limit {self.limit:g}"
                    if not self.passed
                    else f" (an excess above the limit wider than {self.worst_width:.4f} fails)"
                ),
            ]
        )

    def as_record(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "tokens": self.tokens,
            "alpha": self.alpha,
            "mean_estimate": self.mean_estimate,
            "mean_interval": list(self.mean_interval),
            "worst_interval": list(self.worst_interval),
            "worst_group": self.worst_group,
            "groups": self.groups,
            "passed": self.passed,
        }


def view_bounds(
    counts: np.ndarray, probs: np.ndarray, bin_index: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower [G], upper [G], plug-in [G]) TV bounds of each group from one view's bins
    (``bin_index`` [G, C]: global bin id, -1 for cells in no bin), all at simultaneous level 1 - alpha."""
    groups = probs.shape[0]
    valid = bin_index >= 0
    n_bins = int(bin_index.max()) + 1 if valid.any() else 0
    group_of_bin = np.zeros(n_bins, dtype=np.int64)
    group_of_bin[bin_index[valid]] = np.nonzero(valid)[0]
    n = counts.sum(axis=1).astype(np.float64)
    mass = probs / np.maximum(probs.sum(axis=1, keepdims=True), 1e-300)
    obs = np.bincount(bin_index[valid], weights=counts[valid], minlength=n_bins)
    target = np.bincount(bin_index[valid], weights=mass[valid], minlength=n_bins)
    members = np.bincount(bin_index[valid], minlength=n_bins)
    # Cells outside every bin (target probability 0): one extra bin per group that has any.
    outside = ~valid & (mass <= 0)
    has_outside = outside.any(axis=1)
    outside_obs = np.where(outside, counts, 0).sum(axis=1)
    intervals = n_bins + int(has_outside.sum())
    level = alpha / (2 * max(1, intervals))
    bin_n = n[group_of_bin]
    lo, hi = clopper_pearson(obs, bin_n, level)
    below = np.clip(lo - target, 0, None) + np.clip(target - hi, 0, None)
    single = np.maximum(np.abs(lo - target), np.abs(hi - target))
    upper_bin = np.where(members > 1, np.minimum(hi + target, 2.0), single)
    plug = np.abs(np.divide(obs, bin_n, out=np.zeros_like(obs), where=bin_n > 0) - target)
    lower = 0.5 * np.bincount(group_of_bin, weights=below, minlength=groups)
    upper = 0.5 * np.bincount(group_of_bin, weights=upper_bin, minlength=groups)
    plug_in = 0.5 * np.bincount(group_of_bin, weights=plug, minlength=groups)
    outside_lo, outside_hi = clopper_pearson(outside_obs.astype(np.float64), n, level)
    outside_share = np.divide(outside_obs, n, out=np.zeros_like(n), where=n > 0)
    lower += np.where(has_outside, 0.5 * outside_lo, 0.0)
    upper += np.where(has_outside, 0.5 * outside_hi, 0.0)
    plug_in += np.where(has_outside, 0.5 * outside_share, 0.0)
    empty = n <= 0
    # A group reached although its plan expected no draws there has no bins: nothing bounds it.
    unplanned = (~valid & (mass > 0)).any(axis=1) & ~empty
    upper = np.where(unplanned, 1.0, upper)
    return np.where(empty, 0.0, lower), np.where(empty, 1.0, np.minimum(upper, 1.0)), np.where(empty, 0.0, plug_in)


def clopper_pearson(successes: np.ndarray, n: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact binomial bounds, each one-sided at ``level`` (scipy's beta quantiles); [0, 1] where n = 0."""
    failures = n - successes
    with np.errstate(invalid="ignore"):
        lo = np.where(successes > 0, stats.beta.ppf(level, np.maximum(successes, 1), failures + 1), 0.0)
        hi = np.where(failures > 0, stats.beta.ppf(1 - level, successes + 1, np.maximum(failures, 1)), 1.0)
    return np.where(n > 0, lo, 0.0), np.where(n > 0, hi, 1.0)


def measure_tv(
    counts: np.ndarray,
    probs: np.ndarray,
    bin_indices: Sequence[np.ndarray],
    *,
    alpha: float,
    limit: float,
    labels: Sequence[str],
    tokens: int = 1,
) -> MeasuredTV:
    """Intersect the bounds of every view (each at alpha / views) into one measured verdict."""
    share = alpha / max(1, len(bin_indices))
    bounds = [view_bounds(counts, probs, index, share) for index in bin_indices]
    lower = np.max([b[0] for b in bounds], axis=0)
    upper = np.maximum(lower, np.min([b[1] for b in bounds], axis=0))
    plug_in = bounds[0][2]
    n = counts.sum(axis=1).astype(np.float64)
    weights = n / n.sum() if n.sum() > 0 else np.full(n.size, 1 / max(1, n.size))
    worst = int(np.argmax(lower))
    return MeasuredTV(
        limit=limit,
        alpha=alpha,
        mean_estimate=float(plug_in @ weights),
        mean_interval=(float(lower @ weights), float(upper @ weights)),
        worst_interval=(float(lower.max()), float(upper.max())),
        worst_group=str(labels[worst]) if len(labels) else "",
        worst_width=float(upper[worst] - lower[worst]),
        groups=int((n > 0).sum()),
        tokens=tokens,
    )
