"""Minimal reproduction, without spectest: OpenVINO GenAI's speculative decoding with a draft model
changes what multinomial sampling emits.

With ``top_k=1`` multinomial sampling is deterministic: every token must be the target's argmax, the
token greedy decoding emits. Speculation off, it is (0 differences); with a draft model and
``num_assistant_tokens=4`` most tokens differ. 64 prompts of 6 random ids, 16 new tokens each,
``rng_seed`` 0-63, float32 inference and KV cache.

    python tests/engines/repro/openvino_genai_top_k_1.py [TARGET_IR DRAFT_IR]

TARGET_IR and DRAFT_IR are OpenVINO IR folders of a target and a draft sharing a vocabulary; any pair shows
it. By default, the tiny pair's IR that a run of ``--spec-engine openvino-genai-draft`` left in spectest's
cache (``optimum-cli export openvino --task text-generation-with-past --weight-format fp32``). Measured 2026-12-01 with
openvino-genai 2026.4.1 on the tiny pair: 0 of 1024 tokens off, then 791 and 792 of 1024 in two runs (the
speculative path is not even deterministic for fixed seeds).
"""

from __future__ import annotations

import sys

import numpy as np
import openvino as ov
import openvino_genai as og

PRECISION = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def pipeline(target: str, draft: str | None):
    scheduler = og.SchedulerConfig()
    scheduler.cache_size = 1
    properties = dict(PRECISION)
    if draft:
        properties["draft_model"] = og.draft_model(draft, "CPU", **PRECISION)
    return og.ContinuousBatchingPipeline(target, scheduler, "CPU", properties)


def config(seed: int, *, sample: bool, speculative: bool):
    c = og.GenerationConfig()
    c.max_new_tokens, c.ignore_eos, c.rng_seed = 16, True, seed
    if sample:
        c.do_sample, c.top_k, c.temperature = True, 1, 1.0
    if speculative:
        c.num_assistant_tokens = 4
    return c


def main(target: str, draft: str) -> None:
    rng = np.random.default_rng(0)
    prompts = [ov.Tensor(rng.integers(3, 320, size=(1, 6)).astype(np.int64)) for _ in range(64)]
    greedy = [
        r.m_generation_ids[0]
        for r in pipeline(target, None).generate(
            prompts, [config(s, sample=False, speculative=False) for s in range(64)]
        )
    ]
    for name, speculative in (("speculation off", False), ("draft model, num_assistant_tokens=4", True)):
        out = pipeline(target, draft if speculative else None).generate(
            prompts, [config(s, sample=True, speculative=speculative) for s in range(64)]
        )
        sampled = [r.m_generation_ids[0] for r in out]
        differ = sum(a != b for g, o in zip(greedy, sampled, strict=True) for a, b in zip(g, o, strict=True))
        total = sum(len(g) for g in greedy)
        print(f"{name}: top_k=1 sampling differs from greedy decoding in {differ} of {total} tokens")


def cached_pair() -> tuple[str, str]:
    import os
    from pathlib import Path

    root = Path(os.environ.get("SPECTEST_CACHE") or Path.home() / ".cache" / "spectest")
    found = sorted(p for p in root.glob("pair-seed0-recipe*/openvino-*") if (p / "target").is_dir())
    if not found:
        raise SystemExit(f"no OpenVINO IR of the tiny pair under {root}: pass TARGET_IR DRAFT_IR")
    return str(found[-1] / "target"), str(found[-1] / "draft")


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()))
