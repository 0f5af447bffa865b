"""Small Triton kernels that exercise what the batched interpreter must get exactly right (tests/test_interpreter.py):
every way the programs of a launch can part (if/else, while, for over a range each program bounds itself, an early
return, ``and``/``or``/``not``, a conditional expression), the running maximum and inverse-CDF search over vocabulary
tiles that samplers use, reductions and scans along either axis of a 2-D block, a name bound to blocks of different
shapes in the two branches, an atomic (which has no batched form: the launch runs program by program), and a tile
far wider than the vocabulary, loaded with every kind of fill (the tailed blocks of spectest.gpu.tails).

Kernels are defined on first use (:func:`kernels`), so importing this module never imports triton.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

_KERNELS: Any = None
tl: Any = None
helper: Any = None  # a @triton.jit helper: Triton finds a kernel's callees among its module's globals


def kernels() -> SimpleNamespace:
    global _KERNELS, tl, helper
    if _KERNELS is not None:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def helper(x, y):
        """A @triton.jit helper with a branch of its own and an early return (called from a divergent branch)."""
        if x > y:
            return x - y
        return y - x

    @triton.jit
    def branches(x_ptr, n_ptr, out_ptr, out_int_ptr):
        pid = tl.program_id(0)
        x = tl.load(x_ptr + pid)
        n = tl.load(n_ptr + pid)
        z = 0
        if x > 0.5:
            y = x * 2.0
            z = 1
            tl.store(out_ptr + pid * 5 + 3, y)  # a store under a branch: only these programs write it
        elif x > 0.25:
            y = helper(x, 0.3)
        else:
            y = -x
            z = z + 2
        acc = 0.0
        for i in range(n):  # a trip count of each program's own
            acc += x * i
        total = 0
        while (total < n * 3) and (acc >= 0.0):
            total += 2
        flag = 1 if not (x > 0.7 or n == 2) else 0
        tl.store(out_ptr + pid * 5, y)
        tl.store(out_ptr + pid * 5 + 1, acc)
        tl.store(out_ptr + pid * 5 + 2, x if z == 1 else -x)
        tl.store(out_int_ptr + pid * 5, z)
        tl.store(out_int_ptr + pid * 5 + 1, total)
        tl.store(out_int_ptr + pid * 5 + 2, flag)
        bumped = out_ptr + pid * 5 + 4
        tl.store(bumped, tl.load(bumped) + 1.0)  # read-modify-write before a split: a rerun must not bump twice
        if n > 3:
            return
        tl.store(out_int_ptr + pid * 5 + 1, total + 100)

    @triton.jit
    def tiles(p_ptr, q_ptr, e_ptr, u_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
        """Per row: the exponential race over max(0, p - q) by tiles (a running maximum, vLLM's recovered token),
        then the inverse-CDF search for the first cell past u times the residual's sum (SGLang's final draw)."""
        row = tl.program_id(0)
        best = tl.full((), float("-inf"), tl.float32)
        chosen = 0
        total = 0.0
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            p = tl.load(p_ptr + row * vocab + offs, mask=mask, other=0.0)
            q = tl.load(q_ptr + row * vocab + offs, mask=mask, other=0.0)
            e = tl.load(e_ptr + row * vocab + offs, mask=mask, other=1.0)
            residual = tl.maximum(p - q, 0.0)
            score = tl.where(mask, residual / e, float("-inf"))
            local, where = tl.max(score, axis=0, return_indices=True)
            if local > best:
                best = local
                chosen = start + where
            total += tl.sum(residual)
        goal = tl.load(u_ptr + row) * total
        running = 0.0
        found = 0
        drawn = vocab - 1
        for start in range(0, vocab, BLOCK):
            if found == 0:
                offs = start + tl.arange(0, BLOCK)
                mask = offs < vocab
                residual = tl.maximum(
                    tl.load(p_ptr + row * vocab + offs, mask=mask, other=0.0)
                    - tl.load(q_ptr + row * vocab + offs, mask=mask, other=0.0),
                    0.0,
                )
                past = (running + tl.cumsum(residual, axis=0)) > goal
                if tl.max(past, axis=0):
                    drawn = start + tl.argmax(past.to(tl.int32), axis=0)
                    found = 1
                running += tl.sum(residual)
        tl.store(out_ptr + row * 2, chosen)
        tl.store(out_ptr + row * 2 + 1, drawn)

    @triton.jit
    def blocks(x_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
        """Reductions and scans of a 2-D block along each axis, with keep_dims, a transpose and a reshape."""
        pid = tl.program_id(0)
        rows = tl.arange(0, M)[:, None]
        cols = tl.arange(0, N)[None, :]
        x = tl.load(x_ptr + pid * M * N + rows * N + cols)
        base = out_ptr + pid * (2 * M + 2 * N + 4)
        tl.store(base + tl.arange(0, N), tl.sum(x, axis=0))
        tl.store(base + N + tl.arange(0, M), tl.max(x, axis=1))
        tl.store(base + N + M + tl.arange(0, N), tl.sum(tl.cumsum(x, axis=0), axis=0))
        tl.store(base + 2 * N + M + tl.arange(0, M), tl.sum(tl.trans(x), axis=0))
        flat = tl.reshape(x, (M * N,))
        tl.store(base + 2 * N + 2 * M, tl.sum(flat, axis=0))
        tl.store(base + 2 * N + 2 * M + 1, tl.argmax(flat, axis=0).to(tl.float32))
        tl.store(base + 2 * N + 2 * M + 2, tl.sum(tl.sum(x, axis=1, keep_dims=True)))
        tl.store(base + 2 * N + 2 * M + 3, tl.min(x))

    @triton.jit
    def shapes(x_ptr, out_ptr):
        """A name bound to blocks of different shapes in the two branches: dead after them, then read after one."""
        pid = tl.program_id(0)
        x = tl.load(x_ptr + pid)
        if x > 0.5:
            tile = tl.arange(0, 16).to(tl.float32)
        else:
            tile = tl.arange(0, 32).to(tl.float32)
        tile = tl.arange(0, 8).to(tl.float32) * x  # assigned again: the conflict above is never read
        if x > 0.25:
            other = tl.arange(0, 4).to(tl.float32)
        else:
            other = tl.arange(0, 2).to(tl.float32)
        tl.store(out_ptr + pid * 2, tl.sum(tile))
        tl.store(out_ptr + pid * 2 + 1, tl.sum(other) * x)  # read: the programs are split and run again

    @triton.jit
    def counting(x_ptr, count_ptr, out_ptr):
        pid = tl.program_id(0)
        x = tl.load(x_ptr + pid)
        if x > 0.5:
            tl.atomic_add(count_ptr, 1)
        tl.store(out_ptr + pid, x * 2.0)

    @triton.jit
    def wide(x_ptr, fill_ptr, out_ptr, out_int_ptr, vocab, BLOCK: tl.constexpr, OUT: tl.constexpr):
        """A tile far wider than the vocabulary (vLLM's 8192 lanes), loaded with fills of every kind: -inf, +0,
        -0, NaN, a value each program loads, and a block whose own lanes past the vocabulary are one value; then
        the operations a tailed block takes as it is (arithmetic, comparisons, where, casts, fabs, fma,
        exponentials, maxima, minima and their indices, sums), and whole blocks stored."""
        row = tl.program_id(0)
        tile = tl.program_id(1)
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offs < vocab
        x = tl.load(x_ptr + row * vocab + offs, mask=mask, other=float("-inf"))
        zero = tl.load(x_ptr + row * vocab + offs, mask=mask, other=0.0)
        negative = tl.load(x_ptr + row * vocab + offs, mask=mask, other=-0.0)
        nan = tl.load(x_ptr + row * vocab + offs, mask=mask, other=float("nan"))
        own = tl.load(x_ptr + row * vocab + offs, mask=mask, other=tl.load(fill_ptr + row))
        shared = tl.load(x_ptr + row * vocab + offs, mask=mask, other=tl.where(offs < vocab + 3, 1.5, -2.5))
        short = tl.load(x_ptr + row * vocab + offs, mask=offs < (vocab + 1) // 2, other=0.0)  # fewer live lanes
        top, at = tl.max(x, axis=0, return_indices=True)
        low, low_at = tl.min(own, axis=0, return_indices=True)
        sumexp = tl.where(top > float("-inf"), tl.sum(tl.exp(x - top)), 0.0)
        base = out_ptr + (row * tl.num_programs(1) + tile) * OUT
        tl.store(base + 0, top)
        tl.store(base + 1, sumexp)
        tl.store(base + 2, tl.sum(zero * 3.0 - 1.0))
        tl.store(base + 3, tl.sum(negative))
        tl.store(base + 4, tl.max(nan, axis=0))
        tl.store(base + 5, low)
        tl.store(base + 6, tl.sum(tl.fma(own, shared, zero)))
        tl.store(base + 7, tl.sum(tl.abs(negative) / (1.0 + tl.abs(own))))
        tl.store(base + 8, tl.sum(tl.where(shared > 0.0, zero, -own)))
        tl.store(base + 9, tl.sum(tl.where(mask, x, 0.0).to(tl.float64)).to(tl.float32))
        tl.store(base + 10, tl.sum((own * 1000.0).to(tl.int32)).to(tl.float32))
        tl.store(base + 11, tl.sum(tl.exp2(tl.minimum(zero, 0.5)) - (nan != nan).to(tl.float32)))
        tl.store(base + 12, tl.max(tl.sqrt(tl.abs(own)) + shared, axis=0))
        tl.store(base + 13, tl.min(tl.where(zero == 0.0, -own, shared)))
        tl.store(base + 14, tl.sum(short + own) + tl.max(short * own, axis=0))  # live lanes of two lengths
        ints = out_int_ptr + (row * tl.num_programs(1) + tile) * 4
        tl.store(ints, at)
        tl.store(ints + 1, low_at)
        if vocab > 0:  # an all-NaN block has no argmax (numpy raises, in both interpreters)
            tl.store(ints + 2, tl.argmax(nan, axis=0))
        tl.store(ints + 3, tl.argmin(tl.where(mask, zero, 7.0).to(tl.float16), axis=0))
        block = out_ptr + (tl.num_programs(0) * tl.num_programs(1) * OUT) + (row * tl.num_programs(1) + tile) * BLOCK
        tl.store(block + tl.arange(0, BLOCK), tl.exp(x - top) + own)  # a tailed block stored whole

    @triton.jit
    def lengths(x_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
        """Two tailed blocks of different live lengths, the shorter with one fill for all programs, the longer
        with each program's own: the shorter is widened to the longer's live lanes."""
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        short = tl.load(x_ptr + row * vocab + offs, mask=offs < (vocab + 1) // 2, other=0.0)
        own = tl.load(x_ptr + row * vocab + offs, mask=offs < vocab, other=tl.load(x_ptr + row))
        tl.store(out_ptr + row, tl.sum(short + own))

    @triton.jit
    def ragged(n_ptr, x_ptr, out_ptr, K: tl.constexpr):
        """vLLM V2's acceptance loop in small: each program loops over its own number of drafts; ``verifying``,
        True before the loop, is a comparison's result in it (whose handle Triton's interpreter types as the
        compared values', fp32, not int1), and a program with no drafts keeps the True."""
        row = tl.program_id(0)
        n = tl.load(n_ptr + row)
        verifying = True
        accepted = tl.zeros((), tl.int64)
        last = 0.0
        for i in range(n):
            x = tl.load(x_ptr + row * K + i)
            if verifying:
                verifying = x > 0.2
                accepted += verifying
                last = x * 2.0
        tl.store(out_ptr + row * 2, accepted.to(tl.float32))
        tl.store(out_ptr + row * 2 + 1, last)

    _KERNELS = SimpleNamespace(
        branches=branches,
        tiles=tiles,
        blocks=blocks,
        shapes=shapes,
        counting=counting,
        wide=wide,
        lengths=lengths,
        ragged=ragged,
    )
    return _KERNELS
