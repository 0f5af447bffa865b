"""The reference sampler: modified rejection sampling, vectorised over rows and positions.

It reads only what a verifier must: the K draft-token probabilities of p and q per row, and the
two V-long rows that the one extra token needs (the residual at the first rejection, or the
bonus row), each once. No Python loop over positions; on a CPU, long rows that lie in long runs are built where
they lie, a run of evenly spaced rows at a time (:meth:`Chain.run_by_run`; a half side's rows one at a time,
:meth:`Chain.row_by_row`), the others gathered a chunk at a time. ``reference-compiled``
(:mod:`spectest.implementations.compiled`) is this chain compiled whole by ``torch.compile``, on the same uniforms.

The registered ``reference`` model, ``REFERENCE`` in :mod:`spectest.implementations.sampler` (declared there so that
resolving it imports no torch), carries every optional capability: the chain ``verify``, ``verify_logits`` with
per-row sampling parameters and per-row seeds, and ``propose``. ``verify`` is also usable on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from spectest.protocol import PAD
from spectest.sampling import BITS, BLOCK, block_sums, inverse_cdf_at_blocks, inverse_cdf_blocked, make_generator
from spectest.sampling_params import NO_SEED, SamplingParams

spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})
spectest_dtypes = ("float32", "float64", "bfloat16", "float16")


def verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accept draft i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit
    one token from norm(max(0, p - q)), or the bonus from target_probs[:, K] if all K pass.
    Half-precision inputs are normalised and worked on in float32 (see :func:`working_precision`).
    ``num_draft_tokens`` [B]: row r carries only its first n_r drafts, its bonus row is
    target_probs[r, n_r] (ragged batches, as vLLM passes them)."""
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    u = torch.rand((batch, k), generator=generator, device=device, dtype=working_dtype(target_probs))
    v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float64)
    # Half inputs stay as given: the verifier reads the few values it needs, each divided by its row's
    # float32 sum (the distribution the given values define), instead of a float32 copy of every row.
    scales = reached_row_sums(draft_token_ids, draft_probs, target_probs, u, num_draft_tokens)
    return verify_at(
        draft_token_ids,
        draft_probs,
        target_probs,
        u,
        ExtraToken(v),
        lengths=num_draft_tokens,
        scales=scales,
    )


HALF_DTYPES = (torch.float16, torch.bfloat16)
SUM_CHUNK = 1 << 18  # elements widened at a time for a half row sum: a float32 chunk that stays in cache
EVERY_ROW = 1 << 20  # below this many half elements in a call, summing every row costs less than choosing rows


def half_row_sums(probs: torch.Tensor) -> torch.Tensor | None:
    """[..., 1] each row's float32 sum for half inputs (a row of zeros gives the smallest normal, so
    0 / it stays 0); None for float32 and float64, which are used as given."""
    if probs.dtype not in HALF_DTYPES:
        return None
    # Widened, then summed, a few rows at a time: torch's half sum with a float32 accumulator is several times
    # slower on a CPU, and a float32 copy of every row at once would be written to memory and read back.
    return float_sums(probs.split(max(1, SUM_CHUNK // max(1, probs[0].numel()))))


def float_sums(chunks: Iterable[torch.Tensor]) -> torch.Tensor:
    """[..., 1] the float32 sums of half rows given a few at a time, each chunk widened and summed (in cache), the
    chunks' sums stacked; a row of zeros sums to the smallest normal."""
    sums = [chunk.float().sum(dim=-1, keepdim=True) for chunk in chunks]
    return (sums[0] if len(sums) == 1 else torch.cat(sums)).clamp_min(torch.finfo(torch.float32).tiny)


def reached_row_sums(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    u: torch.Tensor,
    lengths: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(q, p) row sums [B, K, 1] and [B, K + 1, 1] of half inputs (None for a float32 or float64 side), as
    :func:`verify_at` takes them, summing only the rows a verification reads: position by position, the rows
    whose drafts were all accepted so far. Where no verification reads a row its sum is 1 (its position lies
    past the first rejection, its q row is multiplied by zero, or it is a bonus row, which :func:`verify_at`
    leaves unscaled): the acceptances :func:`verify_at` counts, up to the first rejection, and the extra token
    are those of every row's sum.
    A row of zeros sums to the smallest normal, as in :func:`half_row_sums`.

    A verification reaches about two positions of each side where drafts are often rejected, out of K and
    K + 1: at large vocabularies the sums are most of a half verification's reading."""
    halves = draft_probs.dtype in HALF_DTYPES, target_probs.dtype in HALF_DTYPES
    batch, k = draft_token_ids.shape
    if not any(halves) or batch * (2 * k + 1) * target_probs.shape[-1] < EVERY_ROW:
        return half_row_sums(draft_probs), half_row_sums(target_probs)
    device = draft_token_ids.device
    q_scale = torch.ones((batch, k, 1), device=device) if halves[0] else None
    p_scale = torch.ones((batch, k + 1, 1), device=device) if halves[1] else None
    drafted = torch.full((batch,), k, device=device) if lengths is None else lengths.to(device=device)
    alive = (drafted > 0).nonzero().flatten()
    for i in range(k):
        if not alive.numel():
            break
        at = torch.full_like(alive, i)
        ids = draft_token_ids[alive, i]
        q, p = draft_probs[alive, at, ids], target_probs[alive, at, ids]
        if q_scale is not None:
            q_sum = q_scale[alive, i] = sums_at(draft_probs, alive, at)
            q = q.float() / q_sum[:, 0]
        if p_scale is not None:
            p_sum = p_scale[alive, i] = sums_at(target_probs, alive, at)
            p = p.float() / p_sum[:, 0]
        # The comparison verify_at makes, on the same float32 values.
        kept = u[alive, i] * q < p
        alive = alive[kept & (i + 1 < drafted[alive])]
    return q_scale, p_scale


def sums_at(probs: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N, 1] float32 sums of the half rows ``probs[rows[n], positions[n]]`` (``rows`` ascending and distinct, as
    :func:`reached_row_sums` passes them), a few rows at a time, each summed where it lies where it can be: a row
    alone that fills a chunk (large vocabularies), or every row of the batch at one position (a verification's
    first, where every row with a draft is reached); other rows are copied out first."""
    step = max(1, SUM_CHUNK // probs.shape[-1])
    if step == 1:
        return float_sums(
            probs[row, position].unsqueeze(0) for row, position in zip(rows.tolist(), positions.tolist(), strict=True)
        )
    if rows.numel() == probs.shape[0] and bool((positions == positions[0]).all()):  # rows is every row, in order
        column = probs[:, int(positions[0])]
        return float_sums(column[start : start + step] for start in range(0, rows.numel(), step))
    return float_sums(
        selected_rows(probs, rows[start : start + step], positions[start : start + step])
        for start in range(0, rows.numel(), step)
    )


def working_dtype(probs: torch.Tensor) -> torch.dtype:
    return torch.float32 if probs.dtype in HALF_DTYPES else probs.dtype


def working_precision(probs: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 probabilities as the float32 distribution they define (normalised; a row of
    zeros stays zeros): the ratio, the residual and the uniforms then carry 24 bits, and the
    output follows the given values exactly; float32 and float64 pass through untouched."""
    if probs.dtype in (torch.float32, torch.float64):
        return probs
    wide = probs.float()
    # A row of zeros (an engine's padding past a short row) stays zeros: 0/0 would put NaN where a
    # fused step multiplies it by 0 (NaN * 0 is NaN), and the NaN would reach the sampled row.
    return wide / wide.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


def verify_at(
    draft_token_ids,
    draft_probs,
    target_probs,
    u,
    sample,
    lengths=None,
    scales=None,
) -> torch.Tensor:
    """The chain with acceptance uniforms ``u`` [B, K] given, and ``sample(weights)`` drawing the
    extra token; ``lengths`` [B]: drafts per row (default K); ``scales``: (q, p) row sums [B, K, 1]
    and [B, K + 1, 1] of unnormalised half inputs: every value read is widened to float32 and divided
    by its row's sum (what :func:`working_precision` gives, without widening the untouched rows), but for a
    bonus row's, only widened: it is drawn from p alone, in which its scale cancels.

    ``sample`` may be a :class:`ExtraToken` (the rows' own uniforms): the extra tokens' rows are then built a few
    at a time, each few reduced to its block sums while in cache, and every row drawn from its sums at once (the
    chosen block's cells read again where they lie); any other callable gets every row's weights at once."""
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    # -1 padding past a short row is never read as a token (and costs nothing when no row is short).
    ids = (draft_token_ids if lengths is None else draft_token_ids.clamp_min(0)).unsqueeze(-1)
    q_scale, p_scale = scales if scales is not None else (None, None)

    p_draft = widened(target_probs[:, :k].gather(-1, ids), None if p_scale is None else p_scale[:, :k]).squeeze(-1)
    q_draft = widened(draft_probs.gather(-1, ids), q_scale).squeeze(-1)
    # u < p/q without a division: exact when p >= q (always accepted) and when q = 0.
    accepted = u * q_draft < p_draft
    if lengths is not None:
        accepted &= torch.arange(k, device=device) < lengths.unsqueeze(1)
    n_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    drafted = torch.full_like(n_accepted, k) if lengths is None else lengths
    chain = Chain(draft_probs, target_probs, n_accepted, n_accepted.clamp(max=k - 1), n_accepted < drafted, scales)
    if isinstance(sample, ExtraToken):
        extra = chain.extra_tokens(sample.v)
    else:
        weights = chain.every_row()
        empty = weights.amax(dim=-1) <= 0
        if bool(empty.any()):
            weights[empty] = chain.fallback(empty.nonzero().flatten())
        extra = sample(weights)

    slots = torch.arange(k + 1, device=device)
    emitted = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=device)
    emitted[:, :k] = torch.where(slots[:k] < n_accepted.unsqueeze(1), draft_token_ids, PAD)
    emitted[torch.arange(batch, device=device), n_accepted] = extra
    return emitted


def widened(values: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The values over their rows' sums (a scale comes with half values only), into ``out`` where given."""
    if scale is None:
        return values
    if out is None:
        return values.float() / scale
    # The same float32 quotient, written into reused rows: widened by a copy, then divided in float32 (a mixed
    # bf16/fp16-by-float32 division widens into a temporary first, one more pass over the rows).
    return out.copy_(values).div_(scale)


CHUNK_BYTES = 8 << 20  # a chunk of rows' working rows: in cache on the CPUs it runs on (L2 to L3)
REREAD = 16 * BLOCK  # from this many cells a row, a chosen block's cells are read again rather than kept
# From this many cells a row, a CPU builds each residual row where its two rows lie: a run of evenly spaced rows at a
# time where neither side is scaled and the runs average LONG_RUN cells or more (:meth:`Chain.run_by_run`; shorter ones
# are gathered), one at a time from ROW_BY_ROW cells where a half side is (each widening and division then spans the
# threads alone).
RUN_BY_RUN = 1 << 14
LONG_RUN = 1 << 17
ROW_BY_ROW = 1 << 16


class Chain:
    """The extra token's rows of one verification: row b's weights are max(0, p - q) at its first rejection
    (``rejected[b]``, p at ``n_accepted[b]`` and q at ``at_draft[b]``), or p at ``n_accepted[b]`` itself (the
    bonus), each value read widened and scaled as :func:`verify_at` says. The same arithmetic whether a row is
    built whole (:meth:`weights`) or only at the cells an inverse CDF asks for (:meth:`cells`)."""

    def __init__(self, draft_probs, target_probs, n_accepted, at_draft, rejected, scales) -> None:
        self.q, self.p = draft_probs, target_probs
        self.n_accepted, self.at_draft, self.rejected = n_accepted, at_draft, rejected
        self.rows = torch.arange(n_accepted.shape[0], device=n_accepted.device)
        q_scale, p_scale = scales if scales is not None else (None, None)
        # [B, 1] each row's scales: a bonus row (every draft accepted) is drawn from p alone, in which its scale
        # cancels, so it is left unscaled.
        self.p_scale = None if p_scale is None else torch.where(rejected[:, None], p_scale[self.rows, n_accepted], 1.0)
        self.q_scale = None if q_scale is None else q_scale[self.rows, at_draft]
        self.vocab = target_probs.shape[-1]
        # The weights' dtype: p's own, or float32 where p's values are widened and scaled.
        self.dtype = target_probs.dtype if self.p_scale is None else torch.float32
        self.unscaled = self.p_scale is None and self.q_scale is None

    def order(self) -> tuple[torch.Tensor, int]:
        """Every row, the rejected ones first (each in batch order), and how many are rejected: a few rows of it
        at a time then read q for a leading run of rows (no index add into the middle of a chunk)."""
        rejected = self.rejected.nonzero().flatten()
        if rejected.numel() in (0, self.rows.numel()):
            return self.rows, rejected.numel()
        return torch.cat([rejected, (~self.rejected).nonzero().flatten()]), rejected.numel()

    def weights(self, rows: torch.Tensor, rejected: int, room: Scratch | None = None) -> torch.Tensor:
        """[n, V] the weights of ``rows`` [n], the first ``rejected`` of them rejected rows and the rest bonus rows:
        this call's own rows (selected, or built in ``room``)."""
        if room is not None and self.unscaled and self.vocab >= RUN_BY_RUN:
            built = self.run_by_run(rows, rejected, room)
            if built is not None:
                return built
        elif room is not None and self.vocab >= ROW_BY_ROW:
            return self.row_by_row(rows, rejected, room)
        p_scale = None if self.p_scale is None else self.p_scale[rows]
        # Rooms are keyed by name and dtype: a half side's selected bits (int16) and its widened rows (float32) share
        # a name without sharing memory.
        p_next = widened(
            selected_rows(self.p, rows, self.n_accepted[rows], room, "p"),
            p_scale,
            None if room is None or p_scale is None else room.rows("p", rows.numel(), self.vocab),
        )
        # q is read only where a draft was rejected: a bonus row's residual is p itself.
        if rejected:
            head = rows[:rejected]
            q_scale = None if self.q_scale is None else self.q_scale[head]
            q_next = widened(
                selected_rows(self.q, head, self.at_draft[head], room, "q"),
                q_scale,
                None if room is None or q_scale is None else room.rows("q", rejected, self.vocab),
            )
            # In place: p_next is this call's own copy (selected rows, or widened ones).
            p_next[:rejected].sub_(q_next)
        return p_next.clamp_min_(0)

    def run_by_run(self, rows: torch.Tensor, rejected: int, room: Scratch) -> torch.Tensor | None:
        """:meth:`weights` for long unscaled rows that lie in long runs: a run of rows evenly spaced in both storages
        (rows rejected at the same position, as where a draft is far from the target) is one strided view a side, and
        each run's p - q is one operation written straight from where its rows lie (read once, nothing copied out
        first), which torch spreads over its threads. None where the runs are short (:data:`LONG_RUN` cells: rows
        rejected at scattered positions, at V = 32000): an operation a run then costs more than gathering the rows
        (:meth:`weights`), a copy of whole rows at a time into memory that stays in cache (B = 512, V = 32000,
        random drafts: 1.8-2.1x the copy floor gathered against 2.2-2.3x two rows a run at the usual bandwidth, 5.3
        against 9.7 ms in the machine's fast spells; at V = 128256 two rows a run take 1.6x and gathering 1.9x)."""
        positions, at_draft = self.n_accepted[rows], self.at_draft[rows]
        p_starts, q_starts = starts(self.p, rows, positions).tolist(), starts(self.q, rows, at_draft).tolist()
        runs = evenly_spaced_runs(p_starts, q_starts, rejected)
        if rows.numel() * self.vocab < len(runs) * LONG_RUN:
            return None
        out = room.rows("p", rows.numel(), self.vocab, self.dtype)
        for first, end in runs:
            p_run = run_view(self.p, p_starts, first, end)
            if first < rejected:
                torch.sub(p_run, run_view(self.q, q_starts, first, end), out=out[first:end])
            else:  # bonus rows: p itself
                out[first:end].copy_(p_run)
        return out.clamp_min_(0)

    def row_by_row(self, rows: torch.Tensor, rejected: int, room: Scratch) -> torch.Tensor:
        """:meth:`weights` for long rows with a half side: each row widened and scaled straight from where it lies
        (read once, nothing copied out first), then p - q, one row at a time (each widening and division then spans
        the threads alone)."""
        out = room.rows("p", rows.numel(), self.vocab, self.dtype)
        q_room = room.rows("q", 1, self.vocab, working_dtype(self.q))[0]
        positions, at_draft = self.n_accepted[rows], self.at_draft[rows]
        where = zip(rows.tolist(), positions.tolist(), at_draft.tolist(), strict=True)
        for i, (row, position, at) in enumerate(where):
            p_row, q_row = self.p[row, position], self.q[row, at]
            if i >= rejected:  # the bonus: p itself, widened, unscaled
                out[i].copy_(p_row)
            else:  # a half side: widened and scaled into the rows, then subtracted
                p_wide = out[i].copy_(p_row) if self.p_scale is None else widened(p_row, self.p_scale[row], out[i])
                p_wide.sub_(q_row if self.q_scale is None else widened(q_row, self.q_scale[row], q_room))
        return out.clamp_min_(0)

    def every_row(self) -> torch.Tensor:
        """[B, V] every row's weights, in batch order, in fresh memory."""
        order, rejected = self.order()
        weights = self.weights(order, rejected)
        return weights if order is self.rows else torch.empty_like(weights).index_copy_(0, order, weights)

    def fallback(self, which: torch.Tensor) -> torch.Tensor:
        """[n, V] p itself at rows ``which`` (scaled as for the residual): rounding emptied their residuals."""
        scale = None if self.p_scale is None else self.p_scale[which]
        return widened(selected_rows(self.p, which, self.n_accepted[which]), scale)

    def cells(self, block: torch.Tensor, cells: torch.Tensor, empty: torch.Tensor, any_empty: bool) -> torch.Tensor:
        """[B, width] every row's weights at its chosen ``block`` [B, 1] (``cells`` [B, width]), read from p and q
        where they lie: bit for bit the same values as :meth:`weights` and :meth:`fallback` give there (rows
        ``empty`` take the fallback)."""
        values = widened(cells_at(self.p, self.rows, self.n_accepted, block, cells), self.p_scale)
        which = (self.rejected & ~empty).nonzero().flatten()
        if which.numel():
            q_values = cells_at(self.q, which, self.at_draft[which], block[which], cells[which])
            q_values = widened(q_values, None if self.q_scale is None else self.q_scale[which])
            values[which] = (values[which] - q_values).to(values.dtype)
        return torch.where(~empty.unsqueeze(1), values.clamp_min(0), values) if any_empty else values.clamp_min_(0)

    def extra_tokens(self, v: torch.Tensor) -> torch.Tensor:
        """Every row's extra token by inverse CDF at its uniform ``v`` [B] (float64). The rows are built a few at
        a time (on a CPU into this thread's reused rows), so that their two rows and the weights stay in cache and no
        call allocates (and page-faults) a [B, V] tensor. Short rows are drawn from a chunk at a time, as built; long
        rows (a chosen block a small part of them) are reduced to their block sums a chunk at a time, and every row
        is drawn from its sums at once, the chosen block's cells read again from p and q, which saves the search's
        dozen small operations per chunk. The same arithmetic whatever the chunk."""
        batch = self.n_accepted.shape[0]
        room = SCRATCH if self.rows.device.type == "cpu" else None
        step = max(1, CHUNK_BYTES // (self.vocab * max(4, self.p.element_size())))
        order, rejected = self.order()
        permuted = order is not self.rows
        parts = [(order[start : start + step], min(max(rejected - start, 0), step)) for start in range(0, batch, step)]
        if len(parts) == 1 or self.vocab < REREAD:
            drawn = torch.cat([self.draw(rows, head, v[rows], room) for rows, head in parts])
            return torch.empty_like(drawn).index_copy_(0, order, drawn) if permuted else drawn
        sums = torch.cat([block_sums(self.weights(rows, head, room)) for rows, head in parts])
        if permuted:
            sums = torch.empty_like(sums).index_copy_(0, order, sums)
        return self.drawn_from_sums(sums, v)

    def drawn_from_sums(self, sums: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every row's extra token at its uniform ``v`` [B] from its weights' block sums ``sums`` [B, blocks]
        (:func:`~spectest.sampling.block_sums`, in batch order), the chosen block's cells read again from p and q."""
        # p != q at a rejection, so the residual has mass; rounding can still empty it: fall back to p. (A block sum
        # of non-negative cells is zero only where every cell is.)
        empty = (sums == 0).all(dim=-1)
        any_empty = bool(empty.any())
        if any_empty:
            which = empty.nonzero().flatten()
            sums[which] = block_sums(self.fallback(which))
        return inverse_cdf_at_blocks(
            sums, v, self.vocab, lambda block, cells: self.cells(block, cells, empty, any_empty)
        )

    def draw(self, rows: torch.Tensor, rejected: int, v: torch.Tensor, room: Scratch | None) -> torch.Tensor:
        """The extra tokens of ``rows`` (the first ``rejected`` of them rejected) at their uniforms ``v``, drawn
        from their weights as built (:meth:`weights`), p itself where rounding emptied a residual."""
        weights = self.weights(rows, rejected, room)
        sums = block_sums(weights)
        empty = (sums == 0).all(dim=-1)
        if bool(empty.any()):
            which = empty.nonzero().flatten()
            weights[which] = self.fallback(rows[which])
            sums[which] = block_sums(weights[which])
        return inverse_cdf_at_blocks(sums, v, self.vocab, lambda block, cells: weights.gather(1, cells))


class ExtraToken:
    """The extra token by inverse CDF at each row's own uniform ``v`` [B] (float64). Given to :func:`verify_at`, it
    lets the rows be built and drawn from a few at a time (:meth:`Chain.extra_tokens`); called on every row's
    weights it draws the same tokens (:func:`~spectest.sampling.inverse_cdf_blocked`)."""

    def __init__(self, v: torch.Tensor) -> None:
        self.v = v

    def __call__(self, weights: torch.Tensor) -> torch.Tensor:
        return inverse_cdf_blocked(weights, self.v)


class Scratch(threading.local):
    """Working rows reused from call to call, one set per thread (so that threads verifying at once never share
    them), on a CPU only (CUDA's caching allocator already reuses its blocks).

    A fresh tensor of a few megabytes is a fresh mapping on a CPU: glibc hands blocks above its mmap threshold back
    to the kernel when they are freed, and the next call's rows are page-faulted and zeroed again on first touch.
    At B = 64, K = 8, V = 32000 (float32) that was more than half of a verification's time. What is kept is at most
    a chunk of rows per name (:data:`CHUNK_BYTES`, or one row where a row is larger)."""

    def __init__(self) -> None:
        self.rooms: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def rows(self, name: str, count: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[count, width] rows of ``dtype``, uninitialised, shared with every earlier call of ``name`` here."""
        room = self.rooms.get((name, dtype))
        if room is None or room.numel() < count * width:
            room = self.rooms[(name, dtype)] = torch.empty(count * width, dtype=dtype)
        return room[: count * width].view(count, width)


SCRATCH = Scratch()


def cells_at(
    probs: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, cells: torch.Tensor
) -> torch.Tensor:
    """[n, width] ``probs[rows[i], positions[i], cells[i]]``, the cells [n, width] of block ``block[i]`` [n, 1]
    (clamped to the last cell past V). Where a row's cells are contiguous, every block is a row of one view of the
    storage (:func:`windows`) and the chosen ones are copied by one ``index_select`` (a quarter of the time of
    indexing the blocks' view by row, position and block, which took 5-10x less than indexing every cell); a row
    whose block is the short last one reads its cells one by one."""
    width = cells.shape[1]
    whole = probs.shape[2] // width
    chosen = block[:, 0].clamp(max=whole - 1)
    if probs.stride(2) == 1:  # each row's block is a window of the storage: one copy of whole blocks
        values = windows(probs, width).index_select(0, starts(probs, rows, positions) + chosen * width)
        values = values.view(probs.dtype)
    else:
        values = probs[..., : whole * width].unflatten(2, (whole, width))[rows, positions, chosen]
    if whole * width < probs.shape[2]:
        last = (block[:, 0] == whole).nonzero().flatten()
        if last.numel():
            values[last] = probs[rows[last].unsqueeze(1), positions[last].unsqueeze(1), cells[last]]
    return values


def windows(probs: torch.Tensor, width: int) -> torch.Tensor:
    """[n, width]: every run of ``width`` consecutive elements of ``probs``'s storage, the one starting at element i
    as row i (overlapping rows of one view; half values as 16-bit integers, which torch copies faster)."""
    bits = BITS.get(probs.dtype)
    flat = probs.view(bits) if bits is not None else probs
    count = flat.untyped_storage().nbytes() // flat.element_size() - width + 1
    return flat.as_strided((count, width), (1, 1), 0)


def starts(probs: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[n] where each row ``probs[rows[i], positions[i]]`` starts in the storage (in elements)."""
    stride = probs.stride()
    return rows * stride[0] + positions * stride[1] + probs.storage_offset()


def evenly_spaced_runs(p_starts: list[int], q_starts: list[int], rejected: int) -> list[tuple[int, int]]:
    """Rows ``[first, end)`` cut into runs, each one strided view a side: the rows' starts in p (and, for the first
    ``rejected`` rows, in q) rise by the same positive step within a run, and no run mixes rejected and bonus rows.
    Greedy from the first row: any two rising rows make a run, a third joins where it keeps both steps."""
    runs, first, count = [], 0, len(p_starts)
    while first < count:
        limit = rejected if first < rejected else count
        end = first + 1
        if end < limit:
            p_step = p_starts[end] - p_starts[first]
            q_step = q_starts[end] - q_starts[first] if first < rejected else 1
            if p_step > 0 and q_step > 0:
                end += 1
                while (
                    end < limit
                    and p_starts[end] - p_starts[end - 1] == p_step
                    and (first >= rejected or q_starts[end] - q_starts[end - 1] == q_step)
                ):
                    end += 1
        runs.append((first, end))
        first = end
    return runs


def run_view(probs: torch.Tensor, row_starts: list[int], first: int, end: int) -> torch.Tensor:
    """[end - first, V] the rows of ``probs`` starting at ``row_starts[first:end]`` in its storage (evenly spaced:
    :func:`evenly_spaced_runs`), as one view."""
    step = row_starts[first + 1] - row_starts[first] if end - first > 1 else 1
    return probs.as_strided((end - first, probs.shape[2]), (step, probs.stride(2)), row_starts[first])


def selected_rows(
    probs: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, room: Scratch | None = None, name: str = ""
) -> torch.Tensor:
    """``probs[rows[n], positions[n]]``: [N, V]. Where rows and positions share one stride pattern (any layout
    whose first two dimensions merge: contiguous, a vocabulary padded past its width, vocabulary-major) it is one
    ``index_select`` of whole rows, several times faster on a CPU than advanced indexing. With a ``room`` (CPU
    tensors only) the rows are written into its rows ``name``, which the next call with that name overwrites."""
    whole = merged(probs)
    if whole is not None:
        bits = BITS.get(probs.dtype)  # half rows are copied as 16-bit integers: torch's bf16 index_select is slow
        flat = rows * probs.shape[1] + positions
        if bits is not None:
            whole = whole.view(bits)
        if room is None:
            chosen = whole.index_select(0, flat)
        else:
            chosen = torch.index_select(whole, 0, flat, out=room.rows(name, flat.numel(), whole.shape[1], whole.dtype))
        return chosen if bits is None else chosen.view(probs.dtype)
    return probs[rows, positions]


def merged(probs: torch.Tensor) -> torch.Tensor | None:
    """[B * positions, V]: ``probs`` [B, positions, V] with its first two dimensions as one (row b's position i at
    b * positions + i), a view; None where they do not merge (a position-major layout)."""
    if probs.stride(0) != probs.shape[1] * probs.stride(1):
        return None
    return probs.as_strided((probs.shape[0] * probs.shape[1], probs.shape[2]), (probs.stride(1), probs.stride(2)))


def row_uniforms(
    params: SamplingParams, k: int, generator: torch.Generator, *, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance uniforms [B, K] and the extra token's uniform [B]. A row with a seed draws both
    from its own generator seeded at this call, so its output depends on nothing else in the batch."""
    batch = params.batch_size
    u = torch.rand((batch, k), generator=generator, device=device, dtype=dtype)
    v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float64)
    for row in (params.seed != NO_SEED).nonzero().flatten().tolist():
        own = make_generator(int(params.seed[row]), device)
        u[row] = torch.rand((k,), generator=own, device=device, dtype=dtype)
        v[row] = torch.rand((1,), generator=own, device=device, dtype=torch.float64)[0]
    return u, v
