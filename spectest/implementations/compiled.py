"""The reference with its long rows fused by ``torch.compile``: the ``reference-compiled`` model (on a CPU).

Eager PyTorch builds the extra token's rows max(0, p - q) in passes: gather p's and q's rows, subtract, clamp, sum
each block. On a CPU those passes over rows in cache, not the reading of p and q, are what keeps a float32
verification at large vocabularies at 2-2.7x the time a copy of its bytes takes (docs/figures.md). Compiled by
Inductor's C++ backend, the gather, the subtraction, the clamp and the block sums are one loop that reads each row
once, at about the copy's speed. Everything else is the reference's own (:mod:`spectest.implementations.reference`):
the acceptance test, the search over the block sums, the chosen block's cells read again from p and q.

Why it is not the default: it needs a C++ compiler, and each process pays a compile at its first long call (7-8 s on
a 2-core CPU with a cold cache, about 2 s from Inductor's cache on disk), which would cost the main job more than it
saves there. Its block sums are added in another order than the eager ones (a few ulp apart), so where a uniform
falls within rounding of a block's edge its token can differ from ``reference``'s: both are exact draws, but the two
models are not token for token the same.

Rows it fuses: float32 and float64 on a CPU, from :data:`FUSED_FROM` cells, in any layout whose first two dimensions
merge (one row index a row, as the reference's gathers need). Half-precision rows, CUDA tensors and other layouts are
built as the reference builds them.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from spectest.implementations.reference import Chain, merged, verify_with
from spectest.sampling import block_sums

FUSED_FROM = 1 << 14  # cells a row: below it a row's passes stay in cache and the eager reference is as fast


def verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference's chain (:func:`spectest.implementations.reference.verify`), its long rows built and summed by
    one compiled loop (:class:`FusedChain`)."""
    return verify_with(FusedChain, draft_token_ids, draft_probs, target_probs, generator, num_draft_tokens)


def residual_block_sums(p_rows, q_rows, p_index, q_index) -> torch.Tensor:
    """[n, blocks] float64: block sums of max(0, p - q) for rows ``p_rows[p_index[i]]`` and ``q_rows[q_index[i]]``
    (the merged [rows, V] views of p and q), as :func:`~spectest.sampling.block_sums` sums them."""
    return block_sums((p_rows.index_select(0, p_index) - q_rows.index_select(0, q_index)).clamp_min(0))


def residual_and_bonus_block_sums(p_rows, q_rows, p_index, q_index, bonus_index) -> torch.Tensor:
    """:func:`residual_block_sums`, then the block sums of the bonus rows ``p_rows[bonus_index[i]]`` (p itself): one
    compiled call for every row of a verification (each call of a compiled function pays its guards and wrappers,
    about 0.1 ms)."""
    bonus = block_sums(p_rows.index_select(0, bonus_index))
    return torch.cat([residual_block_sums(p_rows, q_rows, p_index, q_index), bonus])


@functools.cache
def compiled(fn: Any) -> Any:
    """``fn`` compiled once per process (shapes dynamic: one compile serves every batch and vocabulary)."""
    return torch.compile(fn, dynamic=True)


class FusedChain(Chain):
    """:class:`~spectest.implementations.reference.Chain` whose long CPU rows' block sums come from one compiled call
    over every row (the rejected rows' residuals, then the bonus rows' p)."""

    failed: str | None = None  # why compiling failed in this process (then every chain builds its rows eagerly)

    def extra_tokens(self, v: torch.Tensor) -> torch.Tensor:
        p_rows, q_rows = merged(self.p), merged(self.q)
        if (
            self.rows.device.type != "cpu"
            or not self.unscaled
            or self.vocab < FUSED_FROM
            or p_rows is None
            or q_rows is None
            or FusedChain.failed is not None
        ):
            return super().extra_tokens(v)
        order, rejected = self.order()
        bonus = order.numel() - rejected
        # Rows of a kind come 0, 2 or more to a call: a compiled function specialises for a size of 0 or 1 (a compile
        # of 2-3 s each), and one or two rows are as fast eagerly.
        if rejected < 2 or bonus == 1:
            return super().extra_tokens(v)
        head, tail = order[:rejected], order[rejected:]
        p_index = head * self.p.shape[1] + self.n_accepted[head]
        q_index = head * self.q.shape[1] + self.at_draft[head]
        try:
            if bonus:
                bonus_index = tail * self.p.shape[1] + self.n_accepted[tail]
                sums = compiled(residual_and_bonus_block_sums)(p_rows, q_rows, p_index, q_index, bonus_index)
            else:
                sums = compiled(residual_block_sums)(p_rows, q_rows, p_index, q_index)
        except Exception as exc:  # a compiler that fails here: said once, and the reference's own passes serve
            FusedChain.failed = f"{type(exc).__name__}: {exc}"[:500]
            message = f"reference-compiled: torch.compile failed, its rows are built eagerly: {FusedChain.failed}"
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return super().extra_tokens(v)
        if order is not self.rows:
            sums = torch.empty_like(sums).index_copy_(0, order, sums)
        return self.drawn_from_sums(sums, v)
