"""Hypothesis strategies for speculative-decoding cases, for the suite and for users' own tests.

Strategies draw small *recipes* (sizes, kinds, a seed) rather than raw probability vectors:
that keeps large vocabularies cheap, lets Hypothesis shrink toward small simple cases, and
replays any case exactly from its printed repr. Build the arrays with :func:`build_chain`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spectest.models import DRAFT_KINDS, TARGET_KINDS, pair_batch

# Sizes where kernels change tiles or blocks; bugs hide just either side of them.
TILE_EDGES = (127, 128, 129, 255, 256, 257, 1023, 1024, 1025, 4095, 4096, 4097, 32000, 32768, 128256, 131072)


def _validate_range(name: str, low: int, high: int, floor: int) -> None:
    if low < floor or high < low:
        raise ValueError(f"{name}: need {floor} <= min ({low}) <= max ({high})")


def vocab_sizes(*, min_size: int = 2, max_size: int = 131072) -> st.SearchStrategy[int]:
    """Vocabulary sizes: mostly small, plus tile edges and non-multiples of 128 up to max_size."""
    _validate_range("vocab_sizes", min_size, max_size, 2)
    edges = [v for v in TILE_EDGES if min_size <= v <= max_size]
    parts = [
        st.integers(min_size, min(max_size, 64)) if min_size <= 64 else st.nothing(),
        st.integers(min_size, max_size),
    ]
    if edges:
        parts.append(st.sampled_from(edges))
    return st.one_of(parts)


def draft_lengths(*, min_k: int = 1, max_k: int = 16) -> st.SearchStrategy[int]:
    """K, the number of draft tokens per pass."""
    _validate_range("draft_lengths", min_k, max_k, 1)
    return st.integers(min_k, max_k)


def batch_sizes(*, min_size: int = 1, max_size: int = 512) -> st.SearchStrategy[int]:
    _validate_range("batch_sizes", min_size, max_size, 1)
    return st.integers(min_size, max_size)


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def kind_pairs(
    *, target_kinds: tuple[str, ...] = TARGET_KINDS, draft_kinds: tuple[str, ...] = DRAFT_KINDS
) -> st.SearchStrategy[tuple[str, str]]:
    """(target kind, draft kind): random drafts, disjoint supports, one-hot targets and drafts,
    tiny masses, and drafts that favour tokens the target forbids."""
    return st.tuples(st.sampled_from(target_kinds), st.sampled_from(draft_kinds))


@dataclass(frozen=True)
class ChainCase:
    """One verify call's worth of inputs: every row and position has its own (p, q)."""

    batch: int
    k: int
    vocab: int
    kinds: tuple[tuple[str, str], ...]
    seed: int
    dtype: str = "float32"


@dataclass(frozen=True)
class MarkovCase:
    """A context-dependent target/draft pair and the sequence length to test."""

    vocab: int
    k: int
    length: int
    target_kind: str
    draft_kind: str
    seed: int
    dtype: str = "float32"


@st.composite
def chain_cases(
    draw: st.DrawFn,
    *,
    batch: st.SearchStrategy[int] | None = None,
    k: st.SearchStrategy[int] | None = None,
    vocab: st.SearchStrategy[int] | None = None,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    max_elements: int | None = None,
) -> ChainCase:
    """A case; with ``max_elements``, B then K are cut so that B * (2K + 1) * V fits (large V
    comes with small B and K, large B with small V: every extreme is reachable, none at once)."""
    b = draw(batch if batch is not None else batch_sizes())
    k_ = draw(k if k is not None else draft_lengths())
    v = draw(vocab if vocab is not None else vocab_sizes())
    if max_elements is not None:
        b = max(1, min(b, max_elements // ((2 * k_ + 1) * v)))
        k_ = max(1, min(k_, (max_elements // (b * v) - 1) // 2))
    return ChainCase(
        batch=b,
        k=k_,
        vocab=v,
        kinds=tuple(draw(st.lists(kind_pairs(), min_size=1, max_size=4))),
        seed=draw(seeds()),
        dtype=draw(st.sampled_from(dtypes)),
    )


@dataclass(frozen=True)
class CaseRanges:
    """The sizes a property draws, in one place: the strategy is built from them, and the README
    quotes :meth:`describe` (a test keeps the two in step). ``max_elements`` caps B (2K + 1) V per
    case, cutting B then K (see :func:`chain_cases`)."""

    batch: tuple[int, int] = (1, 512)
    k: tuple[int, int] = (1, 16)
    vocab: tuple[int, int] = (2, 131072)
    max_elements: int | None = None

    def describe(self) -> str:
        text = f"B {self.batch[0]}-{self.batch[1]}, K {self.k[0]}-{self.k[1]}, V {self.vocab[0]}-{self.vocab[1]}"
        return text + (f", B (2K + 1) V <= {self.max_elements:,}" if self.max_elements else "")

    def chain_cases(self, **kwargs: object) -> st.SearchStrategy[ChainCase]:
        return chain_cases(
            batch=batch_sizes(min_size=self.batch[0], max_size=self.batch[1]),
            k=draft_lengths(min_k=self.k[0], max_k=self.k[1]),
            vocab=vocab_sizes(min_size=self.vocab[0], max_size=self.vocab[1]),
            max_elements=self.max_elements,
            **kwargs,  # type: ignore[arg-type]
        )

    def logits_cases(self, **kwargs: object) -> st.SearchStrategy[LogitsCase]:
        return logits_cases(
            batch=batch_sizes(min_size=self.batch[0], max_size=self.batch[1]),
            k=draft_lengths(min_k=self.k[0], max_k=self.k[1]),
            vocab=vocab_sizes(min_size=self.vocab[0], max_size=self.vocab[1]),
            **kwargs,  # type: ignore[arg-type]
        )


def max_length(vocab: int, max_cells: int) -> int:
    """Longest L with vocab ** L <= max_cells (at least 2)."""
    length = 1
    while vocab ** (length + 1) <= max_cells:
        length += 1
    return max(length, 2)


@st.composite
def markov_cases(
    draw: st.DrawFn,
    *,
    max_vocab: int = 5,
    max_k: int = 8,
    max_cells: int = 4096,
    dtypes: tuple[str, ...] = ("float32",),
) -> MarkovCase:
    """A Markov pair over a small vocabulary and a length L > K whose V**L joint fits max_cells.

    Targets keep two or more possible tokens in every context (no one-hot target kind, and
    V >= 3 for drafts that need target zeros), so the joint distribution is never degenerate.
    """
    target_kind, draft_kind = draw(kind_pairs(target_kinds=tuple(k for k in TARGET_KINDS if k != "one_hot")))
    vocab = draw(st.integers(3 if draft_kind in ("disjoint", "zero_heavy") else 2, max_vocab))
    length = max_length(vocab, max_cells)
    k = draw(st.integers(1, min(max_k, length - 1)))
    return MarkovCase(vocab, k, length, target_kind, draft_kind, draw(seeds()), draw(st.sampled_from(dtypes)))


def build_chain(case: ChainCase) -> tuple[np.ndarray, np.ndarray]:
    """Target [B, K+1, V] and draft [B, K, V] probabilities (float64) for a case."""
    rng = np.random.default_rng(case.seed)
    return pair_batch(rng, case.batch, case.k, case.vocab, list(case.kinds))


# Logits-level cases (sampling parameters) live in their own module; re-exported here.
from spectest.logits_cases import LogitsCase, LogitsInputs, build_logits, logits_cases  # noqa: E402
from spectest.sampling_params import SamplingParams  # noqa: E402

__all__ = [
    "TILE_EDGES", "CaseRanges", "ChainCase", "LogitsCase", "LogitsInputs", "MarkovCase", "SamplingParams", "batch_sizes",
    "build_chain", "build_logits", "chain_cases", "draft_lengths", "kind_pairs", "logits_cases", "markov_cases",
    "max_length", "seeds", "vocab_sizes",
]  # fmt: skip
