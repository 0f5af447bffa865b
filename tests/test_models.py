"""Toy models and the harness loop: exact probabilities, draft kinds, sequence bookkeeping."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest import strategies as sst
from spectest.cases.toy_models import DRAFT_KINDS, TARGET_KINDS, distribution_pair, markov_pair
from spectest.implementations.reference import verify
from spectest.protocol import Model, build_model
from spectest.sampling import make_generator
from spectest.suite.loop import generate, sequence_index


@settings(max_examples=50)
@given(st.integers(2, 300), st.sampled_from(TARGET_KINDS), st.sampled_from(DRAFT_KINDS), sst.seeds())
def test_every_pair_kind_is_a_pair_of_distributions(vocab, target_kind, draft_kind, seed):
    p, q = distribution_pair(np.random.default_rng(seed), vocab, target_kind, draft_kind)
    for dist in (p, q):
        assert dist.shape == (vocab,) and (dist >= 0).all() and abs(dist.sum() - 1) < 1e-12
    if draft_kind == "disjoint":
        assert ((p > 0) & (q > 0)).sum() == 0
    if draft_kind == "zero_heavy":
        assert q[p == 0].sum() >= 0.8 - 1e-9
    if draft_kind == "equal":
        assert (p == q).all()
    if draft_kind == "one_hot":
        assert (q == 1).sum() == 1
    if target_kind == "one_hot" and draft_kind not in ("disjoint", "zero_heavy"):  # those force a sparse target
        assert (p == 1).sum() == 1


def test_markov_sequence_probabilities_are_exact():
    target, _ = markov_pair(np.random.default_rng(0), 3, "sparse", "far")
    probs = target.sequence_probs(4)
    assert abs(probs.sum() - 1) < 1e-12
    for seq in itertools.product(range(3), repeat=4):
        expected = target.table[3, seq[0]] * np.prod([target.table[a, b] for a, b in itertools.pairwise(seq)])
        index = int(sequence_index(torch.tensor([seq]), 3))
        assert probs[index] == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_generate_produces_full_sequences_and_counts_passes(k):
    target, draft = markov_pair(np.random.default_rng(1), 4, "dirichlet", "close")
    run = generate(
        Model("reference", verify),
        target,
        draft,
        n_sequences=500,
        length=9,
        k=k,
        draft_generator=make_generator(1),
        verify_generator=make_generator(2),
        device=torch.device("cpu"),
    )
    assert run.tokens.shape == (500, 9) and ((run.tokens >= 0) & (run.tokens < 4)).all()
    assert run.passes >= -(-9 // (k + 1))
    assert ((run.tokens_per_pass >= 1) & (run.tokens_per_pass <= k + 1)).all()


def test_equal_draft_emits_k_plus_one_every_pass():
    target, draft = markov_pair(np.random.default_rng(2), 3, "dirichlet", "equal")
    run = generate(
        Model("reference", verify),
        target,
        draft,
        n_sequences=200,
        length=8,
        k=3,
        draft_generator=make_generator(1),
        verify_generator=make_generator(2),
        device=torch.device("cpu"),
    )
    assert run.passes == 2 and (run.tokens_per_pass == 4).all()


def test_a_one_hot_verifier_reaches_each_position_as_its_plan_says():
    """A verifier that takes each draft as one-hot (accepts draft x with probability p(x): tests/verifiers'
    ignores_draft_probs, vLLM's draft_probs=None) reaches position i with probability prod_{j<i} sum q_j p_j, which
    the per-position checks plan from when it declares spectest_one_hot_drafts; standard rejection's
    prod_{j<i} sum min(p_j, q_j) overstates it, and a check planned from that falls short of its detectable TV."""
    from spectest.suite.positions import reach_probabilities
    from tests.verifiers.correct import ignores_draft_probs

    rng = np.random.default_rng(3)
    batch, k, vocab, copies = 4, 3, 6, 20_000
    target = rng.dirichlet(np.ones(vocab), size=(batch, k + 1))
    draft = rng.dirichlet(np.ones(vocab), size=(batch, k))
    generator = make_generator(3)
    q = torch.from_numpy(draft).repeat(copies, 1, 1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(-1, k)
    emitted = ignores_draft_probs(drafts, q, torch.from_numpy(target).repeat(copies, 1, 1), generator=generator)
    reached = (emitted != -1).reshape(copies, batch, k + 1).double().mean(0).numpy()

    def z(planned: np.ndarray) -> np.ndarray:
        return (reached - planned) / np.sqrt(planned * (1 - planned) / copies + 1e-300)

    assert np.abs(z(reach_probabilities(target, draft, one_hot=True))[:, 1:]).max() < 5
    assert z(reach_probabilities(target, draft))[:, 1:].min() < -10  # the standard plan expects far more
    assert build_model("o", "o", ignores_draft_probs, ignores_draft_probs).one_hot_drafts
