"""The acceptance chain in closed form: tokens per target pass for i.i.d. and position-dependent
acceptance, and the per-position acceptance of a (p, q) pair.

L is the number of tokens one target pass emits (accepted drafts plus the correction or bonus):
with S_k = a_1 ... a_k, P(L = k + 1) = S_k (1 - a_{k+1}) for k < K and P(L = K + 1) = S_K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def acceptance_probability(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """sum_x min(p(x), q(x)) = 1 - TV(p, q), over the last axis."""
    return np.minimum(p, q).sum(axis=-1)


@dataclass(frozen=True)
class TokensPerPass:
    """The distribution of L over 1..K+1 and its moments."""

    probs: np.ndarray  # [..., K + 1]: P(L = 1), ..., P(L = K + 1)

    @property
    def k(self) -> int:
        return self.probs.shape[-1] - 1

    @property
    def values(self) -> np.ndarray:
        return np.arange(1, self.k + 2)

    @property
    def mean(self) -> np.ndarray:
        return (self.probs * self.values).sum(axis=-1)

    @property
    def variance(self) -> np.ndarray:
        return (self.probs * self.values**2).sum(axis=-1) - self.mean**2

    def as_dict(self) -> dict[str, object]:
        return {
            "k": self.k,
            "mean": float(self.mean),
            "variance": float(self.variance),
            "distribution": {int(v): float(p) for v, p in zip(self.values, self.probs, strict=True)},
        }


def tokens_per_pass(acceptance: np.ndarray | list[float]) -> TokensPerPass:
    """Distribution of L for position-dependent acceptance a_1..a_K (last axis; leading axes batch)."""
    a = np.asarray(acceptance, dtype=np.float64)
    ones = np.ones((*a.shape[:-1], 1))
    survival = np.concatenate([ones, np.cumprod(a, axis=-1)], axis=-1)  # S_0..S_K
    stop = np.concatenate([1 - a, ones], axis=-1)  # reject at k+1, or the bonus after K
    return TokensPerPass(survival * stop)


def tokens_per_pass_iid(alpha: float, k: int) -> TokensPerPass:
    """Truncated geometric: every draft accepted with the same probability alpha."""
    return tokens_per_pass(np.full(k, float(alpha)))


def expected_tokens_iid(alpha: float, k: int) -> float:
    """E[L] = (1 - alpha^(K+1)) / (1 - alpha) (K + 1 at alpha = 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)
