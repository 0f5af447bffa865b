"""What spectest's two fused chain kernels share: their variants, their uniforms and the inputs they take.

``reference-triton`` (:mod:`spectest.gpu.triton`) and ``reference-cupy`` (:mod:`spectest.gpu.cupy`) are one
algorithm written twice, so that each checks the other: handed the same inputs and the same uniforms they emit
the same tokens (a float64 sum's last bit aside). Everything they must agree on lives here: the variant numbers
(the correct kernel and three deliberately broken ones), how the uniforms are drawn from the caller's generator,
the probability dtypes they read natively, and what their launches accept (any strides of the first two dims, a
contiguous last dim).

The algorithm, per row: accept draft d at position i iff ``u_i * q_i(d) < p_i(d)``; at the first rejection j the
extra token comes from the residual ``max(0, p_j - q_j)`` (from ``p_j`` when rounding left it empty), after K
acceptances from ``p_K``; it is the first cell whose running sum exceeds ``v`` times the row's total. bf16 and fp16
rows define their distributions only once normalised (``spectest.cases.tensors.as_given``), so for them the test
and the residual use the row sums P_i, Q_i: accept iff ``u_i q_i(d) P_i < p_i(d) Q_i`` (in float64), residual
weights ``max(0, p_j Q_j - q_j P_j)``; P and Q of a position are summed only when it is tested (up to the first
rejection), so a half-precision row costs up to two extra row reads per accepted draft.
"""

from __future__ import annotations

import torch

CORRECT, RESIDUAL_FROM_POSITION_0, ID_PAST_V, UNIFORM_REUSED = 0, 1, 2, 3
# The deliberately broken variants every kernel ships beside its correct one, by the names the meta-tests use:
# the residual taken at position 0 whatever the first rejection (the bonus too), a cell past V counted as if the
# padded last tile had read a probability there, the acceptance uniform reused for the extra token.
BROKEN_VARIANTS = {
    "residual_from_position_0": RESIDUAL_FROM_POSITION_0,
    "id_past_v": ID_PAST_V,
    "uniform_reused": UNIFORM_REUSED,
}
VARIANT_NAMES = {CORRECT: "correct", **{number: name for name, number in BROKEN_VARIANTS.items()}}
# What the ID_PAST_V variant's padded cell (index V) holds: p 0.05, q 0 (the bug reads a plausible number there).
PAST_V_TARGET = 0.05
KERNEL_DTYPES = ("float32", "float64", "bfloat16", "float16")
HALF_DTYPES = (torch.bfloat16, torch.float16)


def uniform_dtype(probs_dtype: torch.dtype) -> torch.dtype:
    """The acceptance uniforms' dtype: float64 for float64 probabilities, float32 otherwise (as the reference)."""
    return torch.float64 if probs_dtype == torch.float64 else torch.float32


def draw_uniforms(
    batch: int, k: int, probs_dtype: torch.dtype, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(u [B, K], v [B] float64): the acceptance uniforms, then one for each row's extra token, drawn from the
    caller's generator in this order, so that a printed seed replays a run and both kernels see the same draws."""
    u = torch.rand((batch, k), generator=generator, device=device, dtype=uniform_dtype(probs_dtype))
    v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float64)
    return u, v


def chain_inputs(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three inputs as a kernel reads them: int64 ids and probability tensors of one dtype whose last dim is
    contiguous (any other strides are passed to the kernel; a strided last dim is copied). Raises ValueError on
    shapes or dtypes outside the chain protocol, before anything is launched."""
    if draft_token_ids.dim() != 2 or draft_probs.dim() != 3 or target_probs.dim() != 3:
        raise ValueError(
            f"expected ids [B, K], q [B, K, V], p [B, K + 1, V]; got {tuple(draft_token_ids.shape)}, "
            f"{tuple(draft_probs.shape)}, {tuple(target_probs.shape)}"
        )
    batch, k = draft_token_ids.shape
    vocab = target_probs.shape[-1]
    if tuple(draft_probs.shape) != (batch, k, vocab) or tuple(target_probs.shape) != (batch, k + 1, vocab):
        raise ValueError(
            f"q {tuple(draft_probs.shape)} and p {tuple(target_probs.shape)} do not match ids {(batch, k)} and V={vocab}"
        )
    if vocab < 1:
        raise ValueError("the vocabulary is empty")
    if draft_probs.dtype != target_probs.dtype or str(target_probs.dtype).removeprefix("torch.") not in KERNEL_DTYPES:
        raise ValueError(f"q and p must share one of {KERNEL_DTYPES}; got {draft_probs.dtype}, {target_probs.dtype}")
    if draft_token_ids.dtype != torch.int64:
        if draft_token_ids.dtype.is_floating_point or draft_token_ids.dtype == torch.bool:
            raise ValueError(f"draft ids must be integers, got {draft_token_ids.dtype}")
        draft_token_ids = draft_token_ids.to(torch.int64)
    devices = {draft_token_ids.device, draft_probs.device, target_probs.device}
    if len(devices) != 1:
        raise ValueError(f"inputs on several devices: {sorted(map(str, devices))}")
    return draft_token_ids, last_dim_contiguous(draft_probs), last_dim_contiguous(target_probs)


def last_dim_contiguous(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` itself when its rows are contiguous (the kernels take the strides of dims 0 and 1), else a copy."""
    return probs if probs.stride(-1) == 1 or probs.shape[-1] == 1 else probs.contiguous()
