"""A diagnostic, not a verdict: vLLM's CPU engines with the two rejection-sampler bugs of
``vllm_cpu_rejection_sampler_bugs.py`` mended in the engine's own process, to test whether they account
for every finding on vLLM's CPU build.

The recorded verdicts (docs/engines-we-checked.md, tests/test_real_engines.py) are on the unmodified engine;
this module only answers a maintainer's question, "would fixing these be enough?":

    .venv-vllm/bin/pytest --spec-engine tests/engines/repro/vllm_cpu_mended.py:EAGLE

Mended: ``expand_batch_to_tokens`` spreads each request's value over its draft positions with
``repeat_interleave`` at the caller's dtype (what vllm-project/vllm#55006 proposes), and top-k is not
applied to zero draft rows. Same declarations as the engines in ``spectest.e2e.engines.vllm_cpu``.
Measured 2026-12-04, seed 1, default budget: EAGLE and n-gram drafts pass every property; the draft model
passes all but "same seed, same output" (its probabilistic draft sampling draws from the global generator,
not the request's: ``compute_probs_and_sample_next_token``, "TODO(woosuk): Consider seeds").
"""

from __future__ import annotations

from typing import Any

from spectest.e2e.engines import vllm_cpu
from spectest.e2e.isolated import IsolatedWithDraft, IsolatedWithPlain


def build(**options: Any) -> vllm_cpu.VLLMEngine:
    """The adapter's engine, built after mending the two functions in this (the engine's) process."""
    import torch
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        ends = cu_num_tokens.to(torch.long)
        counts = torch.diff(ends, prepend=ends.new_zeros(1))
        x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
        return x.repeat_interleave(counts, output_size=num_tokens)

    top_k_only = topk_topp_sampler.apply_top_k_only

    def apply_top_k_only(logits, k):
        return logits if logits.shape[0] == 0 else top_k_only(logits, k)

    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    topk_topp_sampler.apply_top_k_only = apply_top_k_only
    return vllm_cpu.build(**options)


class MendedDraft(vllm_cpu.VLLMDraft):
    def __init__(self, name: str, **options: Any) -> None:
        IsolatedWithDraft.__init__(self, name, f"{__file__}:build", options)


class MendedWithoutDraftLogits(vllm_cpu.VLLMWithoutDraftLogits):
    def __init__(self, name: str, **options: Any) -> None:
        IsolatedWithPlain.__init__(self, name, f"{__file__}:build", options)


DRAFT = MendedDraft("vllm-cpu-draft-mended", method="draft")
NGRAM = MendedWithoutDraftLogits("vllm-cpu-ngram-mended", method="ngram")
EAGLE = MendedWithoutDraftLogits("vllm-cpu-eagle-mended", method="eagle")
