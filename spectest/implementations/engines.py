"""Adapters to engines' speculative samplers: conventions converted, nothing in them fixed.

Each adapter turns the chain protocol (probabilities, a generator, -1 padding) into the
engine's calling convention and back. Where an engine draws from torch's global RNG, the
adapter seeds it from the generator inside ``torch.random.fork_rng``, so runs replay and the
caller's global RNG is left as it was. Availability is checked lazily: importing this module
never imports an engine.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from spectest.protocol import PAD


def missing(package: str, *, gpu: bool) -> str | None:
    """Why an adapter cannot run here (package or GPU missing), or None."""
    if importlib.util.find_spec(package) is None:
        return f"the '{package}' package is not installed"
    if gpu and not torch.cuda.is_available():
        return f"'{package}' needs a CUDA GPU and none is available"
    return None


@contextlib.contextmanager
def global_rng_from(generator: torch.Generator) -> Iterator[None]:
    """Seed torch's global RNG (CPU and the generator's CUDA device) from ``generator`` for the
    duration, restoring the caller's state afterwards."""
    device = generator.device
    cuda = [device.index or 0] if device.type == "cuda" else []
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


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


TRANSFORMERS = TransformersSampler()
FLASHINFER = FlashInferSampler()
VLLM = VllmSampler()
