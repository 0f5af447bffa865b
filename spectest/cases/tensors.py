"""Turn case recipes into tensors on the run's device, and draw drafts from them."""

from __future__ import annotations

import numpy as np
import torch

from spectest.sampling import BITS, RepeatedCategorical, sample_categorical

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


HALF = ("bfloat16", "float16")
FULL = ("float32", "float64")


def to_tensor(array: np.ndarray, *, device: torch.device, dtype: str | torch.dtype) -> torch.Tensor:
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    return torch.as_tensor(array, device=device).to(dtype)


def as_given(array: np.ndarray, *, device: torch.device, dtype: str) -> tuple[torch.Tensor, np.ndarray]:
    """The tensor handed to the model and the exact distribution it defines.

    Exactness in half precision: the target (and the draft) is the distribution the given
    bf16/fp16 values define, normalised in float64: rounding moves each probability by up to
    2^-9 (bf16) or 2^-12 (fp16) of itself and flushes fp16 values below 3e-8 to 0, and an
    implementation can only be held to what it was handed. Tokens rounded to 0 become impossible.
    For float32 and float64 the values are what the harness built (normalised to rounding)."""
    tensor = to_tensor(array, device=device, dtype=dtype)
    if dtype not in HALF:
        return tensor, array
    given = tensor.double().cpu().numpy()
    return tensor, given / given.sum(axis=-1, keepdims=True)


class RepeatedBatch:
    """One case's inputs, handed to the verifier ``reps`` copies at a time with fresh drafts.

    Copy r of row b sits at row r * B + b. The draft CDF is built once per case.
    """

    def __init__(self, target: torch.Tensor, draft: torch.Tensor) -> None:
        self.target = target
        self.draft = draft
        self.drafter = RepeatedCategorical(draft)

    def draw(self, reps: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft_token_ids, draft_probs, target_probs) for ``reps`` fresh copies of the batch."""
        drafts = self.drafter.sample(reps, generator).reshape(-1, self.draft.shape[1])
        return drafts, repeat_rows(self.draft, reps), repeat_rows(self.target, reps)


def draw_drafts(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draft token per row and position, sampled from q (context-free cases)."""
    return sample_categorical(draft_probs, generator)


def repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """``times`` copies of the batch stacked along dim 0 (copy r of row b sits at r * B + b): the same tensor as
    ``tensor.repeat``, written by one copy from a broadcast view (several times faster on a CPU)."""
    out = torch.empty((times * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    copy_repeated(out, tensor, times)
    return out


def copy_repeated(out: torch.Tensor, tensor: torch.Tensor, times: int) -> None:
    """Write ``times`` copies of ``tensor`` [N, ...] into ``out`` [times * N, ...] (any strides), copy r at rows
    r * N .. (r + 1) * N - 1."""
    bits = BITS.get(tensor.dtype)
    if bits is not None:
        out, tensor = out.view(bits), tensor.view(bits)
    out.unflatten(0, (times, tensor.shape[0])).copy_(tensor.unsqueeze(0).expand(times, *tensor.shape))
