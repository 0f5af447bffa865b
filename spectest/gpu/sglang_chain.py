"""SGLang's Triton rejection sampler (``sglang/kernels/ops/speculative/reject_sampling.py``:
``chain_speculative_sampling_triton``, the ``speculative_sampling_classic_kernel``) as ``--spec-model`` models, its
inputs built as SGLang's EAGLE/MTP verify step builds them (``srt/speculative/eagle_utils.py``), nothing in it
replaced:

* ``sglang``: chain verification with sampled drafts (``--speculative-use-rejection-sampling``), the acceptance test
  ``coin * q < p`` and the residual ``max(0, p - q)`` at the first rejection, the bonus from p after K acceptances;
* ``sglang-block``: the same kernel with ``block_verification=True`` (``--speculative-use-block-verification``,
  Sun et al. 2024's Algorithm 2), held to the block-verification rules.

The engine's layout: ``candidates`` [B, K + 1] (the last verified token, then the K drafts), ``retrive_index``
[B, K + 1] numbering each row's slots in the flat ``predicts``, target probabilities [B, K + 1, V] (its softmax with
the requests' temperatures, then top-k and top-p renormalised), draft probabilities [B, K, V], one coin per slot and
one for the final draw from ``torch.rand`` (the engine's unseeded path: ``_verify_coins``), which the adapter seeds
from the harness's generator inside ``torch.random.fork_rng``. The emitted tokens are ``predicts`` at
``accept_index``'s first ``accept_token_num + 1`` slots.

The module is loaded from the installed ``sglang`` distribution's file alone (it imports only ``triton``), not
through ``sglang``'s package, whose ``__init__`` pulls the server's dependencies: ``pip install --no-deps
sglang==0.5.23`` is all it needs. Without a GPU its kernel runs in Triton's interpreter, batched
(:mod:`spectest.gpu.interpreter`); with one, compiled.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from spectest.availability import cuda_available
from spectest.gpu.engine_kernels import EngineKernels
from spectest.gpu.interpreter import describe_kernels
from spectest.sampling import global_rng_from
from spectest.wheel_files import load_package_file

KERNEL_FILE = ("kernels", "ops", "speculative", "reject_sampling.py")
MODULE_NAME = "spectest_sglang_reject_sampling"  # the kernel file's module, imported alone
KERNELS = ("speculative_sampling_classic_kernel",)


def load_sglang_kernels() -> Any:
    """The installed SGLang's ``reject_sampling.py``, imported as a module of its own (Triton's interpreter arranged
    first where there is no GPU). Raises ModuleNotFoundError where the installed SGLang has no such file."""
    if MODULE_NAME not in sys.modules and not cuda_available():
        from spectest.gpu.interpreter import arrange_triton

        arrange_triton("sglang")
    return load_package_file("sglang", KERNEL_FILE, MODULE_NAME, ("chain_speculative_sampling_triton",))


class SglangChain(EngineKernels):
    """SGLang's chain rejection sampler (see the module docstring)."""

    spectest_capabilities = frozenset({"standard-rejection"})
    block_verification = False
    packages = ("sglang", "triton")
    hint = "pip install --no-deps sglang==0.5.23"

    def __init__(self, name: str) -> None:
        self.name = name
        self._counted: torch.Tensor | None = None

    def load(self) -> Any:
        return load_sglang_kernels()

    @property
    def spectest_description(self) -> str:
        return describe_kernels("sglang", "SGLang", load_sglang_kernels(), KERNELS)

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        module = load_sglang_kernels()
        batch, k = draft_token_ids.shape
        device = draft_token_ids.device
        slots = k + 1
        root = torch.zeros((batch, 1), dtype=torch.int64, device=device)  # the last verified token: unused
        candidates = torch.cat([root, draft_token_ids], dim=1).to(torch.int32).contiguous()
        retrive_index = torch.arange(batch * slots, dtype=torch.int32, device=device).view(batch, slots)
        predicts = torch.zeros(batch * slots, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, slots), -1, dtype=torch.int32, device=device)
        accept_token_num = torch.empty(batch, dtype=torch.int32, device=device)
        with global_rng_from(generator):
            coins = torch.rand_like(candidates, dtype=torch.float32, device=device)
            coins_for_final_sampling = torch.rand((batch,), dtype=torch.float32, device=device)
        module.chain_speculative_sampling_triton(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_token_num,
            candidates=candidates,
            retrive_index=retrive_index,
            retrive_next_token=None,
            retrive_next_sibling=None,
            uniform_samples=coins,
            uniform_samples_for_final_sampling=coins_for_final_sampling,
            target_probs=target_probs.to(torch.float32),  # any strides: the kernel takes all three of each
            draft_probs=draft_probs.to(torch.float32),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
            block_verification=self.block_verification,
        )
        self._counted = accept_token_num
        # The emitted slots are accept_index's filled ones (its count is held to accept_token_num by the counters).
        filled = accept_index >= 0
        tokens = predicts.to(torch.int64)[accept_index.to(torch.int64).clamp(min=0)]
        return torch.where(filled, tokens, torch.full_like(tokens, -1))

    def spectest_counters(self) -> dict[str, torch.Tensor]:
        """The kernel's ``accept_token_num``: the drafts it accepted, which the engine commits."""
        return {"emitted_drafts": self._counted}


class SglangBlock(SglangChain):
    spectest_capabilities = frozenset({"block-verification"})
    block_verification = True


SGLANG = SglangChain("sglang")
SGLANG_BLOCK = SglangBlock("sglang-block")
