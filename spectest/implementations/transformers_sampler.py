"""transformers' speculative sampler as a ``--spec-model`` (registered ``transformers``): its conventions
converted, nothing in it fixed.

The adapter turns the chain protocol (probabilities, a generator, -1 padding) into transformers' calling
convention and back; transformers draws from torch's global RNG, which the adapter seeds from the generator
inside ``torch.random.fork_rng`` (:func:`spectest.sampling.global_rng_from`), so runs replay and the caller's
global RNG is left as it was. Importing this module never imports transformers. The GPU libraries' samplers
(FlashInfer, vLLM, SGLang) are adapted in :mod:`spectest.gpu`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from spectest.availability import missing
from spectest.protocol import PAD
from spectest.sampling import global_rng_from


class TransformersSampler:
    """``transformers``' assisted-generation acceptance step (``_speculative_sampling``).

    It takes one sequence at a time, logits rather than probabilities (``log p``; zeros become
    -inf, which its softmax maps back to 0) and draws from torch's global RNG.
    """

    spectest_capabilities = frozenset({"standard-rejection"})

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing("transformers", gpu=False)
        if reason is None and not hasattr(self._module(), "_speculative_sampling"):
            return "this transformers version has no generation.utils._speculative_sampling"
        return reason

    @staticmethod
    def _module() -> Any:
        return importlib.import_module("transformers.generation.utils")

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        sample = self._module()._speculative_sampling
        extra = {"is_done_candidate": False} if "is_done_candidate" in inspect.signature(sample).parameters else {}
        batch, k = draft_token_ids.shape
        draft_logits, target_logits = draft_probs.log(), target_probs.log()
        emitted = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=draft_token_ids.device)
        with global_rng_from(generator):
            for row in range(batch):
                tokens, _ = sample(
                    draft_token_ids[row : row + 1],
                    draft_logits[row : row + 1],
                    k,
                    target_logits[row : row + 1],
                    **extra,
                )
                emitted[row, : tokens.shape[1]] = tokens[0]
        return emitted


TRANSFORMERS = TransformersSampler()
