"""Turn case recipes into tensors on the run's device, and draw drafts from them."""

from __future__ import annotations

import numpy as np
import torch

from spectest.sampling import RepeatedCategorical, sample_categorical

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


def to_tensor(array: np.ndarray, *, device: torch.device, dtype: str | torch.dtype) -> torch.Tensor:
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    return torch.as_tensor(array, device=device).to(dtype)


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
    """``times`` copies of the batch stacked along dim 0 (copy r of row b sits at r * B + b)."""
    return tensor.repeat(times, *([1] * (tensor.dim() - 1)))
