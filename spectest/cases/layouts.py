"""Memory layouts engines hand a sampler: the same values, not stored contiguously.

Engines slice their inputs out of larger buffers: a [B, K_max + 1, V] scratch tensor of which a
step uses K + 1 positions, a vocabulary padded to a multiple of 128, every other row of a batch,
logits kept vocabulary-major. A correct implementation gives the same distribution whatever the
strides; one that assumes contiguity (a kernel handed ``data_ptr()`` and the shape alone) reads
the wrong memory. :func:`lay_out` returns a view with the values of its argument in the named
layout; the padding it reads past is filled with plausible values (1/V for probabilities, token
0 for ids), so a stride bug gives wrong answers, not only NaNs.

Every layout but ``contiguous`` also starts inside its buffer (a nonzero ``storage_offset()``, as
any slice past an engine's first row or position has): a kernel handed the storage's pointer, the
sizes and the strides but not the offset reads the buffer's padding in every strided layout, not
only in one of them.
"""

from __future__ import annotations

import torch

LAYOUTS = ("contiguous", "k-slice", "vocab-padded", "every-other-row", "vocab-major")
STRIDED_LAYOUTS = LAYOUTS[1:]


def lay_out(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """``tensor`` [N, K, V] (probabilities) or [N, K] (ids) as a view in ``layout``."""
    if layout == "contiguous":
        return tensor.contiguous()
    fill = 0 if not tensor.is_floating_point() else 1.0 / tensor.shape[-1]

    def buffer(*shape: int) -> torch.Tensor:
        return torch.full(shape, fill, dtype=tensor.dtype, device=tensor.device)

    n = tensor.shape[0]
    if layout == "k-slice":  # positions 1..K of a buffer with K + 3 of them (position 0 is the previous step's)
        room = buffer(n, tensor.shape[1] + 3, *tensor.shape[2:])
        room[:, 1 : tensor.shape[1] + 1] = tensor
        return room[:, 1 : tensor.shape[1] + 1]
    if layout == "vocab-padded":  # columns 64.. of rows padded to the next multiple of 128, plus 128
        width = tensor.shape[-1]
        room = buffer(*tensor.shape[:-1], (width // 128 + 2) * 128)
        room[..., 64 : 64 + width] = tensor
        return room[..., 64 : 64 + width]
    if layout == "every-other-row":
        room = buffer(2 * n, *tensor.shape[1:])
        room[1::2] = tensor
        return room[1::2]
    if layout == "vocab-major":  # the last dimension outermost in memory, after one row of another tensor
        order = (tensor.dim() - 1, *range(tensor.dim() - 1))
        back = (*range(1, tensor.dim()), 0)
        major = tensor.permute(order)
        room = buffer(major.shape[0] + 1, *major.shape[1:])
        room[1:] = major
        return room[1:].permute(back)
    raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")


def describe(tensor: torch.Tensor) -> str:
    return f"shape {list(tensor.shape)}, strides {list(tensor.stride())}, offset {tensor.storage_offset()}"
