"""Turn case recipes into tensors on the run's device, and draw drafts from them."""

from __future__ import annotations

import numpy as np
import torch

from spectest.sampling import sample_categorical

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_tensor(array: np.ndarray, *, device: torch.device, dtype: str | torch.dtype) -> torch.Tensor:
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    return torch.as_tensor(array, device=device).to(dtype)


def draw_drafts(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draft token per row and position, sampled from q (context-free cases)."""
    return sample_categorical(draft_probs, generator)


def repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """``times`` copies of the batch stacked along dim 0 (copy r of row b sits at r * B + b)."""
    return tensor.repeat(times, *([1] * (tensor.dim() - 1)))


def chunked_repeats(total: int, rows: int, row_elements: int, max_elements: int) -> list[int]:
    """Split ``total`` repetitions of a ``rows``-row batch into calls of bounded size."""
    per_call = max(1, max_elements // max(1, rows * row_elements))
    return [min(per_call, total - start) for start in range(0, total, per_call)]
