"""One prompt, repeated across a batch: the first tokens of many requests share one context.

The PIT checks (:mod:`spectest.e2e.output`) bin each token's probability integral transform into ten
equiprobable bins, so a sampler that moves mass between neighbouring ids inside a bin (an inverse CDF
over prefix sums stored in bf16, on a 128k vocabulary) leaves them as they were. Here every request of
a call carries the same prompt and the same parameters, so their first tokens are independent draws
from one processed target p: a per-token distribution check over the engine's whole vocabulary, pooled
by probability and by id, with every token its own cell where most are expected below once
(:mod:`spectest.statistics.sparse`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from spectest import rules
from spectest.e2e.cases import EngineCase, draw_prompt
from spectest.e2e.targets import mask_tokens
from spectest.sampling_params import NO_SEED, SamplingParams, process_logits

if TYPE_CHECKING:
    from spectest.e2e.run import EngineRun

MIN_CALLS = 2
MAX_CALLS = 64  # the plan's cap: a flat target over 128k ids would ask for far more; the report says what it detects
FIRST_LOOK = 4


def one_prompt(
    case: EngineCase, vocab: int, tokens: tuple[int, ...] = (), prefix: tuple[int, ...] = ()
) -> tuple[list[int], SamplingParams]:
    """The case's prompt (of the ids the engine's prompts may hold), and its requests' shared parameters
    (temperature only, no filter, no own seed: each request draws from the run seed as the engine derives it)."""
    rng = np.random.default_rng([case.seed, 7])
    prompt = draw_prompt(rng, case.prompt_lengths[0], vocab, tokens, prefix)
    n = case.requests
    temperature = float(np.round(rng.uniform(0.7, 1.3), 3))
    params = SamplingParams.build(
        n, temperature=[temperature] * n, top_k=[0] * n, top_p=[1.0] * n, min_p=[0.0] * n, seed=[NO_SEED] * n
    )
    return prompt, params


def check_first_tokens(spec: EngineRun, case: EngineCase) -> None:
    """Calls of ``case.requests`` copies of one prompt until the check has its planned draws (or its
    time); the first token of every request against the processed target after the prompt."""
    __tracebackhide__ = True
    started = time.perf_counter()
    vocab = spec.engine.vocab_size
    prompt, params = one_prompt(case, vocab, spec.engine.prompt_tokens, spec.engine.prompt_prefix)
    logits = mask_tokens(spec.target_logits([prompt])[0, len(prompt) - 1].unsqueeze(0), spec.engine.masked_tokens)
    target = process_logits(logits.unsqueeze(1), params.take(torch.tensor([0])), order=spec.order).view(1, -1)
    probs = target.double().numpy()
    probs = probs / probs.sum()
    check = spec.distribution(
        rules.FIRST_TOKENS,
        probs,
        case_seed=case.seed,
        reach=np.array([float(case.requests)]),
        min_draws=MIN_CALLS,
        max_draws=MAX_CALLS,
        views={"by probability": [None], "by token id": [np.arange(vocab)]},
        labels=["first token: "],
        first_look=FIRST_LOOK,
        strata=np.zeros(1, dtype=np.int64),
    )
    rng = np.random.default_rng([case.seed, 8])
    calls = 0
    while not check.done:
        seed = int(rng.integers(0, 2**31 - 1))
        outputs = spec.generate([prompt] * case.requests, params, case.max_new_tokens, seed)
        calls += 1
        counts = np.bincount([row[0] for row in outputs], minlength=vocab)
        check.add(counts[None, :], 1)
        spec.require_possible(
            check,
            lambda g, c: f"the first token after prompt {prompt} ({params.describe_row(0)}): token {c}",
            case.describe(),
        )
    context = (
        f"prompt {prompt} repeated in {case.requests} requests per call ({params.describe_row(0)}), "
        f"{case.max_new_tokens} new tokens each, {calls} calls, V = {vocab}"
    )
    spec.conclude(check, context=context, started=started)
