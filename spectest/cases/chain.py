"""Chain and Markov cases: small recipes (sizes, kinds, a seed) that Hypothesis draws and shrinks,
built into exact probabilities on demand (:func:`build_chain`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from spectest.cases.sizes import batch_sizes, draft_lengths, kind_pairs, seeds, vocab_sizes
from spectest.cases.toy_models import TARGET_KINDS, pair_batch


@dataclass(frozen=True)
class ChainCase:
    """One verify call's worth of inputs: every row and position has its own (p, q)."""

    batch: int
    k: int
    vocab: int
    kinds: tuple[tuple[str, str], ...]
    seed: int
    dtype: str = "float32"
    layout: str = "contiguous"  # how the inputs lie in memory (spectest.cases.layouts)


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
    layouts: tuple[str, ...] = ("contiguous",),
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
        layout=draw(st.sampled_from(layouts)),
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
