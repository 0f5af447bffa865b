"""Reproduction without spectest: vLLM 0.32's synthetic rejection method accepts a draft the target gives
probability zero, and a greedy row's draft that is not the target's argmax.

vLLM V1's ``rejection_sample`` (``vllm/v1/sample/rejection_sampler.py``, its Triton kernels in Triton's interpreter
on the CPU) on 4000 rows of one draft each, vocabulary 4: the target's logits put all mass on tokens 0 and 1
(``-inf`` elsewhere), the draft proposes token 3 (its probabilities one-hot at 3). Standard rejection sampling must
reject it every time (p(3) = 0); with ``synthetic_mode`` and a conditional rate of 0.6 it comes out in about 60% of
the rows, sampled and greedy alike. Prints, for each mode and temperature, how often token 3 was emitted first.

    .venv-vllm/bin/python tests/engines/repro/vllm_synthetic_acceptance.py

The synthetic method is a benchmarking mode (``SpeculativeConfig.rejection_sample_method="synthetic"``): it accepts
at configured rates whatever p and q say, by design. This shows what it gives up, not a defect.
"""

from __future__ import annotations

import dataclasses
import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: its kernels run on CPU tensors

import torch
from triton.backends import backends

# vLLM's CPU build uses Triton only when Triton has a "cpu" backend (vllm/triton_utils/importing.py): present the
# interpreter as one for that import, so vLLM loads its real kernels instead of a placeholder.
backends["cpu"] = type("Interpreter", (), {"driver": None, "compiler": None})()
importlib.import_module("vllm.triton_utils")
del backends["cpu"]

from vllm.v1.sample import rejection_sampler  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402

ROWS, VOCAB, DRAFT, RATE = 4000, 4, 3, 0.6


def metadata(temperature: torch.Tensor) -> SamplingMetadata:
    greedy = temperature == 0
    values = {
        "temperature": temperature,
        "all_greedy": bool(greedy.all()),
        "all_random": not bool(greedy.any()),
        "top_p": None,
        "top_k": None,
        "generators": {},
        "max_num_logprobs": None,
        "no_penalties": True,
        "prompt_token_ids": None,
        "frequency_penalties": torch.zeros(ROWS),
        "presence_penalties": torch.zeros(ROWS),
        "repetition_penalties": torch.ones(ROWS),
        "output_token_ids": [[] for _ in range(ROWS)],
        "allowed_token_ids_mask": None,
        "bad_words_token_ids": {},
        "logitsprocs": LogitsProcessors(),
    }
    fields = {field.name for field in dataclasses.fields(SamplingMetadata)}
    return SamplingMetadata(**{k: v for k, v in values.items() if k in fields})


def first_tokens(synthetic: bool, temperature: float) -> torch.Tensor:
    torch.manual_seed(0)
    logits = torch.tensor([0.0, 0.0, float("-inf"), float("-inf")]).repeat(ROWS, 1)
    draft_probs = torch.zeros(ROWS, VOCAB)
    draft_probs[:, DRAFT] = 1.0
    out = rejection_sampler.rejection_sample(
        torch.full((ROWS,), DRAFT, dtype=torch.int32),
        [1] * ROWS,
        1,
        torch.arange(1, ROWS + 1, dtype=torch.int32),
        draft_probs,
        logits,
        torch.zeros(ROWS, 1, dtype=torch.int32),  # the bonus token, after an accepted draft
        metadata(torch.full((ROWS,), temperature)),
        synthetic_mode=synthetic,
        synthetic_conditional_rates=torch.tensor([RATE]) if synthetic else None,
    )
    return out[:, 0]


for synthetic in (False, True):
    for temperature in (1.0, 0.0):
        share = (first_tokens(synthetic, temperature) == DRAFT).float().mean().item()
        mode = "synthetic" if synthetic else "standard "
        print(f"{mode} temperature {temperature}: draft {DRAFT} (target probability 0) emitted in {share:.3f} of rows")
