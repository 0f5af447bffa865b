"""A fused Triton chain verifier, registered as ``reference-triton``: a custom kernel under the gate.

One program per row: the K acceptance tests (K gathered probabilities of p and q), then two
sweeps over the one V-long row pair that the extra token needs (the residual at the first
rejection, or the bonus row): the first sums it, the second finds the inverse-CDF cell. The
uniforms come from the caller's generator (drawn with torch on the device), so a printed seed
replays a run. bf16 and fp16 rows are read as they come and normalised by their row sums
(:mod:`spectest.gpu.chain_inputs` says how); float64 rows are worked on in float64. Runs on
CUDA; on a CPU, Triton's interpreter (``TRITON_INTERPRET=1``) runs the same kernel slowly, which
is how the harness's own tests exercise it without a GPU, and the compile gate
(:mod:`spectest.gpu.compile_gate`) compiles it for sm_80 and sm_90 without one: the interpreter
runs kernels the compiler rejects (module globals that are not ``tl.constexpr``, a variable that
is a scalar in one loop and a block in another).

Where a float32 or float64 batch has too few rows to fill a GPU (B = 64 on 132 SMs: 64 programs, each sweeping its
row pair twice), the same algorithm runs split in two launches (:func:`split_kernels`): a program per (row, slice)
sums its slice, then a program per row finds the slice from those sums and sweeps that slice alone.
:func:`slice_count` chooses the slices on CUDA (none under the interpreter unless asked); no GPU has timed it yet:
the GPU check's benchmark says whether it pays (half precision keeps the one-program kernel, whose row sums at every
tested position are sequential).

``BROKEN`` variants (residual from position 0, an id past V from the padded last tile, the
acceptance uniform reused for the extra token) are the deliberately buggy kernels the suite
must catch, in both forms.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from spectest.availability import missing
from spectest.gpu.chain_inputs import (
    BROKEN_VARIANTS,
    CORRECT,
    ID_PAST_V,
    KERNEL_DTYPES,
    PAST_V_TARGET,
    RESIDUAL_FROM_POSITION_0,
    UNIFORM_REUSED,
    chain_inputs,
    draw_uniforms,
)
from spectest.protocol import PAD

LARGEST_BLOCK = 1024  # the tile the sweeps read; smaller vocabularies get the next power of two (at least 16)
# The split kernels (split_kernels): programs in flight per SM they aim for where a batch has too few rows, and at
# most this many slices a row (the search kernel reads every slice's sums as one block of a power of two).
PROGRAMS_PER_SM = 4
MOST_SLICES = 64
# Triton's pointer types of the probability dtypes (for the compile gate's signatures).
POINTER_TYPES = {"float32": "*fp32", "float64": "*fp64", "bfloat16": "*bf16", "float16": "*fp16"}
# Launch options the gate compiles with too: no fused multiply-add, so that p Q - q P (half precision's residual)
# rounds exactly as the CuPy kernel's and the emulation's do, and a residual that is exactly zero stays zero.
COMPILE_OPTIONS = {"enable_fp_fusion": False}


def unavailable(*, interpreter_allowed: bool = True) -> str | None:
    """Why the Triton kernel cannot run here: no triton, or no CUDA GPU and (when ``interpreter_allowed``) no
    ``TRITON_INTERPRET=1``, under which Triton's interpreter runs it on the CPU."""
    if (reason := missing("triton")) is not None:
        return reason
    if interpreter_allowed and os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return missing("triton", gpu=True, hint="or TRITON_INTERPRET=1 to run its interpreter on the CPU")


def block_size(vocab: int, largest: int = LARGEST_BLOCK) -> int:
    """The sweeps' tile: the next power of two of V, at least 16 (tl.arange's smallest) and at most ``largest``."""
    return min(largest, max(16, 1 << (vocab - 1).bit_length()))


_KERNEL: Any = None
_SPLIT: Any = None  # (sums kernel, search kernel): split_kernels()
# @triton.jit helpers: Triton resolves a kernel's callees among its module's globals, so they live here.
row_sum: Any = None
cell_weights: Any = None
first_past: Any = None
PAST_V_CELL: Any = None  # PAST_V_TARGET as a tl.constexpr: a kernel may read no other kind of global
# triton.language, bound on first use: Triton 3.2 and 3.3 evaluate the kernels' annotations ("tl.constexpr", strings
# under `from __future__ import annotations`) among the module's globals.
tl: Any = None


def chain_kernel() -> Any:
    """The @triton.jit kernel, defined on first use, so that importing this module never imports triton."""
    global _KERNEL, row_sum, cell_weights, first_past, PAST_V_CELL, tl
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    PAST_V_CELL = tl.constexpr(PAST_V_TARGET)

    @triton.jit
    def row_sum(row, vocab, BLOCK: tl.constexpr):
        """A probability row's sum in float64 (half precision's normaliser)."""
        total = tl.zeros((), tl.float64)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            values = tl.load(row + offs, mask=offs < vocab, other=0.0)
            total += tl.sum(values.to(tl.float64), 0)
        return total

    @triton.jit
    def cell_weights(p_row, q_row, offs, vocab, read_q, p_scale, q_scale, PAST_V: tl.constexpr, WIDE: tl.constexpr):
        """(max(0, p * p_scale - q * q_scale), p) over one tile, in float64 (WIDE) or float32; q is read only
        when ``read_q``. The PAST_V variant also counts the cell at V, as if the padded tile had read p 0.05, q 0
        there."""
        p_raw = tl.load(p_row + offs, mask=offs < vocab, other=0.0)
        q_raw = tl.load(q_row + offs, mask=offs < tl.where(read_q, vocab, 0), other=0.0)
        if WIDE:
            p = p_raw.to(tl.float64)
            q = q_raw.to(tl.float64)
        else:
            p = p_raw.to(tl.float32)
            q = q_raw.to(tl.float32)
        if PAST_V:
            p = tl.where(offs == vocab, PAST_V_CELL, p)
            q = tl.where(offs == vocab, 0.0, q)
        return tl.maximum(p * p_scale - q * q_scale, 0.0), p

    @triton.jit
    def first_past(
        p_row, q_row, start, end, running, goal, vocab, read_q, p_scale, q_scale,
        BLOCK: tl.constexpr, PAST_V: tl.constexpr, WIDE: tl.constexpr,
    ):  # fmt: skip
        """Sweep 2 over cells [start, end) (``start`` an int32 tensor, ``running`` the float64 mass before it): the
        first cell whose cumulative mass exceeds ``goal`` (never a zero cell), tile by tile up to the tile that holds
        it; past the last tile (a float64 sum's last bit), the last positive cell; -1 where none has weight."""
        found = tl.full((), -1, tl.int64)
        last_positive = tl.full((), -1, tl.int64)
        while (start < end) & (found < 0):
            offs = start + tl.arange(0, BLOCK)
            start += BLOCK
            weights, _ = cell_weights(p_row, q_row, offs, vocab, read_q, p_scale, q_scale, PAST_V, WIDE)
            wide_weights = weights.to(tl.float64)
            cumulative = running + tl.cumsum(wide_weights, 0)
            hit = (cumulative > goal) & (wide_weights > 0)
            first = tl.min(tl.where(hit, offs, 2**30), 0).to(tl.int64)
            found = tl.where((found < 0) & (first < 2**30), first, found)
            last_positive = tl.maximum(last_positive, tl.max(tl.where(wide_weights > 0, offs, -1), 0).to(tl.int64))
            running += tl.sum(wide_weights, 0)
        return tl.where(found >= 0, found, last_positive)

    @triton.jit
    def chain(
        drafts,
        q_ptr,
        p_ptr,
        u_ptr,
        v_ptr,
        out,
        vocab,
        d_row,
        d_pos,
        q_row,
        q_pos,
        p_row,
        p_pos,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
        RESIDUAL_FROM_0: tl.constexpr,
        PAST_V: tl.constexpr,
        REUSE_U: tl.constexpr,
        HALF: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        accepted = tl.full((), 0, tl.int32)
        going = tl.full((), 1, tl.int32)
        # Row sums of the pair the residual is taken from (half precision's normalisers; 1 otherwise).
        p_sum_at = tl.full((), 1.0, tl.float64)
        q_sum_at = tl.full((), 1.0, tl.float64)
        for i in tl.static_range(K):
            d = tl.load(drafts + row * d_row + i * d_pos)
            valid = (d >= 0) & (d < vocab)  # an id outside [0, V) is rejected, never read
            p_at = p_ptr + row * p_row + i * p_pos
            q_at = q_ptr + row * q_row + i * q_pos
            p_d = tl.load(p_at + d, mask=valid, other=0.0)
            q_d = tl.load(q_at + d, mask=valid, other=0.0)
            u = tl.load(u_ptr + row * K + i)
            if HALF:
                p_sum = tl.full((), 1.0, tl.float64)
                q_sum = tl.full((), 1.0, tl.float64)
                if going > 0:  # a position's rows are summed only when it is tested
                    p_sum = row_sum(p_at, vocab, BLOCK)
                    q_sum = row_sum(q_at, vocab, BLOCK)
                accept = u.to(tl.float64) * q_d.to(tl.float64) * p_sum < p_d.to(tl.float64) * q_sum
                if RESIDUAL_FROM_0:
                    if i == 0:
                        p_sum_at = p_sum
                        q_sum_at = q_sum
                else:
                    rejected_here = (going > 0) & (accept == 0)
                    p_sum_at = tl.where(rejected_here, p_sum, p_sum_at)
                    q_sum_at = tl.where(rejected_here, q_sum, q_sum_at)
            elif WIDE:
                accept = u.to(tl.float64) * q_d.to(tl.float64) < p_d.to(tl.float64)
            else:
                accept = u * q_d.to(tl.float32) < p_d.to(tl.float32)
            going = going * (accept & valid).to(tl.int32)
            accepted += going
            tl.store(out + row * (K + 1) + i, tl.where(going > 0, d, -1))
        rejected = accepted < K
        position = accepted
        if RESIDUAL_FROM_0:
            position = accepted * 0
        p_next = p_ptr + row * p_row + position * p_pos  # the one row pair the extra token needs
        q_next = q_ptr + row * q_row + tl.minimum(position, K - 1) * q_pos  # read only after a rejection
        # Residual weights max(0, p Q - q P) (P = Q = 1 unless half precision); the bonus and the fallback: p.
        if WIDE:
            p_scale = tl.where(rejected, q_sum_at, 1.0)
            q_scale = tl.where(rejected, p_sum_at, 0.0)
        else:
            p_scale = tl.where(rejected, q_sum_at.to(tl.float32), 1.0)
            q_scale = tl.where(rejected, p_sum_at.to(tl.float32), 0.0)
        cells = vocab + 1 if PAST_V else vocab
        # Sweep 1: the weights' total (and p's, the fallback if rounding emptied the residual).
        residual_total = tl.zeros((), tl.float64)
        p_total = tl.zeros((), tl.float64)
        for start in range(0, cells, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            weights, p = cell_weights(p_next, q_next, offs, vocab, rejected, p_scale, q_scale, PAST_V, WIDE)
            residual_total += tl.sum(weights.to(tl.float64), 0)
            p_total += tl.sum(p.to(tl.float64), 0)
        use_p = residual_total <= 0
        read_q = rejected & (use_p == 0)
        p_scale = tl.where(use_p, 1.0, p_scale)
        q_scale = tl.where(use_p, 0.0, q_scale)
        total = tl.where(use_p, p_total, residual_total)
        if REUSE_U and K > 0:
            v = tl.load(u_ptr + row * K + tl.minimum(accepted, K - 1)).to(tl.float64)
        else:
            v = tl.load(v_ptr + row)
        goal = v * total
        # Sweep 2, over the whole row.
        start = tl.full((), 0, tl.int32)
        running = tl.zeros((), tl.float64)
        extra = first_past(
            p_next, q_next, start, cells, running, goal, vocab, read_q, p_scale, q_scale, BLOCK, PAST_V, WIDE
        )
        tl.store(out + row * (K + 1) + accepted, extra)

    _KERNEL = chain
    return chain


def split_kernels() -> tuple[Any, Any]:
    """The split form of :func:`chain_kernel` for float32 and float64 rows, defined on first use: ``chain_sums``, a
    program per (row, slice), sums its slice of the row pair's weights (the residual's, and p's for the fallback);
    ``chain_search``, a program per row, finds the slice whose running sum passes the goal from those sums, then the
    cell within that slice alone. Where a batch has fewer rows than the GPU has programs in flight (B = 64 on an H100
    or H200: 64 programs on 132 SMs, each sweeping the row pair twice), the row's reading is then spread over many
    programs, and the second sweep reads one slice, not the row. The same tiles are summed (each slice a whole number
    of tiles), in another grouping: float64 sums' last bits apart, it is the one-program kernel's draw."""
    global _SPLIT
    if _SPLIT is not None:
        return _SPLIT
    chain_kernel()  # binds tl and cell_weights, which these kernels call
    import triton

    @triton.jit
    def chain_sums(
        drafts,
        q_ptr,
        p_ptr,
        u_ptr,
        out,
        counts,
        partial,
        vocab,
        slice_cells,
        d_row,
        d_pos,
        q_row,
        q_pos,
        p_row,
        p_pos,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
        RESIDUAL_FROM_0: tl.constexpr,
        PAST_V: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        accepted = tl.full((), 0, tl.int32)
        going = tl.full((), 1, tl.int32)
        for i in tl.static_range(K):
            d = tl.load(drafts + row * d_row + i * d_pos)
            valid = (d >= 0) & (d < vocab)  # an id outside [0, V) is rejected, never read
            p_d = tl.load(p_ptr + row * p_row + i * p_pos + d, mask=valid, other=0.0)
            q_d = tl.load(q_ptr + row * q_row + i * q_pos + d, mask=valid, other=0.0)
            u = tl.load(u_ptr + row * K + i)
            if WIDE:
                accept = u.to(tl.float64) * q_d.to(tl.float64) < p_d.to(tl.float64)
            else:
                accept = u * q_d.to(tl.float32) < p_d.to(tl.float32)
            going = going * (accept & valid).to(tl.int32)
            accepted += going
            if part == 0:
                tl.store(out + row * (K + 1) + i, tl.where(going > 0, d, -1))
        if part == 0:
            tl.store(counts + row, accepted)
        rejected = accepted < K
        position = accepted
        if RESIDUAL_FROM_0:
            position = accepted * 0
        p_next = p_ptr + row * p_row + position * p_pos
        q_next = q_ptr + row * q_row + tl.minimum(position, K - 1) * q_pos  # read only after a rejection
        if WIDE:
            q_scale = tl.where(rejected, 1.0, 0.0).to(tl.float64)
            p_scale = tl.full((), 1.0, tl.float64)
        else:
            q_scale = tl.where(rejected, 1.0, 0.0).to(tl.float32)
            p_scale = tl.full((), 1.0, tl.float32)
        cells = vocab + 1 if PAST_V else vocab
        residual_total = tl.zeros((), tl.float64)
        p_total = tl.zeros((), tl.float64)
        first = part * slice_cells
        for start in range(first, tl.minimum(first + slice_cells, cells), BLOCK):
            offs = start + tl.arange(0, BLOCK)
            weights, p = cell_weights(p_next, q_next, offs, vocab, rejected, p_scale, q_scale, PAST_V, WIDE)
            residual_total += tl.sum(weights.to(tl.float64), 0)
            p_total += tl.sum(p.to(tl.float64), 0)
        tl.store(partial + (row * parts + part) * 2, residual_total)
        tl.store(partial + (row * parts + part) * 2 + 1, p_total)

    @triton.jit
    def chain_search(
        q_ptr,
        p_ptr,
        u_ptr,
        v_ptr,
        out,
        counts,
        partial,
        vocab,
        slice_cells,
        parts,
        q_row,
        q_pos,
        p_row,
        p_pos,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
        SLICES: tl.constexpr,
        RESIDUAL_FROM_0: tl.constexpr,
        PAST_V: tl.constexpr,
        REUSE_U: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        accepted = tl.load(counts + row)
        rejected = accepted < K
        position = accepted
        if RESIDUAL_FROM_0:
            position = accepted * 0
        p_next = p_ptr + row * p_row + position * p_pos
        q_next = q_ptr + row * q_row + tl.minimum(position, K - 1) * q_pos
        slices = tl.arange(0, SLICES)
        inside = slices < parts
        residual = tl.load(partial + (row * parts + slices) * 2, mask=inside, other=0.0)
        p_sums = tl.load(partial + (row * parts + slices) * 2 + 1, mask=inside, other=0.0)
        use_p = tl.sum(residual, 0) <= 0  # rounding emptied the residual: p itself
        sums = tl.where(use_p, p_sums, residual)
        total = tl.sum(sums, 0)
        read_q = rejected & (use_p == 0)
        if WIDE:
            q_scale = tl.where(read_q, 1.0, 0.0).to(tl.float64)
            p_scale = tl.full((), 1.0, tl.float64)
        else:
            q_scale = tl.where(read_q, 1.0, 0.0).to(tl.float32)
            p_scale = tl.full((), 1.0, tl.float32)
        if REUSE_U and K > 0:
            v = tl.load(u_ptr + row * K + tl.minimum(accepted, K - 1)).to(tl.float64)
        else:
            v = tl.load(v_ptr + row)
        goal = v * total
        # The slice whose running sum first passes the goal (one with weight); past the last (a float64 sum's last
        # bit), the last slice with weight, whose sweep then ends at its last positive cell.
        cumulative = tl.cumsum(sums, 0)
        passed = tl.min(tl.where((cumulative > goal) & (sums > 0), slices, SLICES), 0)
        last = tl.max(tl.where(sums > 0, slices, -1), 0)
        chosen = tl.where(passed < SLICES, passed, last)
        running = tl.sum(tl.where(slices < chosen, sums, 0.0), 0)
        cells = vocab + 1 if PAST_V else vocab
        start = tl.maximum(chosen, 0) * slice_cells
        end = tl.where(chosen >= 0, tl.minimum(start + slice_cells, cells), start)
        extra = first_past(
            p_next, q_next, start, end, running, goal, vocab, read_q, p_scale, q_scale, BLOCK, PAST_V, WIDE
        )
        tl.store(out + row * (K + 1) + accepted, extra)

    _SPLIT = (chain_sums, chain_search)
    return _SPLIT


def constexprs(k: int, block: int, bug: int, dtype: str) -> dict[str, int | bool]:
    """The kernel's compile-time arguments for one launch (the compile gate compiles the same ones)."""
    return {
        "K": k,
        "BLOCK": block,
        "RESIDUAL_FROM_0": bug == RESIDUAL_FROM_POSITION_0,
        "PAST_V": bug == ID_PAST_V,
        "REUSE_U": bug == UNIFORM_REUSED,
        "HALF": dtype in ("bfloat16", "float16"),
        "WIDE": dtype == "float64",
    }


def split_constexprs(k: int, block: int, bug: int, dtype: str, slices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The split kernels' compile-time arguments, ``chain_sums``'s then ``chain_search``'s, for one launch (the
    compile gate compiles the same ones)."""
    flags = constexprs(k, block, bug, dtype)
    common = {name: flags[name] for name in ("K", "BLOCK", "RESIDUAL_FROM_0", "PAST_V", "WIDE")}
    return common, {**common, "SLICES": max(16, 1 << (slices - 1).bit_length()), "REUSE_U": flags["REUSE_U"]}


def signature(dtype: str) -> dict[str, str]:
    """The runtime arguments' Triton types for ``dtype`` probabilities (the int arguments as int32, which is how
    Triton specialises them below 2**31)."""
    probs = POINTER_TYPES[dtype]
    uniforms = "*fp64" if dtype == "float64" else "*fp32"
    pointers = {"drafts": "*i64", "q_ptr": probs, "p_ptr": probs, "u_ptr": uniforms, "v_ptr": "*fp64", "out": "*i64"}
    ints = {name: "i32" for name in ("vocab", "d_row", "d_pos", "q_row", "q_pos", "p_row", "p_pos")}
    return {**pointers, **ints}


def slice_count(batch: int, cells: int, block: int, device: torch.device) -> int:
    """Slices a row for :func:`split_kernels` (1: the one-program kernel): on CUDA, enough that B x slices programs
    fill :data:`PROGRAMS_PER_SM` per SM, at most a tile a slice and :data:`MOST_SLICES`; elsewhere (Triton's
    interpreter) 1. Not yet measured on a GPU: the GPU check's benchmark is what says whether it pays."""
    if device.type != "cuda" or batch == 0:
        return 1
    processors = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = -(-cells // block)
    return max(1, min(tiles, -(-PROGRAMS_PER_SM * processors // batch), MOST_SLICES))


def split_launch(slices: int, cells: int, block: int) -> tuple[int, int]:
    """(slices, cells a slice) for ``slices`` asked: every slice a whole number of tiles and none empty."""
    tiles = -(-cells // block)
    per_slice = -(-tiles // max(1, min(slices, tiles)))
    return -(-tiles // per_slice), per_slice * block


def split_signatures(dtype: str) -> tuple[dict[str, str], dict[str, str]]:
    """The split kernels' runtime arguments' Triton types for ``dtype`` probabilities (as :func:`signature`)."""
    probs = POINTER_TYPES[dtype]
    uniforms = "*fp64" if dtype == "float64" else "*fp32"
    buffers = {"out": "*i64", "counts": "*i32", "partial": "*fp64"}
    sums = {"drafts": "*i64", "q_ptr": probs, "p_ptr": probs, "u_ptr": uniforms, **buffers}
    sums |= {name: "i32" for name in ("vocab", "slice_cells", "d_row", "d_pos", "q_row", "q_pos", "p_row", "p_pos")}
    search = {"q_ptr": probs, "p_ptr": probs, "u_ptr": uniforms, "v_ptr": "*fp64", **buffers}
    search |= {name: "i32" for name in ("vocab", "slice_cells", "parts", "q_row", "q_pos", "p_row", "p_pos")}
    return sums, search


def sums_kernel() -> Any:
    """``chain_sums`` of :func:`split_kernels` (the compile gate's handle on it)."""
    return split_kernels()[0]


def search_kernel() -> Any:
    """``chain_search`` of :func:`split_kernels` (the compile gate's handle on it)."""
    return split_kernels()[1]


class TritonReference:
    """The chain verifier as one fused Triton kernel, or for float32 and float64 rows in a batch too small to fill
    the GPU, as the two split kernels (:func:`split_kernels`; see the module docstring). ``slices`` fixes how many
    slices a row the split kernels take (1: the one-program kernel); by default :func:`slice_count` chooses."""

    spectest_capabilities = frozenset({"standard-rejection"})
    spectest_dtypes = KERNEL_DTYPES

    def __init__(self, bug: int = CORRECT, block: int = LARGEST_BLOCK, slices: int | None = None) -> None:
        self.bug = bug
        self.block = block
        self.slices = slices

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        drafts, q, p = chain_inputs(draft_token_ids, draft_probs, target_probs)
        batch, k = drafts.shape
        vocab = p.shape[-1]
        u, v = draw_uniforms(batch, k, p.dtype, generator, drafts.device)
        out = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=drafts.device)
        if batch == 0:
            return out
        dtype = str(p.dtype).removeprefix("torch.")
        block = block_size(vocab, self.block)
        cells = vocab + 1 if self.bug == ID_PAST_V else vocab
        asked = self.slices if self.slices is not None else slice_count(batch, cells, block, drafts.device)
        if asked > 1 and dtype in ("float32", "float64"):
            self.split(drafts, q, p, u, v, out, block, *split_launch(asked, cells, block))
            return out
        chain_kernel()[(batch,)](
            drafts,
            q,
            p,
            u,
            v,
            out,
            vocab,
            drafts.stride(0),
            drafts.stride(1),
            q.stride(0),
            q.stride(1),
            p.stride(0),
            p.stride(1),
            **constexprs(k, block, self.bug, dtype),
            **COMPILE_OPTIONS,
        )
        return out

    def split(self, drafts, q, p, u, v, out, block: int, slices: int, slice_cells: int) -> None:
        """The split kernels' two launches: sums a (row, slice), then the search a row."""
        batch, k = drafts.shape
        sums, search = split_kernels()
        counts = torch.empty((batch,), dtype=torch.int32, device=drafts.device)
        partial = torch.empty((batch, slices, 2), dtype=torch.float64, device=drafts.device)
        sums_flags, search_flags = split_constexprs(k, block, self.bug, str(p.dtype).removeprefix("torch."), slices)
        sums[(batch, slices)](
            drafts, q, p, u, out, counts, partial, p.shape[-1], slice_cells,
            drafts.stride(0), drafts.stride(1), q.stride(0), q.stride(1), p.stride(0), p.stride(1),
            **sums_flags, **COMPILE_OPTIONS,
        )  # fmt: skip
        search[(batch,)](
            q, p, u, v, out, counts, partial, p.shape[-1], slice_cells, slices,
            q.stride(0), q.stride(1), p.stride(0), p.stride(1),
            **search_flags, **COMPILE_OPTIONS,
        )  # fmt: skip


TRITON_REFERENCE = TritonReference()
# Deliberately broken kernels: each must fail the suite.
BROKEN = {name: TritonReference(bug) for name, bug in BROKEN_VARIANTS.items()}
residual_from_position_0 = BROKEN["residual_from_position_0"]
id_past_v = BROKEN["id_past_v"]
uniform_reused = BROKEN["uniform_reused"]
