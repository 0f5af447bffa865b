"""FlashInfer's fused chain verifier (``flashinfer.sampling.chain_speculative_sampling``, CUDA only) as a
``--spec-model`` (registered ``flashinfer``): its conventions converted, nothing in it fixed."""

from __future__ import annotations

import importlib

import torch

from spectest.availability import missing


class FlashInferSampler:
    """FlashInfer's fused ``chain_speculative_sampling`` kernel (CUDA only)."""

    spectest_capabilities = frozenset({"standard-rejection"})

    @property
    def spectest_unavailable(self) -> str | None:
        return missing("flashinfer", gpu=True)

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        sampling = importlib.import_module("flashinfer.sampling")
        out = sampling.chain_speculative_sampling(
            draft_probs.float().contiguous(),
            draft_token_ids.int().contiguous(),
            target_probs.float().contiguous(),
            generator=generator,
        )
        return out.to(torch.int64)


FLASHINFER = FlashInferSampler()
