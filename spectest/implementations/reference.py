"""The reference sampler: modified rejection sampling, vectorised over rows and positions.

It reads only what a verifier must: the K draft-token probabilities of p and q per row, and the
two V-long rows that the one extra token needs (the residual at the first rejection, or the
bonus row). No Python loop over rows or positions.

The registered ``reference`` model, ``REFERENCE`` in :mod:`spectest.implementations.sampler` (declared there so that
resolving it imports no torch), carries every optional capability: the chain ``verify``, ``verify_logits`` with
per-row sampling parameters and per-row seeds, and ``propose``. ``verify`` is also usable on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from spectest.protocol import PAD
from spectest.sampling import BITS, inverse_cdf_blocked, make_generator
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
CHUNK_BYTES = 4 << 20  # a chunk of rows' working rows: in cache on the CPUs it runs on (L2 to L3)
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
    """[N, 1] float32 sums of the half rows ``probs[rows[n], positions[n]]``, a few rows at a time. Where a row
    alone fills a chunk (large vocabularies) each is summed where it lies, not copied out first."""
    step = max(1, SUM_CHUNK // probs.shape[-1])
    if step == 1:
        return float_sums(
            probs[row, position].unsqueeze(0) for row, position in zip(rows.tolist(), positions.tolist(), strict=True)
        )
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


def verify_at(draft_token_ids, draft_probs, target_probs, u, sample, lengths=None, scales=None) -> torch.Tensor:
    """The chain with acceptance uniforms ``u`` [B, K] given, and ``sample(weights)`` drawing the
    extra token; ``lengths`` [B]: drafts per row (default K); ``scales``: (q, p) row sums [B, K, 1]
    and [B, K + 1, 1] of unnormalised half inputs: every value read is widened to float32 and divided
    by its row's sum (what :func:`working_precision` gives, without widening the untouched rows), but for a
    bonus row's, only widened: it is drawn from p alone, in which its scale cancels.

    ``sample`` may be a :class:`ExtraToken` (the rows' own uniforms): the extra tokens are then drawn a few rows
    at a time; any other callable gets every row's weights at once."""
    chunked = isinstance(sample, ExtraToken)
    if not chunked:
        whole = sample
        sample = lambda weights, part: whole(weights)  # noqa: E731
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    # -1 padding past a short row is never read as a token (and costs nothing when no row is short).
    ids = (draft_token_ids if lengths is None else draft_token_ids.clamp_min(0)).unsqueeze(-1)
    q_scale, p_scale = scales if scales is not None else (None, None)

    def widened(values: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The values over their rows' sums (a scale comes with half values only), into ``out`` where given."""
        if scale is None:
            return values
        if out is None:
            return values.float() / scale
        # The same float32 quotient, written into reused rows: widened by a copy, then divided in float32 (a mixed
        # bf16/fp16-by-float32 division widens into a temporary first, one more pass over the rows).
        return out.copy_(values).div_(scale)

    p_draft = widened(target_probs[:, :k].gather(-1, ids), None if p_scale is None else p_scale[:, :k]).squeeze(-1)
    q_draft = widened(draft_probs.gather(-1, ids), q_scale).squeeze(-1)
    # u < p/q without a division: exact when p >= q (always accepted) and when q = 0.
    accepted = u * q_draft < p_draft
    if lengths is not None:
        accepted &= torch.arange(k, device=device) < lengths.unsqueeze(1)
    n_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    drafted = torch.full_like(n_accepted, k) if lengths is None else lengths

    rows = torch.arange(batch, device=device)
    at_draft = n_accepted.clamp(max=k - 1)
    rejected = n_accepted < drafted

    def extra_tokens(part: slice) -> torch.Tensor:
        """The extra token of the rows in ``part``: from the residual after a rejection, from p itself (the bonus)
        when every draft was accepted."""
        accepted_here, at_here, local = n_accepted[part], at_draft[part], rows[part] - part.start
        rejected_here = rejected[part].unsqueeze(-1)
        # A bonus row (every draft accepted) is drawn from p alone, in which its scale cancels: it is left unscaled.
        p_next_scale = None if p_scale is None else torch.where(rejected_here, p_scale[part][local, accepted_here], 1.0)
        # Rooms are keyed by name and dtype: a half side's selected bits (int16) and its widened rows (float32) share
        # a name without sharing memory.
        p_next = widened(
            rows_at(target_probs[part], accepted_here, room, "p"),
            p_next_scale,
            None if room is None or p_next_scale is None else room.rows("p", p_next_scale.shape[0], vocab),
        )
        # q is read only where a draft was rejected: a bonus row's residual is p itself.
        which = rejected_here.flatten().nonzero().flatten()
        if which.numel():
            q_next_scale = None if q_scale is None else q_scale[part][which, at_here[which]]
            q_next = widened(
                selected_rows(draft_probs[part], which, at_here[which], room, "q"),
                q_next_scale,
                None if room is None or q_next_scale is None else room.rows("q", which.numel(), vocab),
            )
            # In place: p_next is this call's own copy (selected rows, or widened ones). p + (-1) q is p - q exactly.
            if which.numel() == p_next.shape[0]:
                p_next.sub_(q_next)
            else:
                p_next.index_add_(0, which, q_next, alpha=-1)
        residual = p_next.clamp_min_(0)
        # p != q at a rejection, so the residual has mass; rounding can still empty it: fall back to p.
        empty = residual.amax(dim=-1) <= 0
        if bool(empty.any()):
            residual[empty] = widened(rows_at(target_probs[part], accepted_here), p_next_scale)[empty]
        return sample(residual, part)

    # A few rows at a time, so that their two rows and the residual stay in cache and no call allocates (and
    # page-faults) a [B, V] tensor: the same arithmetic, row by row, whatever the chunk.
    vocab = target_probs.shape[-1]
    row_bytes = vocab * max(4, target_probs.element_size())
    # Into this thread's reused rows where the rows are drawn here and nothing keeps them (chunked): p_next is
    # written in place, so every row it holds must be this call's own.
    room = SCRATCH if chunked and device.type == "cpu" else None
    step = max(1, CHUNK_BYTES // row_bytes) if chunked else batch
    if step >= batch:
        extra = extra_tokens(slice(0, batch))
    else:
        extra = torch.cat([extra_tokens(slice(start, min(batch, start + step))) for start in range(0, batch, step)])

    slots = torch.arange(k + 1, device=device)
    emitted = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=device)
    emitted[:, :k] = torch.where(slots[:k] < n_accepted.unsqueeze(1), draft_token_ids, PAD)
    emitted[rows, n_accepted] = extra
    return emitted


class ExtraToken:
    """The extra token by inverse CDF at each row's own uniform ``v`` [B] (float64): callable on any rows' weights
    with the rows they are (a slice), so :func:`verify_at` can draw a few rows at a time."""

    def __init__(self, v: torch.Tensor) -> None:
        self.v = v

    def __call__(self, weights: torch.Tensor, part: slice) -> torch.Tensor:
        return inverse_cdf_blocked(weights, self.v[part])


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


def rows_at(probs: torch.Tensor, positions: torch.Tensor, room: Scratch | None = None, name: str = "") -> torch.Tensor:
    """``probs[b, positions[b]]`` for every row b: [B, V] (see :func:`selected_rows`)."""
    return selected_rows(probs, torch.arange(probs.shape[0], device=probs.device), positions, room, name)


def selected_rows(
    probs: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, room: Scratch | None = None, name: str = ""
) -> torch.Tensor:
    """``probs[rows[n], positions[n]]``: [N, V]. Where rows and positions share one stride pattern (any layout
    whose first two dimensions merge: contiguous, a vocabulary padded past its width, vocabulary-major) it is one
    ``index_select`` of whole rows, several times faster on a CPU than advanced indexing. With a ``room`` (CPU
    tensors only) the rows are written into its rows ``name``, which the next call with that name overwrites."""
    batch, width = probs.shape[0], probs.shape[1]
    if probs.stride(0) == width * probs.stride(1):
        merged = probs.as_strided((batch * width, probs.shape[2]), (probs.stride(1), probs.stride(2)))
        bits = BITS.get(probs.dtype)  # half rows are copied as 16-bit integers: torch's bf16 index_select is slow
        flat = rows * width + positions
        if bits is not None:
            merged = merged.view(bits)
        if room is None:
            chosen = merged.index_select(0, flat)
        else:
            chosen = torch.index_select(
                merged, 0, flat, out=room.rows(name, flat.numel(), merged.shape[1], merged.dtype)
            )
        return chosen if bits is None else chosen.view(probs.dtype)
    return probs[rows, positions]


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
