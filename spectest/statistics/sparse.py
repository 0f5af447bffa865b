"""Identity tests where pooling cannot see: every token its own cell, in the sparse regime.

The pooled chi-square (:mod:`spectest.statistics.chisquare`) merges tokens into cells of at least ten
expected draws. Where most tokens are expected far below once (a 32k-256k vocabulary, a few
thousand draws), a cell holds hundreds of tokens, and a bug that only moves mass between
neighbours inside a cell leaves every cell's count as it was. An inverse CDF whose prefix sums are
rounded to half precision is such a bug: tokens whose rounded prefix equals their neighbour's can
never be drawn, and their mass lands on the next token that can. The distribution is *lumped*
onto a subset, and what changes is how often tokens repeat, and how many distinct ones appear.

Two statistics over the sparse tokens A_g = {i : 0 < n_g p_gi < SPARSE_EXPECTED} of each group g
(n_g the samples the group received), every token its own cell:

* **tail repeats** R = sum_g sum_{i in A_g} 1{N_gi >= 2}: tokens seen twice or more. A lumped
  distribution repeats tokens the target would almost never repeat (a capped collision count:
  the collision statistic of Acharya, Daskalakis and Kamath 2015, and of Valiant and Valiant 2014,
  counts pairs, sum C(N, 2) / p; for fixed n it is their chi-square statistic. In the sparse regime
  a token seen twice is almost every collision, and its capped form has an exact bound in O(|A|));
* **missing support** M = sum_g sum_{i in A_g} 1{N_gi = 0}: tokens never seen. A lumped
  distribution covers fewer distinct tokens than the target would (the support-coverage view).

Both reject when large. Their null distributions are bounded exactly, not asymptotically: within a
group the counts are multinomial, hence negatively associated (Joag-Dev and Proschan 1983), so
for indicators that are all nondecreasing (1{N >= 2}) or all nonincreasing (1{N = 0}) in the
counts, E exp(lambda S) <= prod_i E exp(lambda 1_i) with binomial marginals (Dubhashi and Ranjan
1998); groups of one stratum are independent. Chernoff's bound

    P(S >= s) <= min_{lambda >= 0} exp(-lambda s) prod_i (1 + pi_i (e^lambda - 1))

is then a valid p-value at any sample size and any level: no normal approximation, and no
resampling (a Monte Carlo p-value needs 1/alpha resamples, a million at a run's per-check level).
``benchmarks/sparse_null.py`` measures the false-failure rate by simulating from p itself.

Groups within a *stratum* must be independent given their sample sizes (rows of one verify call at
one position are; positions of one row are not, since reaching position i+1 depends on the token at
i): each stratum is tested on its own, and the strata and both statistics share the test's level
by Bonferroni.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

SPARSE_EXPECTED = 1.0  # a token is sparse below this many expected draws
MIN_SPARSE_TOKENS = 64  # a check whose groups hold fewer sparse tokens than this has nothing to add
STATISTICS = ("tail repeats", "missing support")
LUMP_FACTORS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)  # alternatives the minimum detectable TV scans
WORST_TOKENS = 5


MIN_GROUP_SAMPLES = 2  # a group needs two draws before a token can repeat


def sparse_tokens(probs: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """[G, C] mask of the sparse tokens: possible, short of certain, and expected fewer than
    SPARSE_EXPECTED times, in groups of at least MIN_GROUP_SAMPLES draws."""
    samples = np.asarray(samples, dtype=np.float64)[:, None]
    expected = probs * samples
    return (probs > 0) & (probs < 1) & (expected < SPARSE_EXPECTED) & (samples >= MIN_GROUP_SAMPLES)


def in_sparse_regime(probs: np.ndarray, samples: np.ndarray) -> bool:
    """Whether the groups' sparse tokens at these sample sizes are many enough to test."""
    return int(sparse_tokens(probs, samples).sum()) >= MIN_SPARSE_TOKENS


def repeat_probability(p: np.ndarray, n: np.ndarray) -> np.ndarray:
    """P(Binomial(n, p) >= 2), computed without cancellation for tiny n p."""
    # 1 - (1-p)^n - n p (1-p)^(n-1) loses every digit when n p is tiny; the series starts at C(n,2) p^2. Most
    # sparse tokens are tiny: the logarithms and exponentials are taken only where the series is not used.
    p, n = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(n, dtype=np.float64))
    chance = 0.5 * n * (n - 1) * p**2 * (1 - 2 * (n - 2) * p / 3)
    exact = n * p >= 1e-3
    if exact.any():
        pe, ne = p[exact], n[exact]
        log_rest = np.log1p(-pe)
        chance[exact] = 1 - (np.exp(ne * log_rest) + np.exp(np.log(ne) + np.log(pe) + (ne - 1) * log_rest))
    return np.clip(chance, 0.0, 1.0)


def chernoff_log_sf(observed: float, chances: np.ndarray) -> float:
    """log of Chernoff's bound on P(sum_i B_i >= observed) for (negatively associated) Bernoulli
    B_i of success chances ``chances``; 0 (the trivial bound) at or below the mean."""
    chances = chances[chances > 0]
    mean = float(chances.sum())
    if observed <= mean:
        return 0.0
    if observed > chances.size:
        return -math.inf  # more successes than there are trials: impossible under the null
    if observed == chances.size:
        return float(np.log(chances).sum())

    def slope(log_t: float) -> float:  # d/d lambda of the log bound, with t = e^lambda - 1
        t = math.exp(log_t)
        return float((chances * (1 + t) / (1 + chances * t)).sum()) - observed

    low, high = -30.0, 1.0
    while slope(high) < 0:
        high *= 2
    log_t = optimize.brentq(slope, low, high, xtol=1e-6) if slope(low) < 0 else low
    t = math.exp(log_t)
    return min(0.0, float(-math.log1p(t) * observed + np.log1p(chances * t).sum()))


@dataclass
class SparseVerdict:
    """One statistic on one stratum: what was seen against what the target allows."""

    statistic: str
    stratum: int
    observed: int
    expected: float
    log_p: float  # log of the (uncorrected) Chernoff bound
    tokens: int  # sparse tokens it ran over
    samples: int


@dataclass
class SparseResult:
    """The sparse identity test of one distribution check."""

    verdicts: list[SparseVerdict]
    p_value: float  # Bonferroni-corrected over strata and statistics
    tests: int
    min_detectable_tv: float
    worst: list[tuple[str, float, int]]  # (token label, expected draws, observed draws)

    @property
    def deciding(self) -> SparseVerdict:
        return min(self.verdicts, key=lambda v: v.log_p)

    def as_record(self) -> dict[str, object]:
        """Plain JSON-ready values for the results file."""
        return {
            "p_value": self.p_value,
            "tests": self.tests,
            "min_detectable_tv": self.min_detectable_tv,
            "verdicts": [
                {
                    "statistic": v.statistic,
                    "stratum": v.stratum,
                    "observed": v.observed,
                    "expected": v.expected,
                    "log10_p": v.log_p / math.log(10) if v.log_p > -math.inf else None,
                    "tokens": v.tokens,
                    "samples": v.samples,
                }
                for v in self.verdicts
            ],
        }

    def describe(self) -> str:
        v = self.deciding
        sign = "twice or more" if v.statistic == "tail repeats" else "never"
        return (
            f"{v.statistic}: {v.observed} of {v.tokens} sparse tokens (expected below {SPARSE_EXPECTED:g} draw each, "
            f"{v.samples} draws) seen {sign}, where the target expects {v.expected:.1f}; exact Chernoff bound "
            f"p <= {_ten(v.log_p)} before the {self.tests}-way split"
        )


def _ten(log_value: float) -> str:
    if log_value == -math.inf:
        return "0"
    exponent = log_value / math.log(10)
    whole = math.floor(exponent)
    return f"{10 ** (exponent - whole):.3g}e{whole:+d}" if exponent < -4 else f"{math.exp(log_value):.3g}"


def sparse_identity_test(
    counts: np.ndarray,
    probs: np.ndarray,
    strata: np.ndarray,
    *,
    alpha: float,
    labels: list[str] | None = None,
) -> SparseResult | None:
    """Both statistics on every stratum of the groups ``counts``/``probs`` [G, C]; None when the
    groups have too few sparse tokens to test. ``alpha`` is the level of the whole test (for the
    minimum detectable TV; the verdict is the p-value)."""
    samples = counts.sum(axis=1)
    mask = sparse_tokens(probs, samples)
    if int(mask.sum()) < MIN_SPARSE_TOKENS:
        return None
    n = np.broadcast_to(samples[:, None].astype(np.float64), probs.shape)
    verdicts = []
    tested_strata = [s for s in np.unique(strata) if mask[strata == s].any()]
    for stratum in tested_strata:
        rows = strata == stratum
        chosen = mask & rows[:, None]
        p, size, seen = probs[chosen], n[chosen], counts[chosen]
        chances = {"tail repeats": repeat_probability(p, size), "missing support": np.exp(size * np.log1p(-p))}
        observed = {"tail repeats": int((seen >= 2).sum()), "missing support": int((seen == 0).sum())}
        for name in STATISTICS:
            verdicts.append(
                SparseVerdict(
                    name,
                    int(stratum),
                    observed[name],
                    float(chances[name].sum()),
                    chernoff_log_sf(observed[name], chances[name]),
                    int(chosen.sum()),
                    int(samples[rows].sum()),
                )
            )
    tests = len(verdicts)
    best = min(v.log_p for v in verdicts)
    p_value = min(1.0, math.exp(best) * tests) if best > -700 else 0.0
    return SparseResult(
        verdicts,
        p_value,
        tests,
        lumping_detectable_tv(probs, samples, mask, strata, alpha / tests),
        _worst_tokens(counts, probs, mask, samples, labels),
    )


def _worst_tokens(counts, probs, mask, samples, labels) -> list[tuple[str, float, int]]:
    """The sparse tokens seen most often against their expectation."""
    expected = probs * samples[:, None]
    excess = np.where(mask & (counts >= 2), counts - expected, -np.inf)
    flat = np.argsort(excess, axis=None)[::-1][:WORST_TOKENS]
    worst = []
    for index in flat:
        g, c = np.unravel_index(index, counts.shape)
        if not np.isfinite(excess[g, c]):
            break
        label = labels[g] if labels else ""
        worst.append((f"{label}token {int(c)}", float(expected[g, c]), int(counts[g, c])))
    return worst


def lumping_detectable_tv(
    probs: np.ndarray, samples: np.ndarray, mask: np.ndarray, strata: np.ndarray, level: float, power: float = 0.99
) -> float:
    """The smallest TV of an r-to-1 lumping of the sparse tokens (each run of r consecutive sparse
    ids moved onto one of them, r in LUMP_FACTORS, in every group) that the tail-repeats statistic
    detects with ``power`` at ``level`` on some stratum (normal approximation of its power; the
    level is exact). 1.0 if none is: then the pooled test and the exact rules speak for the check.

    A stratum's groups are worked on at once: their sparse tokens side by side, each run of r cut where its group
    ends (a check of a few hundred rows and positions would otherwise cost thousands of small array operations)."""
    best = 1.0
    for stratum in np.unique(strata):
        rows = np.flatnonzero(strata == stratum)
        sizes = mask[rows].sum(axis=1)
        rows, sizes = rows[sizes > 0], sizes[sizes > 0]
        if not rows.size:
            continue
        p = probs[rows][mask[rows]]  # each group's sparse tokens, group after group
        draws = samples[rows].astype(np.float64)
        critical = _critical_count(repeat_probability(p, np.repeat(draws, sizes)), level)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        for factor in LUMP_FACTORS:
            runs = -(-sizes // factor)  # runs of ``factor`` tokens per group, the last one short
            first = np.repeat(starts - np.concatenate(([0], np.cumsum(runs)[:-1])) * factor, runs)
            heads = first + factor * np.arange(runs.sum())
            blocks = np.add.reduceat(p, heads)
            alt = repeat_probability(np.minimum(blocks, 1 - 1e-12), np.repeat(draws, runs))
            moved = float(p.sum() - p[heads].sum())
            mean, sd = float(alt.sum()), float(np.sqrt((alt * (1 - alt)).sum()))
            if sd > 0 and stats.norm.sf((critical - mean) / sd) >= power:
                best = min(best, moved / rows.size)
                break
    return best


def _critical_count(chances: np.ndarray, level: float) -> float:
    """The smallest count whose Chernoff bound reaches ``level``. Along t = e^lambda - 1 the count
    s(t) = sum pi (1 + t) / (1 + pi t) has t as its optimal tilt, so the bound at s(t) is
    -log(1 + t) s(t) + sum log(1 + pi t): decreasing in t, solved for ``level`` in one search."""
    chances = chances[chances > 0]
    if chances.size == 0 or float(np.log(chances).sum()) > math.log(level):
        return math.inf  # even every token repeating would not reach the level

    def count(t: float) -> float:
        return float((chances * (1 + t) / (1 + chances * t)).sum())

    def excess(log_t: float) -> float:
        t = math.exp(log_t)
        return -math.log1p(t) * count(t) + float(np.log1p(chances * t).sum()) - math.log(level)

    high = 1.0
    while excess(high) > 0 and high < 700:
        high *= 2
    if excess(high) > 0:
        return float(chances.size)
    return float(math.ceil(count(math.exp(optimize.brentq(excess, -30.0, high, xtol=1e-6)))))
