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

from spectest.cases.tensors import copy_repeated

LAYOUTS = ("contiguous", "k-slice", "vocab-padded", "every-other-row", "vocab-major")
STRIDED_LAYOUTS = LAYOUTS[1:]


def lay_out(tensor: torch.Tensor, layout: str, reps: int = 1) -> torch.Tensor:
    """``reps`` copies of ``tensor`` [N, K, V] (probabilities) or [N, K] (ids), stacked along dim 0 (copy r of row
    b at r * N + b, as :func:`~spectest.cases.tensors.repeat_rows` stacks them), as a view in ``layout``.

    The copies are written once, straight into the buffer, and only the padding around the view is filled: the
    same values, strides and offsets as laying out a repeated tensor, without writing the repeated rows twice."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; one of {LAYOUTS}")
    if layout == "contiguous" and reps == 1:
        return tensor.contiguous()
    fill = 0 if not tensor.is_floating_point() else 1.0 / tensor.shape[-1]
    n = tensor.shape[0] * reps
    rest = tuple(tensor.shape[1:])

    def buffer(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=tensor.dtype, device=tensor.device)

    if layout == "contiguous":
        room = buffer(n, *rest)
        view = room
    elif layout == "k-slice":  # positions 1..K of a buffer with K + 3 of them (position 0 is the previous step's)
        room = buffer(n, rest[0] + 3, *rest[1:])
        room[:, :1].fill_(fill)
        room[:, rest[0] + 1 :].fill_(fill)
        view = room[:, 1 : rest[0] + 1]
    elif layout == "vocab-padded":  # columns 64.. of rows padded to the next multiple of 128, plus 128
        width = tensor.shape[-1]
        room = buffer(n, *rest[:-1], (width // 128 + 2) * 128)
        room[..., :64].fill_(fill)
        room[..., 64 + width :].fill_(fill)
        view = room[..., 64 : 64 + width]
    elif layout == "every-other-row":
        room = buffer(2 * n, *rest)
        room[0::2].fill_(fill)
        view = room[1::2]
    else:  # vocab-major: the last dimension outermost in memory, after one row of another tensor
        major = (tensor.shape[-1], n, *rest[:-1])
        room = buffer(major[0] + 1, *major[1:])
        room[:1].fill_(fill)
        view = room[1:].permute(*range(1, len(major)), 0)
    copy_repeated(view, tensor, reps)
    return view


def describe(tensor: torch.Tensor) -> str:
    return f"shape {list(tensor.shape)}, strides {list(tensor.stride())}, offset {tensor.storage_offset()}"
