"""What speculative decoding buys: speedup, arithmetic cost, break-even acceptance, optimal K.

Cost of one pass in target-step units: K draft steps at c each, one verification pass over K+1
positions costing 1 + d*K (d = 0 is Leviathan et al.'s assumption that verifying is as cheap as
one step; d > 0 models compute-bound serving), plus an overhead o, and o_r more when the pass
ended in a rejection (probability 1 - a^K: the residual row, a cache rollback). Plain decoding
emits one token per target step plus its own overhead o_plain, so
speedup = E[L] (1 + o_plain) / (K c + 1 + d K + o + o_r (1 - a^K)).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize
from spectest.simulators.chain import expected_tokens_iid


@dataclass(frozen=True)
class CostModel:
    """Draft/target cost ratio c, verification growth d per extra position, overhead per pass o
    (a pass that ended in a bonus), the extra overhead of a pass that ended in a rejection
    (the residual row, rollback; may be negative), and the overhead of one plain token, all in
    target steps."""

    cost_ratio: float
    verify_growth: float = 0.0
    overhead: float = 0.0
    rejection_overhead: float = 0.0
    plain_overhead: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cost_ratio", "verify_growth", "overhead", "plain_overhead"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not np.isfinite(self.rejection_overhead) or self.overhead + self.rejection_overhead < 0:
            raise ValueError(
                f"rejection_overhead must be finite with overhead + rejection_overhead >= 0, got {self.rejection_overhead}"
            )

    def pass_cost(self, k: int, alpha: float = 1.0) -> float:
        """Cost of drafting K tokens and verifying them, in target steps; a pass ends in a
        rejection with probability 1 - alpha^K."""
        rejected = 1.0 - alpha**k if self.rejection_overhead else 0.0
        return k * self.cost_ratio + 1 + self.verify_growth * k + self.overhead + self.rejection_overhead * rejected


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance rate must lie in [0, 1], got {alpha}")


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"K (gamma) must be >= 1, got {k}")


def speedup(alpha: float, k: int, cost: CostModel) -> float:
    """Expected wall-clock speedup over plain decoding for i.i.d. acceptance alpha."""
    _check_alpha(alpha)
    _check_k(k)
    return expected_tokens_iid(alpha, k) * (1 + cost.plain_overhead) / cost.pass_cost(k, alpha)


def operations_factor(alpha: float, k: int, ops_ratio: float) -> float:
    """Arithmetic operations per emitted token relative to plain decoding (Leviathan et al.
    Thm 3.11): the target scores K+1 positions and the draft K tokens per pass."""
    _check_alpha(alpha)
    _check_k(k)
    return (k * ops_ratio + k + 1) / expected_tokens_iid(alpha, k)


def acceptance_for_speedup(target: float, k: int, cost: CostModel) -> float | None:
    """The acceptance rate at which the speedup equals ``target`` (None if unreachable even at
    alpha = 1; 0 if even alpha = 0 reaches it)."""
    _check_k(k)
    if not cost.rejection_overhead:
        return acceptance_for_tokens_per_pass(target * cost.pass_cost(k) / (1 + cost.plain_overhead), k)
    gap = lambda a: speedup(a, k, cost) - target  # noqa: E731
    if gap(1.0) < -1e-12:
        return None
    if gap(0.0) >= 0:
        return 0.0
    return float(optimize.brentq(gap, 0.0, 1.0, xtol=1e-14, rtol=1e-14))


def acceptance_for_tokens_per_pass(needed: float, k: int) -> float | None:
    """The i.i.d. acceptance rate at which E[L] equals ``needed`` (a pass cost, for break-even:
    a measured one works too). None if more than K + 1 tokens per pass are needed."""
    _check_k(k)
    if needed > k + 1 + 1e-12:
        return None
    if needed <= 1.0:
        return 0.0
    return float(optimize.brentq(lambda a: expected_tokens_iid(a, k) - needed, 0.0, 1.0, xtol=1e-14, rtol=1e-14))


def break_even_acceptance(k: int, cost: CostModel) -> float | None:
    """a* where speculative decoding is exactly as fast as plain decoding (with no rejection or
    plain overhead: sum_{i=1..K} a^i = K c + d K + o).
    Below it, speculation is slower. None: never breaks even (drafting costs too much)."""
    return acceptance_for_speedup(1.0, k, cost)


def optimal_k(alpha: float, cost: CostModel, max_k: int = 64) -> tuple[int, float]:
    """(K, speedup) maximising the speedup over K = 1..max_k; (0, 1.0) when no K beats plain decoding."""
    _check_alpha(alpha)
    best = max(((k, speedup(alpha, k, cost)) for k in range(1, max_k + 1)), key=lambda pair: pair[1])
    return best if best[1] > 1.0 else (0, 1.0)
