"""Fixed-sample goodness-of-fit verdicts against exactly known probabilities.

Cells are pooled by their *expected* counts only (never the observed ones), in an order fixed
before sampling, so the pooled statistics are valid chi-square tests. Independent groups (one
per row and position) add their statistics and degrees of freedom: one call of
``scipy.stats.power_divergence`` over the concatenated bins with ``ddof = groups - 1`` gives
exactly that, for Pearson's statistic (the verdict) and the G statistic (reported beside it).
A check too sparse for any pooled degree of freedom falls back to a Monte Carlo test
(``scipy.stats.monte_carlo_test``) where the level is within reach of its resamples; below
that it reports the check as too sparse (minimum detectable TV 1: only the exact rules and the
e-process speak for it).

Power: for pooled cell probabilities p0 and an alternative p1 at total variation distance
delta, Cauchy-Schwarz gives sum (p1 - p0)^2 / p0 >= (sum |p1 - p0|)^2 = 4 delta^2, so the
noncentrality is at least 4 n delta^2. :func:`min_detectable_tv` inverts the noncentral
chi-square power at that worst case: any deviation of at least that TV between pooled cells
(in every group) is detected with the stated power.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize, special, stats

from spectest.statistics.tv import MeasuredTV

if TYPE_CHECKING:
    from spectest.statistics.sparse import SparseResult

DEFAULT_POWER = 0.99
MIN_EXPECTED = 10.0  # per pooled cell: keeps Pearson's tail close to chi-square at small alpha
CI_LEVEL = 0.95  # simultaneous level of the TV interval in failure messages
MAX_MONTE_CARLO = 200_000  # resamples; p-values below 1/(this + 1) cannot be resolved
MONTE_CARLO_CELLS = 32  # cells of a sparse check are pooled (by expectation) to at most this many


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
    # The running total never decreases, so a cell opens a provisional bin where its multiple of min_expected
    # changes (what np.unique's inverse would rank, without sorting).
    level = np.floor(before / min_expected)
    provisional = np.concatenate(([0], np.cumsum(level[1:] != level[:-1])))
    sums = np.bincount(provisional, weights=ordered)
    merged = np.empty(sums.size, dtype=np.int64)
    current, running = 0, 0.0
    for j, total in enumerate(sums.tolist()):
        merged[j] = current
        running += total
        if running >= min_expected:
            current, running = current + 1, 0.0
    if 0 < running < min_expected and current > 0:  # a short last bin joins the one before
        merged[merged == current] = current - 1
    bins[order] = merged[provisional]
    return bins


def approx_bins(n: float, positive_cells: int, top_mass: float, min_expected: float = MIN_EXPECTED) -> int:
    """Upper bound on the pooled bins of a group at sample size n: every bin holds at least
    ``min_expected``, and all bins but the one holding the most likely cell (of probability
    ``top_mass``) fill up from the other cells."""
    return max(1, min(positive_cells, 1 + int(n * (1 - top_mass) // min_expected), int(n // min_expected)))


@dataclass
class Group:
    """Observed counts and exact probabilities of one group of cells (one row/position)."""

    counts: np.ndarray
    probs: np.ndarray
    label: str = ""
    order: np.ndarray | None = None  # pooling order; default: ascending expected probability
    cell_name: Callable[[int], str] | None = None  # names a cell in messages; default "token i"

    def pooled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(observed per bin, expected per bin, bin id per cell) at this group's sample size."""
        n = float(self.counts.sum())
        expected = self.probs * n
        order = self.order if self.order is not None else np.argsort(self.probs, kind="stable")
        bins = pool_cells(expected, order)
        inside = bins >= 0
        n_bins = int(bins.max()) + 1
        obs = np.bincount(bins[inside], weights=self.counts[inside], minlength=n_bins)
        exp = np.bincount(bins[inside], weights=expected[inside], minlength=n_bins)
        return obs, exp, bins

    def describe_bin(self, bins: np.ndarray, bin_id: int) -> str:
        members = np.flatnonzero(bins == bin_id)
        names = [self.cell_name(int(i)) if self.cell_name else f"token {i}" for i in members[:3]]
        more = f" +{members.size - 3} more" if members.size > 3 else ""
        return f"{self.label}{', '.join(names)}{more}"


def _power_of_ten(log_value: float) -> str:
    """exp(log_value) for a message, past the float range too (an e-value can reach e^5000)."""
    if abs(log_value) < 600:
        return f"{math.exp(log_value):.3g}"
    exponent = log_value / math.log(10)
    whole = math.floor(exponent)
    return f"{10 ** (exponent - whole):.3g}e{whole:+d}"


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
    method: str = "pearson"  # pearson, monte-carlo, degenerate, sequential
    tv_interval: tuple[float, float] = (0.0, 1.0)
    g_statistic: float = math.nan
    g_p_value: float = math.nan
    worst_cells: list[tuple[str, float, int]] = field(default_factory=list)
    log_e_value: float | None = None  # sequential e-process at the end (natural log)
    e_alpha: float | None = None  # level the e-process was monitored at
    stopped_early: bool = False
    planned_draws: int | None = None
    draws: int | None = None
    tolerance: float | None = None
    time_limited: bool = False  # concluded at the time budget, before the planned draws
    measured: MeasuredTV | None = None  # lossy mode: the TV interval decides, not the exactness test
    rule: str = ""  # the distribution check this verdict belongs to (rules.PER_POSITION, ...); "" when standalone
    sparse: SparseResult | None = None  # the check's every-token-its-own-cell test, when its regime ran one
    sparse_decided: bool = False  # the sparse test, not a pooled view, gave the smallest p-value

    @property
    def passed(self) -> bool:
        if self.measured is not None:
            return self.measured.passed
        return not self.stopped_early and self.p_value >= self.alpha

    def summary(self) -> str:
        if self.stopped_early:
            head = (
                f"{self.check}: sequential test rejected after {self.draws} of {self.planned_draws} planned draws: "
                f"e-value {_power_of_ten(self.log_e_value or 0.0)} >= 1/alpha = {1 / (self.e_alpha or 1):.3g} "
                f"(anytime-valid p <= {_power_of_ten(-(self.log_e_value or 0.0))})"
            )
        elif self.sparse_decided and self.sparse is not None:
            head = (
                f"{self.check}: every token its own cell, {self.sparse.describe()}; p={self.p_value:.3g} "
                f"(alpha={self.alpha:.2g})"
            )
        else:
            head = (
                f"{self.check}: {self.method} chi2={self.statistic:.1f} on df={self.df}, p={self.p_value:.3g} "
                f"(alpha={self.alpha:.2g}), G={self.g_statistic:.1f} (p={self.g_p_value:.3g}), n={self.n}"
            )
        low, high = self.tv_interval
        if self.measured is not None:  # lossy mode: the exactness test above is reported, the interval decides
            lines = [head + " (reported only: lossy mode)", self.measured.summary()]
        else:
            lines = [
                head,
                f"  estimated TV distance to the target {self.observed_tv:.4f} "
                f"({CI_LEVEL:.0%} simultaneous interval [{low:.4f}, {high:.4f}]; binned, n-weighted over groups"
                + ("; a lumping inside a pooled cell moves none of it" if self.sparse_decided else "")
                + ")",
                f"  minimum detectable TV at power {DEFAULT_POWER}: {self.min_detectable_tv:.4f}"
                + (f" (tolerance asked: {self.tolerance:g})" if self.tolerance else ""),
            ]
            if self.sparse is not None:
                lines.append(
                    f"  every token its own cell: an r-to-1 lumping of the sparse tokens is detected from TV "
                    f"{self.sparse.min_detectable_tv:.4f} at power {DEFAULT_POWER}"
                )
        if self.time_limited:
            lines.append(
                f"  time-limited: {self.draws} of {self.planned_draws} planned draws fit in --spec-property-seconds; "
                "the minimum detectable TV above is what they could detect"
            )
        if self.worst_cells:
            lines.append("  worst cells (cell: expected count vs observed):")
            lines += [f"    {label}: expected {exp:.1f}, observed {obs}" for label, exp, obs in self.worst_cells]
        return "\n".join(lines)

    def as_record(self) -> dict[str, object]:
        """Plain JSON-ready values (NaN becomes None)."""
        record = {
            "check": self.check,
            "method": self.method,
            "statistic": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "g_statistic": self.g_statistic,
            "alpha": self.alpha,
            "n": self.n,
            "observed_tv": self.observed_tv,
            "tv_interval": list(self.tv_interval),
            "min_detectable_tv": self.min_detectable_tv,
            "log_e_value": self.log_e_value,
            "stopped_early": self.stopped_early,
            "planned_draws": self.planned_draws,
            "draws": self.draws,
            "tolerance": self.tolerance,
            "time_limited": self.time_limited,
            "passed": self.passed,
            "worst_cells": [list(cell) for cell in self.worst_cells],
            "measured": self.measured.as_record() if self.measured is not None else None,
            "sparse": self.sparse.as_record() if self.sparse is not None else None,
        }
        return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in record.items()}


def impossible_cells(counts: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Indices of cells observed although their exact probability is zero."""
    return np.flatnonzero((probs <= 0) & (counts > 0))


def tv_interval(obs: np.ndarray, exp: np.ndarray, group_n: np.ndarray, group_of_bin: np.ndarray) -> tuple[float, float]:
    """Simultaneous Clopper-Pearson bounds on each bin's probability (Bonferroni over bins),
    turned into bounds on the n-weighted TV distance between binned model output and target."""
    n = group_n[group_of_bin]
    level = (1 - CI_LEVEL) / (2 * obs.size)
    low = np.where(obs > 0, stats.beta.ppf(level, obs, n - obs + 1), 0.0)
    high = np.where(obs < n, stats.beta.ppf(1 - level, obs + 1, n - obs), 1.0)
    target = exp / n
    below = np.clip(low - target, 0, None) + np.clip(target - high, 0, None)
    worst = np.maximum(np.abs(low - target), np.abs(high - target))
    weights = group_n / group_n.sum()
    tv_low = 0.5 * np.bincount(group_of_bin, weights=below, minlength=group_n.size) @ weights
    tv_high = np.minimum(1.0, 0.5 * np.bincount(group_of_bin, weights=worst, minlength=group_n.size)) @ weights
    return float(tv_low), float(tv_high)


def chisquare_groups(check: str, groups: list[Group], *, alpha: float, worst: int = 5, seed: int = 0) -> FitResult:
    """Pearson chi-square (and G) over independent groups, each pooled at its own sample size.

    Groups too small to form two pooled cells add nothing. If no group has a degree of freedom
    but some group has two possible cells and samples, a Monte Carlo test decides; with a
    single possible cell everywhere there is nothing to test and the verdict is a pass.
    """
    obs_parts, exp_parts, owners, sizes, cells = [], [], [], [], []
    for group in groups:
        group_n = int(group.counts.sum())
        if group_n == 0:
            continue
        obs, exp, bins = group.pooled()
        if obs.size < 2:
            continue
        owners.append(np.full(obs.size, len(sizes)))
        obs_parts.append(obs)
        exp_parts.append(exp)
        sizes.append(group_n)
        contributions = (obs - exp) ** 2 / exp
        top = np.argsort(contributions)[-worst:]
        # Named later, only the few that make the message: naming a bin scans its group's cells.
        cells += [(float(contributions[i]), group, bins, int(i), float(exp[i]), int(obs[i])) for i in top]
    if not sizes:
        return _sparse_check(check, groups, alpha=alpha, seed=seed)
    obs, exp = np.concatenate(obs_parts), np.concatenate(exp_parts)
    group_of_bin, group_n = np.concatenate(owners), np.asarray(sizes, dtype=np.float64)
    ddof = len(sizes) - 1
    pearson = stats.power_divergence(obs, exp, ddof=ddof, lambda_="pearson")
    g_test = stats.power_divergence(obs, exp, ddof=ddof, lambda_="log-likelihood")
    df = obs.size - len(sizes)
    n = int(group_n.sum())
    cells.sort(key=lambda c: c[0], reverse=True)
    return FitResult(
        check=check,
        statistic=float(pearson.statistic),
        df=df,
        p_value=float(pearson.pvalue),
        alpha=alpha,
        n=n,
        observed_tv=0.5 * float(np.abs(obs - exp).sum()) / n,
        min_detectable_tv=min_detectable_tv(n, df, alpha),
        tv_interval=tv_interval(obs, exp, group_n, group_of_bin),
        g_statistic=float(g_test.statistic),
        g_p_value=float(g_test.pvalue),
        worst_cells=[(group.describe_bin(bins, i), exp_, obs_) for _, group, bins, i, exp_, obs_ in cells[:worst]],
    )


def _sparse_check(check: str, groups: list[Group], *, alpha: float, seed: int) -> FitResult:
    """Monte Carlo Pearson test on the raw cells of the largest testable group.

    The simulated "sample" is a whole count vector (a multinomial draw), so the cost does not
    grow with the number of observations.
    """
    testable = [g for g in groups if g.counts.sum() > 0 and (g.probs > 0).sum() >= 2]
    n_total = int(sum(g.counts.sum() for g in groups))
    if not testable:
        return FitResult(check, 0.0, 0, 1.0, alpha, n_total, 0.0, 1.0, method="degenerate")
    group = max(testable, key=lambda g: g.counts.sum())
    n = int(group.counts.sum())
    # The most likely cells stay as they are, the rest (by expectation only) become one cell.
    possible = np.flatnonzero(group.probs > 0)
    ranked = possible[np.argsort(-group.probs[possible], kind="stable")]
    bins = np.full(group.probs.size, -1)
    bins[ranked] = np.minimum(np.arange(ranked.size), MONTE_CARLO_CELLS - 1)
    probs = np.bincount(bins[possible], weights=group.probs[possible])
    probs /= probs.sum()
    counts = np.bincount(bins[possible], weights=group.counts[possible], minlength=probs.size)
    rng = np.random.default_rng(seed)

    def pearson(tallies: np.ndarray, axis: int = -1) -> np.ndarray:
        return ((tallies - n * probs) ** 2 / (n * probs)).sum(axis)

    def multinomial_counts(size: tuple[int, ...]) -> np.ndarray:
        return rng.multinomial(n, probs, size=size[:-1])

    if probs.size < 2:
        return FitResult(check, 0.0, 0, 1.0, alpha, n_total, 0.0, 1.0, method="degenerate")
    tv = 0.5 * float(np.abs(counts / n - probs).sum())
    if alpha * (MAX_MONTE_CARLO + 1) < 1:  # no affordable resampling can reach a p-value this small
        return FitResult(check, 0.0, probs.size - 1, 1.0, alpha, n, tv, 1.0, method="too sparse for this level")
    resamples = int(min(MAX_MONTE_CARLO, max(9999, math.ceil(2 / alpha))))
    result = stats.monte_carlo_test(
        counts.astype(np.float64),
        multinomial_counts,
        pearson,
        vectorized=True,
        n_resamples=resamples,
        batch=max(1, 4_000_000 // probs.size),
        alternative="greater",
        axis=-1,
    )
    return FitResult(
        check, float(result.statistic), probs.size - 1, float(result.pvalue), alpha, n, tv, 1.0, method="monte-carlo"
    )


def min_detectable_tv(n: float, df: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """Smallest TV distance (between pooled cells, in every group) detected with ``power``."""
    if n <= 0 or df <= 0:
        return 1.0
    return min(1.0, float(np.sqrt(required_noncentrality(df, alpha, power) / (4 * n))))


@functools.lru_cache(maxsize=4096)
def required_noncentrality(df: int, alpha: float, power: float) -> float:
    """The noncentrality at which a level-``alpha`` chi-square test on ``df`` degrees of freedom
    has ``power`` (it does not depend on the sample size: plans reuse it).

    scipy's inverse of the noncentral chi-square CDF in its noncentrality (``special.chndtrinc``) gives it in one
    call, about 50x faster than a root search over ``stats.ncx2.sf`` (each call of which is mostly the
    distribution machinery's argument handling), and equal to it within 1e-11 relative over df 1-400000, alpha
    0.05-1e-15, power 0.5-0.999; the search stays for where it returns no finite value."""
    critical = stats.chi2.isf(alpha, df)
    direct = float(special.chndtrinc(critical, df, 1 - power))
    if math.isfinite(direct) and direct > 0:
        # Round up so the stated power is met, not missed by the inversion's tolerance.
        return direct * (1 + 1e-6)

    def shortfall(noncentrality: float) -> float:
        return float(stats.ncx2.sf(critical, df, noncentrality)) - power

    upper = max(1.0, critical)
    while shortfall(upper) < 0:
        upper *= 2
    # Round up so the stated power is met, not missed by the root-finder's tolerance.
    return float(optimize.brentq(shortfall, 1e-9, upper, xtol=1e-9)) * (1 + 1e-6)


def plan_draws(
    reach: np.ndarray,
    positive_cells: np.ndarray,
    top_mass: np.ndarray,
    *,
    alpha: float,
    tolerance: float,
    min_draws: int,
    max_draws: int,
    power: float = DEFAULT_POWER,
) -> tuple[int, float]:
    """Fewest draws whose expected per-group samples (draws x reach) detect ``tolerance``.

    Degrees of freedom come from :func:`approx_bins` (an upper bound, so the plan errs long); the sample size
    counts only the groups of two bins or more, as the fit does (a group of one bin tests nothing).
    Returns (draws, minimum detectable TV at those draws): capped at ``max_draws`` when the
    tolerance is out of reach, and ``min_draws`` when nothing is testable at any size (a
    single possible token everywhere: only the exact checks apply).
    """

    def mde(draws: int) -> float:
        n_g = draws * reach
        bins = np.array(
            [approx_bins(n, int(c), float(t)) for n, c, t in zip(n_g, positive_cells, top_mass, strict=True)]
        )
        # A group pooled into one bin tests nothing: the fit leaves it out, its samples too (chisquare_groups), so
        # they count toward neither the degrees of freedom nor the sample size the plan promises a TV for.
        tested = bins > 1
        return min_detectable_tv(float(n_g[tested].sum()), int((bins - 1).sum()), alpha, power)

    best = mde(max_draws)
    if best >= 1.0:
        return min_draws, mde(min_draws)
    if best > tolerance:
        return max_draws, best
    low, high = min_draws, max_draws
    if mde(low) <= tolerance:
        return low, mde(low)
    while high - low > max(1, low // 50):  # 2% resolution is plenty for a sample size
        middle = (low + high) // 2
        if mde(middle) <= tolerance:
            high = middle
        else:
            low = middle
    return high, mde(high)


@dataclass
class SignTest:
    """A one-sided sign test over rounds, decided as soon as the outcome is certain.

    H0: in every round the event (say, "this pass cost more than 1.1x the model") happens with
    probability at most 1/2, i.e. the round's median sits on the right side of the margin. The
    test rejects when the event happens in at least ``needed`` of ``rounds`` rounds, where
    P(Binomial(rounds, 1/2) >= needed) <= alpha: valid whatever the noise distribution, and
    stopping once rejection is certain or impossible changes no verdict. Power: a true event
    probability pi rejects with probability P(Binomial(rounds, pi) >= needed) (:meth:`power`).
    """

    alpha: float
    rounds: int
    needed: int
    hits: int = 0
    seen: int = 0

    @classmethod
    def plan(cls, alpha: float, misses: int = 1) -> SignTest:
        """The fewest rounds that reject at ``alpha`` while tolerating ``misses`` rounds without the event."""
        rounds = misses + 1
        while stats.binom.sf(rounds - misses - 1, rounds, 0.5) > alpha:
            rounds += 1
        return cls(alpha=alpha, rounds=rounds, needed=rounds - misses)

    def add(self, event: bool) -> None:
        if not self.decided:
            self.seen += 1
            self.hits += bool(event)

    @property
    def rejected(self) -> bool:
        return self.hits >= self.needed

    @property
    def decided(self) -> bool:
        return self.rejected or self.hits + (self.rounds - self.seen) < self.needed

    @property
    def p_value(self) -> float:
        """P(Binomial(rounds, 1/2) >= hits): unseen rounds count as misses (conservative)."""
        return float(stats.binom.sf(self.hits - 1, self.rounds, 0.5)) if self.hits else 1.0

    def power(self, event_probability: float) -> float:
        return float(stats.binom.sf(self.needed - 1, self.rounds, event_probability))
