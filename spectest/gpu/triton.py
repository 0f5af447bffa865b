"""A fused Triton chain verifier, registered as ``reference-triton``: a custom kernel under the gate.

One program per row: the K acceptance tests (K gathered probabilities of p and q), then two
sweeps over the one V-long row pair that the extra token needs (the residual at the first
rejection, or the bonus row): the first sums it, the second finds the inverse-CDF cell. The
uniforms come from the caller's generator (drawn with torch on the device), so a printed seed
replays a run. Runs on CUDA; on a CPU, Triton's interpreter (``TRITON_INTERPRET=1``) runs the
same kernel slowly, which is how the harness's own tests exercise it without a GPU.

``BROKEN`` variants (residual from position 0, an id past V from the padded last tile, the
acceptance uniform reused for the extra token) are the deliberately buggy kernels the suite
must catch.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from spectest.protocol import PAD

CORRECT, RESIDUAL_FROM_POSITION_0, ID_PAST_V, UNIFORM_REUSED = 0, 1, 2, 3


def _unavailable() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "the 'triton' package is not installed"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton needs a CUDA GPU (or TRITON_INTERPRET=1 to run its interpreter on the CPU)"
    return None


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


class TritonReference:
    """The chain verifier as one fused Triton kernel (see the module docstring)."""

    spectest_capabilities = frozenset({"standard-rejection"})

    def __init__(self, bug: int = CORRECT, block: int = 1024) -> None:
        self.bug = bug
        self.block = block

    @property
    def spectest_unavailable(self) -> str | None:
        return _unavailable()

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        batch, k = draft_token_ids.shape
        vocab = target_probs.shape[-1]
        device = draft_token_ids.device
        u = torch.rand((batch, k), generator=generator, device=device, dtype=torch.float32)
        v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float64)
        out = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=device)
        if batch == 0:
            return out
        q, p = draft_probs.contiguous(), target_probs.contiguous()
        _kernel()[(batch,)](
            draft_token_ids.contiguous(),
            q,
            p,
            u,
            v,
            out,
            vocab,
            q.stride(0),
            q.stride(1),
            p.stride(0),
            p.stride(1),
            K=k,
            BLOCK=min(self.block, max(16, 1 << (vocab - 1).bit_length())),
            BUG=self.bug,
        )
        return out


TRITON_REFERENCE = TritonReference()
# Deliberately broken kernels: each must fail the suite.
BROKEN = {
    "residual_from_position_0": TritonReference(RESIDUAL_FROM_POSITION_0),
    "id_past_v": TritonReference(ID_PAST_V),
    "uniform_reused": TritonReference(UNIFORM_REUSED),
}
residual_from_position_0 = BROKEN["residual_from_position_0"]
id_past_v = BROKEN["id_past_v"]
uniform_reused = BROKEN["uniform_reused"]
