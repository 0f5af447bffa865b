"""Memory layouts engines hand a sampler: the same values, not stored contiguously.

Engines slice their inputs out of larger buffers: a [B, K_max + 1, V] scratch tensor of which a
step uses K + 1 positions, a vocabulary padded to a multiple of 128, every other row of a batch,
logits kept vocabulary-major. A correct implementation gives the same distribution whatever the
strides; one that assumes contiguity (a kernel handed ``data_ptr()`` and the shape alone) reads
the wrong memory. :func:`lay_out` returns a view with the values of its argument in the named
layout; the padding it reads past is filled with plausible values (1/V for probabilities, token
0 for ids), so a stride bug gives wrong answers, not only NaNs.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "k-slice", "vocab-padded", "every-other-row", "vocab-major")


def lay_out(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """``tensor`` [N, K, V] (probabilities) or [N, K] (ids) as a view in ``layout``."""
    if layout == "contiguous":
        return tensor.contiguous()
    fill = 0 if not tensor.is_floating_point() else 1.0 / tensor.shape[-1]
    n = tensor.shape[0]
    if layout == "k-slice":  # positions 0..K-1 of a buffer with K + 3 of them
        buffer = torch.full((n, tensor.shape[1] + 3, *tensor.shape[2:]), fill, dtype=tensor.dtype, device=tensor.device)
        buffer[:, : tensor.shape[1]] = tensor
        return buffer[:, : tensor.shape[1]]
    if layout == "vocab-padded":  # the last dimension padded to the next multiple of 128, plus 128
        width = tensor.shape[-1]
        padded = (width // 128 + 2) * 128
        buffer = torch.full((*tensor.shape[:-1], padded), fill, dtype=tensor.dtype, device=tensor.device)
        buffer[..., :width] = tensor
        return buffer[..., :width]
    if layout == "every-other-row":
        buffer = torch.full((2 * n, *tensor.shape[1:]), fill, dtype=tensor.dtype, device=tensor.device)
        buffer[1::2] = tensor
        return buffer[1::2]
    if layout == "vocab-major":  # the last dimension outermost in memory
        order = (tensor.dim() - 1, *range(tensor.dim() - 1))
        back = (*range(1, tensor.dim()), 0)
        return tensor.permute(order).contiguous().permute(back)
    raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")


def describe(tensor: torch.Tensor) -> str:
    return f"shape {list(tensor.shape)}, strides {list(tensor.stride())}, offset {tensor.storage_offset()}"
