"""The fused chain kernels' algorithm in numpy, and inputs to hold them to it.

``emulate_chain`` is :mod:`spectest.gpu.chain_inputs`'s algorithm written a third time, plainly, row by row:
the same acceptance tests in the same precision, the same residual weights (each product and difference
rounded on its own, as the kernels compute them without fused multiply-adds), float64 sums. Handed the same
inputs and uniforms, the Triton kernel (in Triton's interpreter, or compiled on a GPU), the CUDA kernel (on a
GPU, or on the CPU through tests/cuda_on_cpu) and this emit the same tokens: the sums differ only in their
association, which moves a cell's boundary by a float64 rounding, so a disagreement on a whole batch is a bug.
The kernels' exactness itself is tests/test_triton.py's statistical test of the Triton kernel, carried to the
others by that equality.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from spectest.gpu.chain_inputs import (
    CORRECT,
    ID_PAST_V,
    PAST_V_TARGET,
    RESIDUAL_FROM_POSITION_0,
    UNIFORM_REUSED,
    draw_uniforms,
)
from spectest.sampling import make_generator

HALF = (torch.bfloat16, torch.float16)

# The cases every kernel is held to the emulation on, (batch, K, V, layout, kind) per variant: between them every
# layout, every input kind, K past 32 (two ballots of the CUDA kernel), V past one group of tiles (4096 float32
# cells for the CUDA kernel, 1024 for the Triton kernel), V not a multiple of any vector width.
CASES = {
    CORRECT: [
        (6, 3, 1500, "contiguous", "dirichlet"),
        (4, 40, 70, "padded", "dirichlet"),
        (3, 2, 9000, "contiguous", "dirichlet"),
        (8, 3, 200, "contiguous", "unnormalised"),
    ],
    RESIDUAL_FROM_POSITION_0: [
        (6, 3, 257, "every_other_row", "dirichlet"),
        (8, 3, 50, "contiguous", "half_of_q"),
        (8, 3, 60, "padded", "unnormalised"),
    ],
    ID_PAST_V: [(6, 3, 37, "padded", "dirichlet"), (4, 3, 50, "contiguous", "ids_outside_v")],
    UNIFORM_REUSED: [(6, 3, 300, "contiguous", "dirichlet"), (4, 2, 100, "every_other_row", "zero_q_row")],
}


def cases_for(dtype: torch.dtype) -> dict[int, list[tuple[int, int, int, str, str]]]:
    """Every case for float32 and bfloat16; for float64 and float16, which differ from them only in how a value is
    read and widened, each variant's first case and the unnormalised rows (the harness tier's time)."""
    if dtype in (torch.float32, torch.bfloat16):
        return CASES
    return {bug: [cases[0], *(c for c in cases[1:] if c[-1] == "unnormalised")] for bug, cases in CASES.items()}


def emulate_chain(
    drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, u: torch.Tensor, v: torch.Tensor, bug: int
) -> np.ndarray:
    """int64 [B, K + 1]: what the kernels emit for these inputs and uniforms (``bug`` a variant number)."""
    half, wide = p.dtype in HALF, p.dtype == torch.float64
    work = np.float64 if wide else np.float32
    p_rows = p.cpu().to(torch.float64 if wide else torch.float32).numpy()  # exact widening
    q_rows = q.cpu().to(torch.float64 if wide else torch.float32).numpy()
    ids, u_np, v_np = drafts.cpu().numpy(), u.cpu().numpy(), v.cpu().numpy()
    batch, k = ids.shape
    vocab = p_rows.shape[-1]
    out = np.full((batch, k + 1), -1, dtype=np.int64)
    for b in range(batch):
        accepted, p_sum_at, q_sum_at = k, 1.0, 1.0
        for i in range(k):
            d = int(ids[b, i])
            valid = 0 <= d < vocab
            p_d = p_rows[b, i, d] if valid else work(0)
            q_d = q_rows[b, i, d] if valid else work(0)
            if half:
                p_sum = float(p_rows[b, i].astype(np.float64).sum())
                q_sum = float(q_rows[b, i].astype(np.float64).sum())
                accept = valid and (float(u_np[b, i]) * float(q_d)) * p_sum < float(p_d) * q_sum
                if (i == 0) if bug == RESIDUAL_FROM_POSITION_0 else not accept:
                    p_sum_at, q_sum_at = p_sum, q_sum
            else:
                accept = valid and work(u_np[b, i]) * work(q_d) < work(p_d)
            if not accept:
                accepted = i
                break
            out[b, i] = d
        rejected = accepted < k
        position = 0 if bug == RESIDUAL_FROM_POSITION_0 else accepted
        p_next = p_rows[b, position].astype(work)
        q_next = q_rows[b, min(position, k - 1)].astype(work) if rejected else np.zeros(vocab, work)
        if bug == ID_PAST_V:
            p_next = np.append(p_next, work(PAST_V_TARGET))
            q_next = np.append(q_next, work(0))
        p_scale, q_scale = (work(q_sum_at), work(p_sum_at)) if rejected else (work(1), work(0))
        weights = np.maximum(p_next * p_scale - q_next * q_scale, work(0))
        if not weights.astype(np.float64).sum() > 0:
            weights = np.maximum(p_next, work(0))
        total = weights.astype(np.float64).sum()
        uniform = float(u_np[b, min(accepted, k - 1)]) if bug == UNIFORM_REUSED and k > 0 else float(v_np[b])
        running = np.cumsum(weights.astype(np.float64))
        hits = np.flatnonzero((running > uniform * total) & (weights > 0))
        positive = np.flatnonzero(weights > 0)
        out[b, accepted] = hits[0] if len(hits) else (positive[-1] if len(positive) else -1)
    return out


@dataclass
class KernelCase:
    """One batch of kernel inputs: the tensors as handed to a verifier (views into larger storages when
    ``layout`` says so) and the uniforms a kernel draws for them from ``seed``."""

    drafts: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor
    u: torch.Tensor
    v: torch.Tensor
    seed: int


def kernel_case(
    batch: int,
    k: int,
    vocab: int,
    dtype: torch.dtype,
    *,
    seed: int,
    layout: str = "contiguous",
    device: torch.device | str = "cpu",
    kind: str = "dirichlet",
) -> KernelCase:
    """Random rows, drafts from q (``kind``: ``dirichlet`` rows with zeros in p; ``same``: q equals p, every
    draft accepted; ``half_of_q``: p = q / 2 before position K, so a rejection leaves an empty residual and the
    kernels fall back to p; ``zero_q_row``: an all-zero draft row at position 0; ``ids_outside_v``: the first
    draft id is V + 3 or -2, rejected without being read; ``unnormalised``: rows summing to 0.6 (p) and 1.7 (q),
    which bf16 and fp16 kernels must normalise and float32 ones use as given), in ``layout``:
    contiguous, ``padded`` (rows inside a K + 3 by V + 5 buffer at a storage offset of 3, so rows start
    unaligned) or ``every_other_row`` (rows 0, 2, 4... of a twice-larger batch, ids strided too)."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.3), size=(batch, k + 1))
    target[:, :, : max(1, vocab // 5)] = 0.0  # zeros the residual must never emit
    target /= target.sum(-1, keepdims=True).clip(min=1e-300)
    draft = 0.4 * target[:, :k] + 0.6 * rng.dirichlet(np.ones(vocab), size=(batch, k))
    if kind == "same":
        draft = target[:, :k].copy()
    elif kind == "half_of_q":
        target[:, :k] = 0.5 * draft
    elif kind == "zero_q_row":
        draft[:, 0] = 0.0
    elif kind == "unnormalised":
        target *= 0.6
        draft *= 1.7
    elif kind != "dirichlet" and kind != "ids_outside_v":
        raise ValueError(kind)
    ids = np.stack(
        [
            [rng.choice(vocab, p=row / row.sum()) if row.sum() > 0 else rng.integers(vocab) for row in rows]
            for rows in draft
        ]
    ).reshape(batch, k)
    if kind == "ids_outside_v" and k > 0:
        ids[:, 0] = np.where(np.arange(batch) % 2 == 0, vocab + 3, -2)
    device = torch.device(device)
    p = torch.as_tensor(target).to(device=device, dtype=dtype)
    q = torch.as_tensor(draft).to(device=device, dtype=dtype)
    drafts = torch.as_tensor(ids, dtype=torch.int64, device=device)
    if layout == "padded":
        p_storage = torch.zeros(batch, k + 4, vocab + 5, dtype=dtype, device=device).flatten()
        q_storage = torch.zeros(batch, k + 3, vocab + 5, dtype=dtype, device=device).flatten()
        p_view = torch.as_strided(p_storage, p.shape, ((k + 4) * (vocab + 5), vocab + 5, 1), 3)
        q_view = torch.as_strided(q_storage, q.shape, ((k + 3) * (vocab + 5), vocab + 5, 1), 3)
        p_view.copy_(p)
        q_view.copy_(q)
        p, q = p_view, q_view
    elif layout == "every_other_row":
        p = torch.stack([p, torch.full_like(p, 0.5)], 1).flatten(0, 1)[::2]
        q = torch.stack([q, torch.full_like(q, 0.5)], 1).flatten(0, 1)[::2]
        drafts = torch.stack([drafts, torch.zeros_like(drafts)], 2).flatten(1)[:, ::2]
    elif layout != "contiguous":
        raise ValueError(layout)
    u, v = draw_uniforms(batch, k, p.dtype, make_generator(seed, device), device)
    return KernelCase(drafts, q, p, u, v, seed)
