"""Goodness-of-fit verdicts against exactly known probabilities.

Cells are pooled by their *expected* counts only (never the observed ones), in an order fixed
before sampling, so the pooled Pearson statistic is a valid chi-square test. Tests of many
independent groups (one per row and position) add their statistics and degrees of freedom.

Power: for pooled cell probabilities p0 and an alternative p1 at total variation distance
delta, Cauchy-Schwarz gives sum (p1 - p0)^2 / p0 >= (sum |p1 - p0|)^2 = 4 delta^2, so the
noncentrality is at least 4 n delta^2. :func:`min_detectable_tv` inverts the noncentral
chi-square power at that worst case: any deviation of at least that TV between pooled cells
is detected with the stated power.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

DEFAULT_POWER = 0.99
MIN_EXPECTED = 10.0  # per pooled cell: keeps Pearson's tail close to chi-square at small alpha


@dataclass
class FitResult:
    """One distribution check: the numbers a failure message and a report need."""

    check: str
    statistic: float
    df: int
    p_value: float
    alpha: float
    n: int
    observed_tv: float
    min_detectable_tv: float
    worst_cells: list[tuple[str, float, int]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.p_value >= self.alpha

    def summary(self) -> str:
        lines = [
            f"{self.check}: chi2={self.statistic:.1f} on df={self.df}, p={self.p_value:.3g} "
            f"(alpha={self.alpha:.2g}), n={self.n}",
            f"  observed TV distance {self.observed_tv:.4f} (binned; 0 expected up to sampling noise), "
            f"minimum detectable TV at power {DEFAULT_POWER}: {self.min_detectable_tv:.4f}",
        ]
        if self.worst_cells:
            lines.append("  worst cells (cell: expected count vs observed):")
            lines += [f"    {label}: expected {exp:.1f}, observed {obs}" for label, exp, obs in self.worst_cells]
        return "\n".join(lines)

    def as_record(self) -> dict[str, object]:
        return {
            "check": self.check,
            "statistic": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "alpha": self.alpha,
            "n": self.n,
            "observed_tv": self.observed_tv,
            "min_detectable_tv": self.min_detectable_tv,
            "passed": self.passed,
        }


def pool_cells(expected: np.ndarray, order: np.ndarray, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """Bin id per cell: walk cells in ``order``, closing a bin once its expected count reaches
    ``min_expected``; a short last bin joins the one before. Cells of zero expectation get -1."""
    bins = np.full(expected.shape[0], -1, dtype=np.int64)
    order = order[expected[order] > 0]
    if order.size == 0:
        return bins
    ordered = expected[order]
    # Provisional bins by the running total before each cell (vectorised over cells), then an
    # exact greedy merge over those few bins (at most total / min_expected + 1 of them).
    before = np.concatenate(([0.0], np.cumsum(ordered)[:-1]))
    _, provisional = np.unique(np.floor(before / min_expected), return_inverse=True)
    sums = np.bincount(provisional, weights=ordered)
    merged = np.empty(sums.size, dtype=np.int64)
    current, running = 0, 0.0
    for j, total in enumerate(sums):
        merged[j] = current
        running += total
        if running >= min_expected:
            current, running = current + 1, 0.0
    if 0 < running < min_expected and current > 0:  # a short last bin joins the one before
        merged[merged == current] = current - 1
    bins[order] = merged[provisional]
    return bins


@dataclass
class Group:
    """Observed counts and exact probabilities of one group of cells (one row/position)."""

    counts: np.ndarray
    probs: np.ndarray
    label: str = ""
    order: np.ndarray | None = None  # pooling order; default: ascending expected probability
    cell_name: Callable[[int], str] | None = None  # names a cell in messages; default "token i"

    def describe_bin(self, bins: np.ndarray, bin_id: int) -> str:
        members = np.flatnonzero(bins == bin_id)
        names = [self.cell_name(int(i)) if self.cell_name else f"token {i}" for i in members[:3]]
        more = f" +{members.size - 3} more" if members.size > 3 else ""
        return f"{self.label}{', '.join(names)}{more}"


def _pooled(group: Group) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = int(group.counts.sum())
    expected = group.probs * n
    order = group.order if group.order is not None else np.argsort(group.probs, kind="stable")
    bins = pool_cells(expected, order)
    n_bins = int(bins.max()) + 1
    inside = bins >= 0
    obs = np.bincount(bins[inside], weights=group.counts[inside], minlength=n_bins)
    exp = np.bincount(bins[inside], weights=expected[inside], minlength=n_bins)
    return obs, exp, bins


def impossible_cells(counts: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Indices of cells observed although their exact probability is zero."""
    return np.flatnonzero((probs <= 0) & (counts > 0))


def chisquare_groups(check: str, groups: list[Group], *, alpha: float, worst: int = 5) -> FitResult:
    """Pearson chi-square over independent groups: statistics and degrees of freedom add.

    Groups too small to form two pooled cells add nothing. With no degrees of freedom at all
    (every group degenerate) the verdict is a pass with p = 1: there is nothing to test.
    """
    statistic, df, n, tv_weighted = 0.0, 0, 0, 0.0
    cells: list[tuple[float, str, float, int]] = []
    for group in groups:
        obs, exp, bins = _pooled(group)
        group_n = int(group.counts.sum())
        if obs.size < 2 or group_n == 0:
            continue
        contributions = (obs - exp) ** 2 / exp
        statistic += float(contributions.sum())
        df += obs.size - 1
        n += group_n
        tv_weighted += 0.5 * float(np.abs(obs - exp).sum())
        top = np.argsort(contributions)[-worst:]
        cells += [(float(contributions[i]), group.describe_bin(bins, int(i)), float(exp[i]), int(obs[i])) for i in top]
    if df == 0:
        return FitResult(check, 0.0, 0, 1.0, alpha, n, 0.0, 1.0)
    p_value = float(stats.chi2.sf(statistic, df))
    cells.sort(key=lambda c: c[0], reverse=True)
    return FitResult(
        check=check,
        statistic=statistic,
        df=df,
        p_value=p_value,
        alpha=alpha,
        n=n,
        observed_tv=tv_weighted / n,
        min_detectable_tv=min_detectable_tv(n, df, alpha),
        worst_cells=[(label, exp, obs) for _, label, exp, obs in cells[:worst]],
    )


def min_detectable_tv(n: int, df: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """Smallest TV distance (between pooled cells, in every group) detected with ``power``."""
    if n <= 0 or df <= 0:
        return 1.0
    critical = stats.chi2.isf(alpha, df)

    def shortfall(noncentrality: float) -> float:
        return float(stats.ncx2.sf(critical, df, noncentrality)) - power

    upper = max(1.0, critical)
    while shortfall(upper) < 0:
        upper *= 2
    # Round up so the stated power is met, not missed by the root-finder's tolerance.
    noncentrality = optimize.brentq(shortfall, 1e-9, upper, xtol=1e-9) * (1 + 1e-6)
    return min(1.0, float(np.sqrt(noncentrality / (4 * n))))
