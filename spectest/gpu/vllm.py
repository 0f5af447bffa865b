"""vLLM v1's rejection sampler (``vllm.v1.sample.rejection_sampler.rejection_sample``, Triton kernels, CUDA
only) as a ``--spec-model`` (registered ``vllm``): its conventions converted, nothing in it fixed.

vLLM draws from torch's global RNG, which the adapter seeds from the harness's generator inside
``torch.random.fork_rng`` (:func:`spectest.sampling.global_rng_from`), so runs replay.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

import torch

from spectest.availability import missing
from spectest.sampling import global_rng_from


class VllmSampler:
    """vLLM v1's ``rejection_sample`` (Triton kernels, CUDA only), driven as a chain: all rows
    random, flattened drafts, and a bonus token the adapter samples from target_probs[:, K]
    (vLLM's main sampler does that step before calling the rejection sampler)."""

    spectest_capabilities = frozenset({"standard-rejection"})

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing("vllm", gpu=True)
        if reason is None and importlib.util.find_spec("vllm.v1.sample.rejection_sampler") is None:
            return "this vLLM version has no v1 rejection sampler"
        return reason

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        from spectest.sampling import sample_categorical

        module = importlib.import_module("vllm.v1.sample.rejection_sampler")
        batch, k = draft_token_ids.shape
        device = draft_token_ids.device
        bonus = sample_categorical(target_probs[:, k], generator).view(batch, 1)
        metadata = _vllm_sampling_metadata(batch, device, generator)
        with global_rng_from(generator):
            out = module.rejection_sample(
                draft_token_ids.flatten().int(),
                [k] * batch,
                k,
                torch.arange(1, batch + 1, device=device, dtype=torch.int32) * k,
                draft_probs.reshape(batch * k, -1).float(),
                target_probs[:, :k].reshape(batch * k, -1).float(),
                bonus.int(),
                metadata,
            )
        return out.to(torch.int64)


def _vllm_sampling_metadata(batch: int, device: torch.device, generator: torch.Generator) -> Any:
    """All-random SamplingMetadata at temperature 1 with no filters, built from whichever fields
    the installed vLLM's dataclass declares."""
    metadata = importlib.import_module("vllm.v1.sample.metadata").SamplingMetadata
    values: dict[str, Any] = {
        "temperature": torch.ones(batch, device=device),
        "all_greedy": False,
        "all_random": True,
        "generators": {},
        "max_num_logprobs": None,
        "no_penalties": True,
        "prompt_token_ids": None,
        "frequency_penalties": torch.zeros(batch, device=device),
        "presence_penalties": torch.zeros(batch, device=device),
        "repetition_penalties": torch.ones(batch, device=device),
        "output_token_ids": [[] for _ in range(batch)],
        "allowed_token_ids_mask": None,
        "bad_words_token_ids": {},
        "logitsprocs": None,
    }
    fields = inspect.signature(metadata).parameters
    return metadata(**{name: values.get(name) for name in fields})


VLLM = VllmSampler()
