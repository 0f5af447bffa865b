"""Toy target/draft models whose probabilities are exactly known.

Two shapes: context-free pairs (one target p and draft q per row and position) and order-1
Markov chains over a small vocabulary, whose L-token sequence probabilities are computable
exactly. Construction uses numpy ``Generator`` objects seeded by the caller (float64), so every
model is replayable from its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TARGET_KINDS = ("dirichlet", "peaky", "sparse", "tiny", "one_hot")
DRAFT_KINDS = ("equal", "close", "far", "uniform", "one_hot", "disjoint", "zero_heavy")
# Draft kinds that need target zeros to mean anything; they force a sparse target.
_NEEDS_TARGET_ZEROS = frozenset({"disjoint", "zero_heavy"})


def _normalise(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum(axis=-1, keepdims=True)


def _random_support(rng: np.random.Generator, vocab: int, size: int) -> np.ndarray:
    mask = np.zeros(vocab, dtype=bool)
    mask[rng.choice(vocab, size=size, replace=False)] = True
    return mask


def target_distribution(rng: np.random.Generator, vocab: int, kind: str) -> np.ndarray:
    """A target next-token distribution of the named kind (float64, sums to 1)."""
    if kind == "dirichlet":
        return rng.dirichlet(np.full(vocab, rng.uniform(0.1, 2.0)))
    if kind == "peaky":
        p = rng.dirichlet(np.full(vocab, 0.5)) * 0.1
        p[rng.integers(vocab)] += 0.9
        return _normalise(p)
    if kind == "sparse":  # zeros, but two or more possible tokens whenever V >= 3
        size = int(rng.integers(min(2, vocab - 1), max(3, vocab // 2 + 1))) if vocab >= 3 else 1
        support = _random_support(rng, vocab, size)
        return _normalise(np.where(support, rng.dirichlet(np.ones(vocab)) + 1e-3, 0.0))
    if kind == "tiny":
        p = rng.dirichlet(np.ones(vocab))
        p[rng.random(vocab) < 0.3] = 1e-9
        return _normalise(p)
    if kind == "one_hot":
        p = np.zeros(vocab)
        p[rng.integers(vocab)] = 1.0
        return p
    raise ValueError(f"unknown target kind {kind!r}; choose from {TARGET_KINDS}")


def draft_distribution(rng: np.random.Generator, p: np.ndarray, kind: str) -> np.ndarray:
    """A draft distribution q of the named kind relative to target ``p``."""
    vocab = p.shape[-1]
    if kind == "equal":
        return p.copy()
    if kind == "close":
        return _normalise((1 - 0.1) * p + 0.1 * rng.dirichlet(np.ones(vocab)))
    if kind == "far":
        return rng.dirichlet(np.full(vocab, 0.3))
    if kind == "uniform":
        return np.full(vocab, 1.0 / vocab)
    if kind == "one_hot":
        q = np.zeros(vocab)
        q[rng.integers(vocab)] = 1.0
        return q
    zeros = p == 0
    if kind == "disjoint":
        if not zeros.any():
            raise ValueError("a disjoint draft needs a target with zeros")
        return _normalise(np.where(zeros, rng.dirichlet(np.ones(vocab)) + 1e-3, 0.0))
    if kind == "zero_heavy":
        if not zeros.any():
            raise ValueError("a zero-heavy draft needs a target with zeros")
        on_zeros = _normalise(np.where(zeros, rng.random(vocab) + 1e-3, 0.0))
        return 0.8 * on_zeros + 0.2 * _normalise(p + 1e-3)
    raise ValueError(f"unknown draft kind {kind!r}; choose from {DRAFT_KINDS}")


def distribution_pair(
    rng: np.random.Generator, vocab: int, target_kind: str, draft_kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """A (p, q) pair; drafts that need target zeros get a sparse target that has some."""
    if vocab < 2 and draft_kind in _NEEDS_TARGET_ZEROS:
        draft_kind = "equal"
    if draft_kind in _NEEDS_TARGET_ZEROS:
        p = target_distribution(rng, vocab, "sparse")
        if p.min() > 0:  # the sparse draw kept every token: zero one out
            p[rng.integers(vocab)] = 0.0
            p = _normalise(p)
    else:
        p = target_distribution(rng, vocab, target_kind)
    return p, draft_distribution(rng, p, draft_kind)


def pair_batch(
    rng: np.random.Generator,
    rows: int,
    positions: int,
    vocab: int,
    kinds: list[tuple[str, str]],
) -> tuple[np.ndarray, np.ndarray]:
    """Target [rows, positions + 1, V] and draft [rows, positions, V] probabilities in which
    every row and position differ; kinds are cycled over rows (row r uses kinds[r % len])."""
    target = np.empty((rows, positions + 1, vocab))
    draft = np.empty((rows, positions, vocab))
    for r in range(rows):
        target_kind, draft_kind = kinds[r % len(kinds)]
        for i in range(positions):
            target[r, i], draft[r, i] = distribution_pair(rng, vocab, target_kind, draft_kind)
        target[r, positions] = target_distribution(rng, vocab, target_kind)
    return target, draft


@dataclass(frozen=True)
class MarkovChain:
    """Order-1 Markov model: ``table[c]`` is the next-token distribution after token c, and
    ``table[V]`` the distribution of the first token (after the start-of-sequence context)."""

    table: np.ndarray  # [V + 1, V], float64

    @property
    def vocab_size(self) -> int:
        return self.table.shape[1]

    @property
    def start(self) -> int:
        """The context id of the start of a sequence."""
        return self.vocab_size

    def sequence_probs(self, length: int) -> np.ndarray:
        """Exact probabilities of every length-L sequence, flattened row-major ([V] * L)."""
        probs = self.table[self.start]
        for _ in range(length - 1):
            probs = self._extend(probs)
        return probs

    def _extend(self, probs: np.ndarray) -> np.ndarray:
        """Append one token to flattened sequence probabilities: P(s, x) = P(s) T(x | last(s))."""
        vocab = self.vocab_size
        last = np.arange(probs.shape[0]) % vocab
        return (probs[:, None] * self.table[last]).reshape(-1)


def markov_pair(
    rng: np.random.Generator, vocab: int, target_kind: str, draft_kind: str
) -> tuple[MarkovChain, MarkovChain]:
    """A target and a draft Markov chain whose every context has a pair of the named kinds."""
    rows = [distribution_pair(rng, vocab, target_kind, draft_kind) for _ in range(vocab + 1)]
    target = MarkovChain(np.stack([p for p, _ in rows]))
    draft = MarkovChain(np.stack([q for _, q in rows]))
    return target, draft
