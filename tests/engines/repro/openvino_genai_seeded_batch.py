"""Minimal reproduction, without spectest: with a draft model, OpenVINO GenAI's seeded sampling depends on the
rest of the batch (and on the run).

A request with its own ``rng_seed`` must give the same tokens every time, alone or beside others. 32 prompts of
one random id, each sampled at temperature 1 (no filter) with ``rng_seed`` = its index, 8 new tokens: alone
(one ``generate`` call each), again alone, and as the last request of a batch of 8 (the 7 before it sampled
with other seeds and a top-p of 0.5). Counted: requests whose tokens differ between the two lone runs and between
the lone run and the batch. Speculation off, 0 and 0; with a draft model and ``num_assistant_tokens=4`` or
``assistant_confidence_threshold=0.3``, the printed counts.

    python tests/engines/repro/openvino_genai_seeded_batch.py [TARGET_IR DRAFT_IR]

The IR folders default to the tiny pair's, as in ``openvino_genai_top_k_1.py`` (a run of
``--spec-engine openvino-genai-draft`` leaves them in spectest's cache).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import openvino as ov
import openvino_genai as og

sys.path.insert(0, str(Path(__file__).resolve().parent))

from openvino_genai_top_k_1 import cached_pair, pipeline

REQUESTS, BATCH, NEW_TOKENS = 32, 8, 8


def config(seed: int, speculation: dict[str, float], top_p: float = 1.0):
    c = og.GenerationConfig()
    c.max_new_tokens, c.ignore_eos, c.rng_seed = NEW_TOKENS, True, seed
    c.do_sample, c.temperature, c.top_p = True, 1.0, top_p
    for name, value in speculation.items():
        setattr(c, name, value)
    return c


def main(target: str, draft: str) -> None:
    rng = np.random.default_rng(0)
    prompts = [ov.Tensor(rng.integers(3, 320, size=(1, 1)).astype(np.int64)) for _ in range(REQUESTS + BATCH)]
    for name, speculation in (
        ("speculation off", {}),
        ("draft model, num_assistant_tokens=4", {"num_assistant_tokens": 4}),
        ("draft model, assistant_confidence_threshold=0.3", {"assistant_confidence_threshold": 0.3}),
    ):
        engine = pipeline(target, draft if speculation else None)

        def run(batch_prompts, configs, engine=engine):
            return [r.m_generation_ids[0] for r in engine.generate(batch_prompts, configs)]

        alone = [run([prompts[i]], [config(i, speculation)])[0] for i in range(REQUESTS)]
        again = [run([prompts[i]], [config(i, speculation)])[0] for i in range(REQUESTS)]
        others = [config(1000 + j, speculation, top_p=0.5) for j in range(BATCH - 1)]
        batched = [
            run([*prompts[REQUESTS:], prompts[i]][-BATCH:], [*others, config(i, speculation)])[-1]
            for i in range(REQUESTS)
        ]
        rerun = sum(a != b for a, b in zip(alone, again, strict=True))
        moved = sum(a != b for a, b in zip(alone, batched, strict=True))
        print(
            f"{name}: {rerun} of {REQUESTS} seeded requests differ between two lone runs, "
            f"{moved} of {REQUESTS} between alone and last of a batch of {BATCH}"
        )


if __name__ == "__main__":
    main(*(sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()))
