"""The processed target along an engine's output (spectest.e2e.targets): the PIT, the ambiguity rule, greedy
decisions, position groups and why an impossible token came out, held to their definitions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from spectest.e2e.targets import (
    explain_exclusion,
    fragile,
    greedy_decisions,
    included_when_favoured,
    pit,
    position_group,
)
from spectest.sampling import make_generator, sample_categorical
from spectest.sampling_params import SamplingParams, process_logits


def _rows(n: int, vocab: int, seed: int) -> tuple[torch.Tensor, SamplingParams]:
    rng = np.random.default_rng(seed)
    logits = torch.as_tensor(rng.normal(0, 2.5, size=(n, vocab)))
    params = SamplingParams.build(
        n,
        temperature=rng.uniform(0.4, 1.5, n).tolist(),
        top_k=np.where(rng.random(n) < 0.3, rng.integers(1, vocab, n), 0).tolist(),
        top_p=np.where(rng.random(n) < 0.3, rng.uniform(0.5, 0.98, n), 1.0).tolist(),
        min_p=np.where(rng.random(n) < 0.3, rng.uniform(0.01, 0.2, n), 0.0).tolist(),
    )
    return logits, params


@pytest.mark.parametrize("by", ["id", "probability"])
def test_the_pit_of_exact_samples_is_uniform_and_of_wrong_ones_is_not(by):
    """Tokens drawn from the processed target give Uniform(0, 1) PITs (KS at 1e-6); tokens drawn at
    the wrong temperature do not."""
    logits, params = _rows(20000, 40, 1)
    probs = process_logits(logits.unsqueeze(1), params).squeeze(1)
    generator = make_generator(2)
    tokens = sample_categorical(probs, generator)
    v = torch.rand(len(tokens), generator=generator, dtype=torch.float64)
    assert stats.kstest(pit(probs, tokens, v, by).numpy(), "uniform").pvalue > 1e-6
    hot = SamplingParams(**{**params.__dict__, "temperature": params.temperature * 0.5})
    wrong = sample_categorical(process_logits(logits.unsqueeze(1), hot).squeeze(1), generator)
    assert stats.kstest(pit(probs, wrong, v, by).numpy(), "uniform").pvalue < 1e-6


def test_ambiguity_is_a_flip_under_a_relative_perturbation_of_1e_4():
    logits = torch.tensor([[3.0, 2.0, 2.0 - 1e-5, 0.5], [3.0, 2.0, 1.0, 0.5]], dtype=torch.float64)
    params = SamplingParams.build(2, top_k=2)
    probs = process_logits(logits.unsqueeze(1), params).squeeze(1)
    assert probs[0, 2] == 0 and probs[1, 2] == 0
    favoured = included_when_favoured(logits, torch.tensor([2, 2]), params, ("top_k", "top_p", "min_p"))
    assert favoured.tolist() == [True, False]  # 2e-5 below the k-th logit: ambiguous; 1 below: impossible
    assert fragile(logits, probs, params, ("top_k", "top_p", "min_p")).tolist() == [True, False]


def test_greedy_decisions_follow_the_tie_rule_and_skip_near_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0], [1.0, 3.0, 3.0 - 1e-6], [1.0, 3.0, 2.0]], dtype=torch.float64)
    ok, near = greedy_decisions(logits, torch.tensor([2, 2, 2]), "lowest-id")
    assert ok.tolist() == [False, True, False] and near.tolist() == [False, True, False]
    ok, _ = greedy_decisions(logits, torch.tensor([2, 2, 1]), "any")
    assert ok.tolist() == [True, True, True]


def test_positions_group_by_doubling():
    assert [position_group(t) for t in range(9)] == [0, 1, 2, 2, 3, 3, 3, 3, 4]


def test_an_impossible_token_is_explained_by_the_parameter_or_the_order_that_excludes_it():
    """A token the processed target excludes is explained: by each filter that, ignored alone, would keep
    it (a server that lost it), by all of them together, or by another place for temperature (the
    engine's order is not the declared one); a masked id by its logit."""
    logits = torch.tensor([0.0, -1.0, -2.0, -3.0, -4.0, -5.0], dtype=torch.float64)
    declared = ("top_k", "top_p", "min_p")  # temperature first
    one = lambda **p: SamplingParams.build(1, **p)  # noqa: E731
    assert explain_exclusion(logits, 4, one(top_k=2), declared).endswith("possible if the engine ignored top_k=2")
    assert "5th most likely of 6" in explain_exclusion(logits, 4, one(top_k=2), declared)
    both = explain_exclusion(logits, 4, one(top_k=2, min_p=0.2), declared)
    assert both.endswith("ignored all of top_k=2, min_p=0.2"), both
    # min-p 0.2 on the tempered distribution (T = 0.3, declared) drops id 1 (ratio e^-1 = 0.37 untempered,
    # 0.036 tempered); an engine that ignores min-p, or filters before temperature, keeps it.
    moved = explain_exclusion(logits, 1, one(temperature=0.3, min_p=0.2), declared)
    assert moved.endswith(
        "ignored min_p=0.2, or applied them in the order top_k, top_p, min_p, temperature "
        "(declared: temperature, top_k, top_p, min_p)"
    ), moved
    far = torch.tensor([0.0, -1e4], dtype=torch.float64)
    assert "0 even unfiltered" in explain_exclusion(far, 1, one(), declared)
    masked = logits.clone()
    masked[3] = float("-inf")
    assert "-inf" in explain_exclusion(masked, 3, one(top_k=2), declared)
