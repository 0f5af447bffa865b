"""Toy target/draft models whose probabilities are exactly known.

Two shapes: context-free pairs (one target p and draft q per row and position) and order-1
Markov chains over a small vocabulary, whose L-token sequence probabilities are computable
exactly. Construction uses numpy ``Generator`` objects seeded by the caller (float64), so every
model is replayable from its seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TARGET_KINDS = ("dirichlet", "peaky", "sparse", "tiny", "one_hot", "masked_tail", "extreme", "lm", "zipf")
DRAFT_KINDS = (
    "equal",
    "close",
    "far",
    "uniform",
    "one_hot",
    "disjoint",
    "zero_heavy",
    "masked_like_target",
    "elsewhere",
)
SMALLEST_NORMAL_FP32 = float(np.finfo(np.float32).tiny)  # 1.18e-38
# Draft kinds that need target zeros to mean anything; they force a sparse target.
_NEEDS_TARGET_ZEROS = frozenset({"disjoint", "zero_heavy"})


def _normalise(weights: np.ndarray) -> np.ndarray:
    return weights / weights.sum(axis=-1, keepdims=True)


def _dirichlet(rng: np.random.Generator, concentration: np.ndarray | float, shape: tuple[int, int]) -> np.ndarray:
    """``shape[0]`` random distributions over ``shape[1]`` cells, p proportional to E^(1/a) for
    exponential E: exactly Dirichlet(1) at a = 1, peakier below (a = 0.1 puts most mass on a few
    cells), flatter above, one a per draw. Not Dirichlet for a != 1, but as varied, and five times
    faster than gamma variates (whose cost dominated cases of 20M cells)."""
    variates = rng.standard_exponential(shape, dtype=np.float32).astype(np.float64)
    if not (np.ndim(concentration) == 0 and concentration == 1.0):
        variates **= 1.0 / np.asarray(concentration, dtype=np.float64).reshape(-1, 1)
    variates[~(variates.sum(axis=-1) > 0)] = 1.0  # every variate underflowed: a uniform draw
    return _normalise(variates)


def _one_hot(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    out = np.zeros((rows, vocab))
    out[np.arange(rows), rng.integers(vocab, size=rows)] = 1.0
    return out


def target_distributions(rng: np.random.Generator, rows: int, vocab: int, kind: str) -> np.ndarray:
    """``rows`` target next-token distributions [rows, V] of the named kind (float64, each sums to 1)."""
    shape = (rows, vocab)
    if kind == "dirichlet":
        return _dirichlet(rng, rng.uniform(0.1, 2.0, size=rows), shape)
    if kind == "peaky":
        p = _dirichlet(rng, 0.5, shape) * 0.1
        p[np.arange(rows), rng.integers(vocab, size=rows)] += 0.9
        return _normalise(p)
    if kind == "sparse":  # zeros, but two or more possible tokens whenever V >= 3
        if vocab < 3:
            return _one_hot(rng, rows, vocab)
        index = np.arange(rows)
        share = rng.uniform(0.0, 0.5, size=(rows, 1))
        support = rng.random(shape) < share
        first = rng.integers(vocab, size=rows)  # two distinct tokens always possible
        second = (first + 1 + rng.integers(vocab - 1, size=rows)) % vocab
        support[index, first] = support[index, second] = True
        low, high = np.minimum(first, second), np.maximum(first, second)
        zero = rng.integers(vocab - 2, size=rows)  # and one token never, the r-th outside the two
        zero += zero >= low
        zero += zero >= high
        support[index, zero] = False
        return _normalise(np.where(support, _dirichlet(rng, 1.0, shape) + 1e-3, 0.0))
    if kind == "tiny":
        p = _dirichlet(rng, 1.0, shape)
        p[rng.random(shape) < 0.3] = 1e-9
        return _normalise(p)
    if kind == "one_hot":
        return _one_hot(rng, rows, vocab)
    if kind == "masked_tail":  # grammar masks, vocabularies padded to a multiple of 64: a whole tail of zeros
        tail = rng.integers(1, max(2, vocab // 2 + 1), size=(rows, 1))
        support = np.arange(vocab)[None, :] < np.maximum(1, vocab - tail)
        return _normalise(np.where(support, _dirichlet(rng, 1.0, shape) + 1e-6, 0.0))
    if kind == "extreme":  # one token at 1 - 1e-7, the rest tiny, some at float32's smallest normal
        rest = _dirichlet(rng, 1.0, shape) * 1e-7
        rest[rng.random(shape) < 0.3] = SMALLEST_NORMAL_FP32
        top = rng.integers(vocab, size=rows)
        rest[np.arange(rows), top] = 1 - 1e-7
        return _normalise(rest)
    name, _, parameter = kind.partition(":")  # "lm:2" and "zipf:1.0" fix what "lm" and "zipf" draw
    if name == "lm":  # a language model's next token: softmax of Gaussian logits at a scale of 2 to 4
        scale = float(parameter) if parameter else rng.uniform(2.0, 4.0, size=(rows, 1))
        logits = scale * rng.standard_normal(shape)
        return _normalise(np.exp(logits - logits.max(axis=-1, keepdims=True)))
    if name == "zipf":  # a Zipf-like tail, p proportional to rank^-a (a in 1.0-1.2), frequent ids scattered
        exponent = float(parameter) if parameter else rng.uniform(1.0, 1.2, size=(rows, 1))
        ranked = np.arange(1, vocab + 1, dtype=np.float64)[None, :] ** -exponent
        order = np.argsort(rng.random(shape), axis=-1)
        return _normalise(np.take_along_axis(ranked, order, axis=-1))
    raise ValueError(f"unknown target kind {kind!r}; choose from {TARGET_KINDS}")


def draft_distributions(rng: np.random.Generator, p: np.ndarray, kind: str) -> np.ndarray:
    """Draft distributions q [rows, V] of the named kind relative to targets ``p`` [rows, V]."""
    rows, vocab = p.shape
    if kind == "equal":
        return p.copy()
    if kind == "close":
        return _normalise((1 - 0.1) * p + 0.1 * _dirichlet(rng, 1.0, p.shape))
    if kind == "far":
        return _dirichlet(rng, 0.3, p.shape)
    if kind == "uniform":
        return np.full(p.shape, 1.0 / vocab)
    if kind == "one_hot":
        return _one_hot(rng, rows, vocab)
    if kind == "masked_like_target":  # the same mask applied to the draft model (p = 0 means q = 0)
        return _normalise(np.where(p > 0, _dirichlet(rng, 1.0, p.shape) + 1e-6, 0.0))
    if kind == "elsewhere":  # all its mass on one token the target does not favour most
        top = p.argmax(axis=-1)
        other = (top + 1 + rng.integers(max(1, vocab - 1), size=rows)) % vocab if vocab > 1 else top
        out = np.zeros_like(p)
        out[np.arange(rows), other] = 1.0
        return out
    zeros = p == 0
    if kind in ("disjoint", "zero_heavy") and not zeros.any(axis=-1).all():
        raise ValueError(f"a {kind} draft needs a target with zeros in every row")
    if kind == "disjoint":
        return _normalise(np.where(zeros, _dirichlet(rng, 1.0, p.shape) + 1e-3, 0.0))
    if kind == "zero_heavy":
        on_zeros = _normalise(np.where(zeros, rng.random(p.shape) + 1e-3, 0.0))
        return 0.8 * on_zeros + 0.2 * _normalise(p + 1e-3)
    raise ValueError(f"unknown draft kind {kind!r}; choose from {DRAFT_KINDS}")


def distribution_pairs(
    rng: np.random.Generator, rows: int, vocab: int, target_kind: str, draft_kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` (p, q) pairs [rows, V]; drafts that need target zeros get sparse targets that have some."""
    if vocab < 2 and draft_kind in _NEEDS_TARGET_ZEROS:
        draft_kind = "equal"
    if draft_kind in _NEEDS_TARGET_ZEROS:
        p = target_distributions(rng, rows, vocab, "sparse")
        full = (p > 0).all(axis=-1)  # the sparse draw kept every token: zero one out
        p[full, rng.integers(vocab, size=int(full.sum()))] = 0.0
        p = _normalise(p)
    else:
        p = target_distributions(rng, rows, vocab, target_kind)
    return p, draft_distributions(rng, p, draft_kind)


def target_distribution(rng: np.random.Generator, vocab: int, kind: str) -> np.ndarray:
    """One target next-token distribution of the named kind (float64, sums to 1)."""
    return target_distributions(rng, 1, vocab, kind)[0]


def distribution_pair(
    rng: np.random.Generator, vocab: int, target_kind: str, draft_kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """One (p, q) pair of the named kinds."""
    p, q = distribution_pairs(rng, 1, vocab, target_kind, draft_kind)
    return p[0], q[0]


def pair_batch(
    rng: np.random.Generator,
    rows: int,
    positions: int,
    vocab: int,
    kinds: list[tuple[str, str]],
) -> tuple[np.ndarray, np.ndarray]:
    """Target [rows, positions + 1, V] and draft [rows, positions, V] probabilities in which
    every row and position differ; kinds are cycled over rows (row r uses kinds[r % len]).
    Generated one kind at a time over all its rows and positions (no loop over rows)."""
    target = np.empty((rows, positions + 1, vocab))
    draft = np.empty((rows, positions, vocab))
    for j, (target_kind, draft_kind) in enumerate(kinds):
        mine = np.arange(j, rows, len(kinds))
        if mine.size == 0:
            continue
        p, q = distribution_pairs(rng, mine.size * positions, vocab, target_kind, draft_kind)
        target[mine, :positions] = p.reshape(mine.size, positions, vocab)
        draft[mine] = q.reshape(mine.size, positions, vocab)
        target[mine, positions] = target_distributions(rng, mine.size, vocab, target_kind)
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
    p, q = distribution_pairs(rng, vocab + 1, vocab, target_kind, draft_kind)
    return MarkovChain(p), MarkovChain(q)
