"""Block verification: the exact model (simulators/block.py) against the torch reference's
samples, the paper's guarantee exactly on many pairs, and the reduction to token-wise at K = 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from spectest.simulators.block import block_tokens_per_pass, token_wise_tokens_per_pass

from spectest.cases.toy_models import DRAFT_KINDS, distribution_pairs
from spectest.cli import main
from spectest.implementations.block import verify
from spectest.statistics.chisquare import Group, chisquare_groups

LEVEL = 1e-6


def pair(seed: int, k: int, v: int, draft_kind: str = "far") -> tuple[np.ndarray, np.ndarray]:
    p, q = distribution_pairs(np.random.default_rng(seed), k + 1, v, "dirichlet", draft_kind)
    return p, q[:k]


@pytest.mark.parametrize(("k", "v", "draft_kind"), [(3, 4, "far"), (4, 3, "close"), (2, 6, "zero_heavy")])
def test_reference_lengths_follow_the_exact_block_model(k, v, draft_kind):
    p, q = pair(k * 10 + v, k, v, draft_kind)
    n = 100_000
    gen = torch.Generator().manual_seed(k + v)
    drafts = torch.stack([torch.multinomial(torch.tensor(q[i]), n, True, generator=gen) for i in range(k)], dim=1)
    out = verify(drafts, torch.tensor(q).expand(n, k, v), torch.tensor(p).expand(n, k + 1, v), generator=gen)
    lengths = (out != -1).sum(dim=1).numpy() - 1
    exact = block_tokens_per_pass(p, q).probs
    group = Group(np.bincount(lengths, minlength=k + 1), exact)
    assert chisquare_groups("block lengths", [group], alpha=LEVEL).p_value > LEVEL


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 4),
    v=st.integers(2, 6),
    draft_kind=st.sampled_from([d for d in DRAFT_KINDS if d != "one_hot"]),
)
def test_block_never_accepts_less_than_token_wise(seed, k, v, draft_kind):
    """The paper's guarantee, exactly: E[L] under block verification >= token-wise, any pair."""
    p, q = pair(seed, k, v, draft_kind)
    block, token_wise = block_tokens_per_pass(p, q), token_wise_tokens_per_pass(p, q)
    assert block.probs.sum() == pytest.approx(1.0)
    assert block.mean >= token_wise.mean - 1e-12


def test_one_draft_is_token_wise():
    p, q = pair(3, 1, 5)
    np.testing.assert_allclose(block_tokens_per_pass(p, q).probs, token_wise_tokens_per_pass(p, q).probs, atol=1e-12)


def test_enumeration_limit_is_named():
    p, q = pair(4, 6, 20)
    with pytest.raises(ValueError, match="max_sequences"):
        block_tokens_per_pass(p, q, max_sequences=1000)


def test_simulate_block_cli(capsys):
    assert main(["simulate", "--block", "--k", "3", "--vocab", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "spectest.simulate-block/1" and out["gain"] >= 1.0
    assert out["block"]["k"] == 3
