"""Hypothesis strategies for the sizes of a case: vocabularies (with the tile edges where kernels
break), draft lengths, batches, seeds, and the (target, draft) kinds of a pair."""

from __future__ import annotations

from hypothesis import strategies as st

from spectest.cases.toy_models import DRAFT_KINDS, TARGET_KINDS

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
