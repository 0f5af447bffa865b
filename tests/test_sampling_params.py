"""Sampling parameters: the processed distribution, the case builder's margins, the contracts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest import strategies as sst
from spectest.cases.logits import MIN_P_GAP, TOP_K_GAP, TOP_P_GAP
from spectest.implementations.sampler import REFERENCE
from spectest.protocol import ContractViolation, Model, build_model, call_propose, call_verify_logits
from spectest.resolve import ModelSpecError, resolve_model
from spectest.sampling import make_generator
from spectest.sampling_params import NO_SEED, SamplingParams, process_logits


def plain_processed(logits: np.ndarray, t: float, top_k: int, top_p: float, min_p: float, order) -> np.ndarray:
    """One distribution, written out the slow obvious way (independent of process_logits)."""
    if t == 0:
        out = np.zeros_like(logits, dtype=np.float64)
        out[int(np.argmax(logits))] = 1.0
        return out

    def softmax(z):
        e = np.exp(z - z.max())
        return e / e.sum()

    tempered = softmax(logits.astype(np.float64) / np.float64(np.float32(t)))
    probs = softmax(logits.astype(np.float64)) if "temperature" in order else tempered
    for name in order:
        if name == "temperature":  # what the filters so far kept, now at the request's temperature
            probs = np.where(probs > 0, tempered, 0.0)
            probs /= probs.sum()
            continue
        ranked = sorted(range(len(probs)), key=lambda i: -probs[i])
        keep = set(range(len(probs)))
        if name == "top_k" and 0 < top_k < len(probs):  # the k most likely, and every token tied with the k-th
            keep = {i for i in range(len(probs)) if probs[i] >= probs[ranked[top_k - 1]]}
        elif name == "top_p" and np.float32(top_p) < 1:
            mass, keep = 0.0, set()
            for i in ranked:
                if mass >= np.float32(top_p):
                    break
                keep.add(i)
                mass += probs[i]
        elif name == "min_p" and min_p > 0:
            keep = {i for i in range(len(probs)) if probs[i] >= np.float32(min_p) * probs.max()}
        probs = np.array([p if i in keep else 0.0 for i, p in enumerate(probs)])
        probs /= probs.sum()
    return probs


@settings(max_examples=60, deadline=None)
@given(
    case=sst.logits_cases(batch=st.integers(1, 6), k=st.integers(1, 3), vocab=st.integers(2, 60)),
    order=st.permutations(("top_k", "top_p", "min_p")) | st.permutations(("top_k", "top_p", "min_p", "temperature")),
)
def test_processed_distribution_matches_the_plain_definition(case, order):
    inputs = sst.build_logits(case, order=tuple(order))
    params = inputs.params
    for b in range(case.batch):
        for i in range(case.k + 1):
            want = plain_processed(
                inputs.target_logits[b, i],
                float(params.temperature[b]),
                int(params.top_k[b]),
                float(params.top_p[b]),
                float(params.min_p[b]),
                order,
            )
            np.testing.assert_allclose(inputs.target[b, i], want, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(case=sst.logits_cases(batch=st.integers(1, 8), k=st.integers(1, 4), vocab=st.integers(2, 3000)))
def test_parameters_are_clear_of_their_decision_boundaries(case):
    """Every chosen parameter is decided the same way by float32 and float64 at every position."""
    inputs = sst.build_logits(case)
    logits = np.concatenate([inputs.target_logits, inputs.draft_logits], axis=1).astype(np.float64)
    p = inputs.params
    for b in range(case.batch):
        t = float(p.temperature[b])
        if t == 0:  # the top logit exactly tied, or clear of the next one below it
            top = logits[b].max(axis=-1, keepdims=True)
            below = np.where(logits[b] < top, logits[b], -np.inf).max(axis=-1)
            assert np.all(top[:, 0] - below > 1e-3)
            continue
        # A float32 pipeline keeps exactly the tokens float64 keeps.
        as32 = process_logits(torch.as_tensor(logits[b : b + 1], dtype=torch.float32), p.take(torch.tensor([b])))
        as64 = process_logits(torch.as_tensor(logits[b : b + 1]), p.take(torch.tensor([b])))
        # Compare every token float64 keeps where float32 can hold its probability at all (softmax
        # underflow is not a filter decision), and every token float64 filters out.
        decided = (as64[0] == 0) | (as64[0] > torch.finfo(torch.float32).tiny)
        assert torch.equal((as32[0] > 0)[decided], (as64[0] > 0)[decided])
    assert TOP_K_GAP > 0 and TOP_P_GAP > 0 and MIN_P_GAP > 0


def test_greedy_rows_are_one_hot_at_the_first_argmax():
    logits = torch.tensor([[[0.0, 3.0, 1.0, 3.0]]])
    probs = process_logits(logits, SamplingParams.build(1, temperature=0.0, top_p=0.5))
    assert probs.tolist() == [[[0.0, 1.0, 0.0, 0.0]]]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"min_p": 1.5}, "min_p"),
        ({"temperature": [1.0, 2.0]}, "expected 3 values"),
    ],
)
def test_impossible_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams.build(3, **kwargs)


def test_capabilities_are_discovered_and_declared():
    assert {"logits", "propose", "per-row-seeds", "standard-rejection"} <= resolve_model("reference").capabilities

    class ChainOnly:
        def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
            return None

    model = build_model("chain", "chain", ChainOnly(), ChainOnly().verify)
    assert model.capabilities == frozenset({"strided-inputs"}) and model.verify_logits is None


def test_a_bad_declared_filter_order_is_a_usage_error(tmp_path):
    source = tmp_path / "odd.py"
    source.write_text(
        "class S:\n    spectest_filter_order = ('top_k', 'top_k', 'min_p')\n"
        "    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator): pass\ns = S()\n"
    )
    with pytest.raises(ModelSpecError, match="spectest_filter_order must list each"):
        resolve_model(f"{source}:s")


def test_reference_verify_logits_keeps_the_output_contract():
    inputs = sst.build_logits(sst.LogitsCase(batch=6, k=3, vocab=50, seed=1))
    draft_logits, target_logits, params = inputs.tensors(torch.device("cpu"))
    model = resolve_model("reference")
    drafts = torch.zeros((6, 3), dtype=torch.int64)
    emitted = call_verify_logits(model, drafts, draft_logits, target_logits, params, make_generator(0))
    assert emitted.shape == (6, 4)


def proposing(value):
    return Model("fake", lambda *a, **k: None, propose=lambda logits, params, *, generator: value)


LOGITS = torch.zeros((2, 3, 5))
PARAMS = SamplingParams.build(2)


@pytest.mark.parametrize(
    "output, rule",
    [
        (
            torch.zeros((2, 3), dtype=torch.int64),
            "propose returns (draft_token_ids int64 [B, K], draft_probs [B, K, V])",
        ),
        ((torch.zeros((2, 3)), torch.full((2, 3, 5), 0.2)), "propose returns"),
        ((torch.zeros((2, 2), dtype=torch.int64), torch.full((2, 3, 5), 0.2)), "propose returns"),
        ((torch.full((2, 3), 5), torch.full((2, 3, 5), 0.2)), "drafted ids lie in [0, V)"),
        ((torch.zeros((2, 3), dtype=torch.int64), torch.full((2, 3, 5), 0.3)), "draft_probs are distributions"),
        (
            (torch.zeros((2, 3), dtype=torch.int64), torch.full((2, 3, 5), float("nan"))),
            "draft_probs are distributions",
        ),
    ],
)
def test_each_propose_rule_is_enforced(output, rule):
    with pytest.raises(ContractViolation) as info:
        call_propose(proposing(output), LOGITS, PARAMS, torch.Generator())
    assert info.value.rule.startswith(rule) and "[fake]" in str(info.value)


def test_reference_propose_samples_its_reported_distribution():
    inputs = sst.build_logits(sst.LogitsCase(batch=4, k=2, vocab=30, seed=3))
    draft_logits, _, params = inputs.tensors(torch.device("cpu"))
    tokens, probs = REFERENCE.propose(draft_logits, params, generator=make_generator(1))
    assert torch.allclose(probs.double(), torch.as_tensor(inputs.draft), atol=1e-6)
    assert bool((probs.gather(-1, tokens.unsqueeze(-1)) > 0).all())


def test_seeded_rows_replay_and_unseeded_rows_follow_the_generator():
    """Rows 0-3 carry seeds, rows 4-7 none: under two different generators the seeded rows give the
    same output, the unseeded ones (drawn from the generator) do not, over 200 repetitions each."""
    inputs = sst.build_logits(sst.LogitsCase(batch=8, k=4, vocab=40, seed=4, greedy_share=0.0, seeded=True))
    draft_logits, target_logits, params = inputs.tensors(torch.device("cpu"))
    params = dataclasses.replace(params, seed=torch.where(torch.arange(8) < 4, params.seed, NO_SEED))
    many = params.repeat(200)
    drafts = torch.zeros((8 * 200, 4), dtype=torch.int64)
    repeat = lambda t: t.repeat(200, 1, 1)  # noqa: E731
    first, second = (
        REFERENCE.verify_logits(drafts, repeat(draft_logits), repeat(target_logits), many, generator=make_generator(g))
        for g in (1, 2)
    )
    same = (first == second).all(dim=1).view(200, 8)
    assert bool(same[:, :4].all())  # seeded rows: identical, whatever the generator
    assert not bool(same[:, 4:].all())  # unseeded rows: they follow the generator, so some differ


def test_greedy_with_any_tie_accepts_every_tied_choice_and_nothing_else():
    """The "any" tie-break rule of the greedy property, on a hand-made pass: top tokens tied at
    every position (tokens 1 and 2), K = 2."""
    from spectest.properties.test_sampling_params import greedy_with_any_tie

    tied = np.zeros((1, 3, 4), dtype=bool)
    tied[0, :, 1:3] = True
    drafts = np.array([[1, 3]])
    passes = {
        (1, 2, -1): True,  # draft 1 kept (tied top), then another top token instead of draft 3
        (2, -1, -1): True,  # draft 1 not kept: the other tied top token instead
        (1, 1, -1): True,
        (1, 3, -1): False,  # draft 3 is not a top token: it may not come out
        (0, -1, -1): False,  # not a top token
        (1, -1, -1): False,  # equal to the draft: a greedy verifier would have kept it and gone on
    }
    for tokens, ok in passes.items():
        assert greedy_with_any_tie(drafts, np.array([tokens]), tied)[0] == ok, tokens
