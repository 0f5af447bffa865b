"""A planted compile error for the compile gate: the Triton kernel as it reached a GPU before the gate existed.

The kernel of spectest/gpu/triton.py at commit 5477f1e, verbatim (``_kernel``): Triton's interpreter ran it
in every CI run, and on an H200 (Triton 3.6) its compile stopped at ``NameError: Cannot access global
variable RESIDUAL_FROM_POSITION_0 from within @jit'ed function`` (module globals a kernel reads must be
``tl.constexpr``). With that worked around (``with_constexpr_globals``) the compiler's next stop was
``Loop-carried variable p has initial type fp32 but is re-assigned to <['1024'], fp32> in loop`` (``p`` a
scalar in the K loop and a block in the sweeps). tests/test_compile_gate.py holds the gate to both messages.
"""

from __future__ import annotations

from typing import Any

CORRECT, RESIDUAL_FROM_POSITION_0, ID_PAST_V, UNIFORM_REUSED = 0, 1, 2, 3


def with_constexpr_globals() -> Any:
    """The same kernel with its module globals made ``tl.constexpr`` (the first error worked around)."""
    import triton.language as tl

    global CORRECT, RESIDUAL_FROM_POSITION_0, ID_PAST_V, UNIFORM_REUSED
    CORRECT, RESIDUAL_FROM_POSITION_0, ID_PAST_V, UNIFORM_REUSED = (tl.constexpr(n) for n in (0, 1, 2, 3))
    return _kernel()


_KERNEL: Any = None
row_block: Any = None  # a @triton.jit helper; Triton resolves callees among module globals


def _kernel() -> Any:
    """Compile-on-first-use, so that importing this module never imports triton."""
    global _KERNEL, row_block
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def row_block(p_next, q_next, offs, vocab, BUG: tl.constexpr):
        """One block of the row pair (float32); the ID_PAST_V variant also reads the cell past the row."""
        inside = offs < (vocab + 1 if BUG == ID_PAST_V else vocab)
        p = tl.load(p_next + offs, mask=inside, other=0.0).to(tl.float32)
        q = tl.load(q_next + offs, mask=inside, other=0.0).to(tl.float32)
        if BUG == ID_PAST_V:
            p = tl.where(offs == vocab, 0.05, p)  # the padded cell reads memory past the row
            q = tl.where(offs == vocab, 0.0, q)
        return p, q

    @triton.jit
    def chain(
        drafts,
        q_ptr,
        p_ptr,
        u_ptr,
        v_ptr,
        out,
        vocab,
        q_row,
        q_pos,
        p_row,
        p_pos,
        K: tl.constexpr,
        BLOCK: tl.constexpr,
        BUG: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        accepted = tl.full((), 0, tl.int32)
        going = tl.full((), 1, tl.int32)
        for i in tl.static_range(K):
            d = tl.load(drafts + row * K + i)
            p = tl.load(p_ptr + row * p_row + i * p_pos + d).to(tl.float32)
            q = tl.load(q_ptr + row * q_row + i * q_pos + d).to(tl.float32)
            u = tl.load(u_ptr + row * K + i)
            going = going * (u * q < p).to(tl.int32)
            accepted += going
            tl.store(out + row * (K + 1) + i, tl.where(going > 0, d, -1))
        rejected = accepted < K
        position = accepted if BUG != RESIDUAL_FROM_POSITION_0 else accepted * 0
        q_position = tl.minimum(position, K - 1)
        scale = rejected.to(tl.float32)
        p_next = p_ptr + row * p_row + position * p_pos  # the one row pair the extra token needs
        q_next = q_ptr + row * q_row + q_position * q_pos
        # Sweep 1: mass of the residual (and of p, the fallback if rounding emptied the residual).
        residual_total = tl.zeros((), tl.float64)
        p_total = tl.zeros((), tl.float64)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p, q = row_block(p_next, q_next, offs, vocab, BUG)
            residual_total += tl.sum(tl.maximum(p - scale * q, 0.0).to(tl.float64), 0)
            p_total += tl.sum(p.to(tl.float64), 0)
        use_p = residual_total <= 0
        scale = tl.where(use_p, 0.0, scale)
        total = tl.where(use_p, p_total, residual_total)
        if BUG == UNIFORM_REUSED:
            v = tl.load(u_ptr + row * K + tl.minimum(accepted, K - 1)).to(tl.float64)
        else:
            v = tl.load(v_ptr + row)
        goal = v * total
        # Sweep 2: the first cell whose cumulative mass exceeds the goal (never a zero cell).
        running = tl.zeros((), tl.float64)
        found = tl.full((), -1, tl.int64)
        last_positive = tl.full((), -1, tl.int64)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p, q = row_block(p_next, q_next, offs, vocab, BUG)
            w = tl.maximum(p - scale * q, 0.0).to(tl.float64)
            cumulative = running + tl.cumsum(w, 0)
            hit = (cumulative > goal) & (w > 0)
            first = tl.min(tl.where(hit, offs, 2**30), 0).to(tl.int64)
            found = tl.where((found < 0) & (first < 2**30), first, found)
            last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, offs, -1), 0).to(tl.int64))
            running += tl.sum(w, 0)
        extra = tl.where(found >= 0, found, last_positive)
        tl.store(out + row * (K + 1) + accepted, extra)

    _KERNEL = chain
    return chain
