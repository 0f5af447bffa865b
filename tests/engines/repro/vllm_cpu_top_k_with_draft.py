"""Minimal reproduction, without spectest: vLLM's CPU build fails any request with top-k once a draft
model is configured.

Eight requests of four prompt tokens, ``top_k=5``, ``temperature=1``, 16 new tokens. Without a speculative
config they run; with ``{"model": DRAFT, "num_speculative_tokens": 4}`` the first step (the prefill, no
drafts scheduled yet) raises in the rejection sampler's top-k on an empty tensor, and the engine is dead.

    python tests/engines/repro/vllm_cpu_top_k_with_draft.py [TARGET DRAFT]

TARGET and DRAFT are Hugging Face folders of a target and a draft (head size 32 or more on CPU); by default
the tiny pair a run of ``--spec-engine vllm-cpu-draft`` left in spectest's cache. Measured 2026-12-01 with
vllm-cpu 0.32.0: "ran: 8 requests" without speculation, then the RuntimeError from
``vllm/v1/sample/ops/topk_topp_sampler.py`` (``apply_top_k_only``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.update(OMP_NUM_THREADS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")


def run(target: str, draft: str | None) -> str:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    config = {"model": draft, "num_speculative_tokens": 4} if draft else None
    llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=256, speculative_config=config)
    prompts = [TokensPrompt(prompt_token_ids=[5, 6, 7, 8 + i]) for i in range(8)]
    params = [SamplingParams(temperature=1.0, top_k=5, max_tokens=16, ignore_eos=True, seed=i) for i in range(8)]
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as exc:
        return f"raised {type(exc).__name__}: {str(exc)[:300]}"
    return f"ran: {len(outputs)} requests, {sum(len(o.outputs[0].token_ids) for o in outputs)} tokens"


def cached_pair() -> tuple[str, str]:
    root = Path(os.environ.get("SPECTEST_CACHE") or Path.home() / ".cache" / "spectest")
    found = sorted(p for p in root.glob("pair-seed0-recipe*") if (p / "target").is_dir())
    if not found:
        raise SystemExit(f"no tiny pair under {root}: pass TARGET DRAFT")
    return str(found[-1] / "target"), str(found[-1] / "draft")


if __name__ == "__main__":
    target, draft = sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()
    print("no speculative config:", run(target, None))
    print("draft model, 4 tokens:", run(target, draft))
