"""The reference's chain compiled whole by ``torch.compile``: the ``reference-compiled`` model (on a CPU).

Eager PyTorch builds the extra token's rows max(0, p - q) in passes: gather p's and q's rows, subtract, clamp, sum
each block. On a CPU those passes over rows in cache, not the reading of p and q, are what keeps a float32
verification at large vocabularies at 2-2.7x the time a copy of its bytes takes (docs/figures.md). And around them a
verification makes about a hundred small operations (the acceptance test, the search over the block sums, the chosen
block's cells read again, the emitted rows), each a few microseconds of dispatch: at B = 64, K = 8, V = 32000 about
0.3 ms against a floor of 0.36 ms. Compiled by Inductor's C++ backend, :func:`chain` is a handful of loops: the rows
are gathered, subtracted, clamped and block-summed in one that reads each row once, at about the copy's speed, and the
rest costs one call's guards (B = 64, K = 8, V = 32000: 0.37-0.44 ms, where compiling the long rows' passes alone gave
0.55-0.68 and the eager reference 0.79-1.0; docs/figures.md, stop 57).

The arithmetic is the reference's (:mod:`spectest.implementations.reference`), on the same uniforms drawn in the same
order. A residual that rounds to nothing (p = q at a rejection) is drawn from p itself, as the reference does: the
compiled call says when a row's residual is empty, and that call is then the reference's own, on the same uniforms.

Why it is not the default: it needs a C++ compiler, and each process pays a compile at its first long call (7-8 s on
a 2-core CPU with a cold cache, about 2 s from Inductor's cache on disk; once more for float64 or a short last
block), which would cost the main job more than it saves there. Its block sums are added in another order than the
eager ones (a few ulp apart), so where a uniform falls within rounding of a block's edge its token can differ from
``reference``'s: both are exact draws, but the two models are not token for token the same.

What it compiles (:func:`fused`): float32 or float64 rows (CPU, and CUDA, which a GPU check is yet to run) of :data:`FUSED_FROM` cells or more, in any layout whose
first two dimensions merge (one row index a row), at B and K of 2 or more (a compiled function specialises for a size
of 1, a compile of its own, where the eager reference is as fast). Everything else is the reference's own.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch

from spectest.implementations import reference
from spectest.implementations.reference import ExtraToken, merged, verify_at
from spectest.protocol import PAD
from spectest.sampling import BLOCK, block_sums, last_positive

FUSED_FROM = 1 << 14  # cells a row: below it a row's passes stay in cache and the eager reference is as fast
FUSED_DTYPES = (torch.float32, torch.float64)


def verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The reference's chain (:func:`spectest.implementations.reference.verify`), compiled whole (:func:`chain`) where
    :func:`fused` says so."""
    if failed is not None or not fused(draft_token_ids, draft_probs, target_probs):
        return reference.verify(
            draft_token_ids, draft_probs, target_probs, generator=generator, num_draft_tokens=num_draft_tokens
        )
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    # The reference's uniforms, drawn in its order: the acceptances', then the extra tokens'.
    u = torch.rand((batch, k), generator=generator, device=device, dtype=target_probs.dtype)
    v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float64)
    if num_draft_tokens is None:
        lengths = torch.full((batch,), k, device=device)
    else:
        lengths = num_draft_tokens.to(device=device, dtype=torch.int64)
    emitted = compiled_chain(draft_token_ids, merged(draft_probs), merged(target_probs), u, v, lengths)
    if emitted is None:  # a residual rounded to nothing, or no compiler: the reference's own passes, same uniforms
        return verify_at(draft_token_ids, draft_probs, target_probs, u, ExtraToken(v), lengths=num_draft_tokens)
    return emitted


def fused(draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> bool:
    """Whether :func:`chain` serves these inputs: long float32 or float64 rows (p's and q's dtype alike), first two
    dimensions that merge, B and K of 2 or more. On CUDA, Inductor makes Triton kernels of the same graph (its block
    sums a program per row and block, as the one-program-per-row kernels are not): not yet run on a GPU here; the GPU
    check (.ci/gpu-check) runs the suite on it and benchmarks it."""
    batch, k = draft_token_ids.shape
    return (
        batch >= 2
        and k >= 2
        and target_probs.device.type in ("cpu", "cuda")
        and target_probs.dtype in FUSED_DTYPES
        and draft_probs.dtype == target_probs.dtype
        and draft_probs.shape[-1] == target_probs.shape[-1] >= FUSED_FROM
        and merged(draft_probs) is not None
        and merged(target_probs) is not None
    )


failed: str | None = None  # why compiling failed in this process (then every call is the reference's)


def compiled_chain(ids, q_rows, p_rows, u, v, lengths) -> torch.Tensor | None:
    """:func:`chain` compiled; None where a row's residual is empty (rounding: it is drawn from p, the reference's
    way) or the compiler fails (said once, and the reference serves every later call)."""
    global failed
    try:
        emitted, empty = compiled(chain)(ids, q_rows, p_rows, u, v, lengths)
    except Exception as exc:  # a compiler that fails here
        failed = f"{type(exc).__name__}: {exc}"[:500]
        warnings.warn(f"reference-compiled: torch.compile failed, the reference serves: {failed}", RuntimeWarning, 3)
        return None
    return None if bool(empty) else emitted


@functools.cache
def compiled(fn: Any) -> Any:
    """``fn`` compiled once per process (shapes dynamic: one compile serves every batch and vocabulary)."""
    return torch.compile(fn, dynamic=True)


def chain(
    ids: torch.Tensor,
    q_rows: torch.Tensor,
    p_rows: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(emitted [B, K + 1], whether any row's residual is empty): :func:`~spectest.implementations.reference.verify_at`
    on p and q as their merged [rows, V] views (``p_rows[b * (K + 1) + i]`` is p[b, i]), acceptance uniforms ``u``
    [B, K], extra-token uniforms ``v`` [B] and drafts per row ``lengths`` [B]. Written for Inductor: no branch on
    values (an overshooting search is clamped always, which changes nothing where none overshoots), and every row
    built the same way, a bonus row as p where its residual would be (its q row index 0, read and not used: one row
    that stays in cache)."""
    batch, k = ids.shape
    vocab = p_rows.shape[1]
    rows = torch.arange(batch, device=ids.device)
    slots = torch.arange(k, device=ids.device)
    ids = ids.clamp_min(0)  # -1 padding past a short row is never read as a token
    p_draft = p_rows[(rows * (k + 1)).unsqueeze(1) + slots, ids]
    q_draft = q_rows[(rows * k).unsqueeze(1) + slots, ids]
    # u < p/q without a division, as the reference compares.
    accepted = (u * q_draft < p_draft) & (slots < lengths.unsqueeze(1))
    n_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rejected = (n_accepted < lengths).unsqueeze(1)
    p_index = rows * (k + 1) + n_accepted
    q_index = torch.where(rejected[:, 0], rows * k + n_accepted.clamp(max=k - 1), 0)
    p_next, q_next = p_rows[p_index], q_rows[q_index]
    sums = block_sums(torch.where(rejected, (p_next - q_next).clamp_min(0), p_next))
    # The reference's inverse_cdf_at_blocks, the chosen block's cells read again from p and q.
    cumulative = sums.cumsum(-1)
    target = v.unsqueeze(1) * cumulative[:, -1:]
    block = torch.minimum(torch.searchsorted(cumulative, target, right=True), last_positive(sums))
    cells = block * BLOCK + torch.arange(BLOCK, device=ids.device)
    inside = cells < vocab  # a short last block: its cells past V read the last cell, weighted zero
    cells = cells.clamp(max=vocab - 1)
    p_cells, q_cells = p_rows[p_index.unsqueeze(1), cells], q_rows[q_index.unsqueeze(1), cells]
    values = torch.where(rejected, (p_cells - q_cells).clamp_min(0), p_cells).to(torch.float64) * inside
    local = (target - (cumulative.gather(1, block) - sums.gather(1, block))).clamp_min(0)
    within = torch.minimum(torch.searchsorted(values.cumsum(-1), local, right=True), last_positive(values))
    extra = block * BLOCK + within
    drafts = torch.where(slots < n_accepted.unsqueeze(1), ids, PAD).to(torch.int64)
    emitted = torch.cat([drafts, torch.full((batch, 1), PAD, dtype=torch.int64, device=ids.device)], dim=1)
    return emitted.scatter(1, n_accepted.unsqueeze(1), extra), (sums == 0).all(dim=-1).any()
