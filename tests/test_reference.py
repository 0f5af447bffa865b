"""The reference sampler and the sampling helper: exact rules, dtypes, devices, no zero-probability draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest import strategies as sst
from spectest.cases.tensors import draw_drafts, to_tensor
from spectest.implementations.reference import verify
from spectest.protocol import Model, call_verify
from spectest.sampling import make_generator, sample_categorical

REFERENCE = Model("reference", verify)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2**32), st.integers(2, 300), st.floats(0, 0.9))
def test_sample_categorical_never_draws_zero_weight(seed, vocab, zero_fraction):
    rng = np.random.default_rng(seed)
    weights = rng.random((64, vocab))
    weights[rng.random((64, vocab)) < zero_fraction] = 0
    weights[:, rng.integers(vocab)] = 1e-30
    draws = sample_categorical(torch.as_tensor(weights), make_generator(seed))
    assert (torch.as_tensor(weights).gather(1, draws.unsqueeze(1)) > 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=15, deadline=None)
@given(
    case=sst.chain_cases(batch=st.integers(1, 96), k=sst.draft_lengths(max_k=16), vocab=sst.vocab_sizes(max_size=4097))
)
def test_reference_obeys_the_contract(device, dtype, case):
    target_np, draft_np = sst.build_chain(case)
    dev = torch.device(device)
    target, draft = to_tensor(target_np, device=dev, dtype=dtype), to_tensor(draft_np, device=dev, dtype=dtype)
    drafts = draw_drafts(draft, make_generator(case.seed, dev))
    emitted = call_verify(REFERENCE, drafts, draft, target, make_generator(case.seed + 1, dev))
    assert emitted.shape == (case.batch, case.k + 1)
    n = (emitted != -1).sum(1)
    rows = torch.arange(case.batch, device=dev)
    last = emitted[rows, n - 1]
    assert (target[rows, n - 1, last] > 0).all(), "the extra token must have target probability > 0"


def test_reference_accepts_equal_probabilities_with_certainty():
    gen = make_generator(0)
    q = torch.rand((256, 8, 50), generator=gen).softmax(-1)
    target = torch.cat([q, q[:, :1]], dim=1)
    drafts = draw_drafts(q, gen)
    emitted = verify(drafts, q, target, generator=gen)
    assert (emitted[:, :8] == drafts).all()


def test_reference_matches_hand_computed_acceptance():
    """p(d)/q(d) = 0.25: the acceptance rate over 40k rows lies in a 1e-6 binomial interval."""
    n = 40_000
    q = torch.tensor([[[0.8, 0.2]]]).expand(n, 1, 2).contiguous()
    p = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]]).expand(n, 2, 2).contiguous()
    emitted = verify(torch.zeros((n, 1), dtype=torch.int64), q, p, generator=make_generator(3))
    accepted = int(((emitted != -1).sum(1) == 2).sum())
    from scipy.stats import binomtest

    assert binomtest(accepted, n, 0.25).pvalue > 1e-6
    # On rejection the residual max(0, p - q) = [0, 0.6] forces token 1.
    assert (emitted[(emitted != -1).sum(1) == 1, 0] == 1).all()


@pytest.mark.parametrize("vocab", [2, 5, 255, 256, 257, 1000, 32000, 128256])
def test_blocked_inverse_cdf_lands_on_the_cell_whose_step_holds_the_uniform(vocab):
    """Exact: a uniform in the middle of cell i's CDF step must return i, zero cells included in
    the rows; and the largest uniform never returns a zero-weight cell."""
    from spectest.sampling import inverse_cdf_blocked

    gen = torch.Generator().manual_seed(vocab)
    rows = 64
    weights = torch.rand((rows, vocab), generator=gen)
    weights[torch.rand((rows, vocab), generator=gen) < 0.5] = 0
    weights[:, 0] += (weights.sum(-1) == 0).float()
    cdf = weights.double().cumsum(-1)
    cell = torch.multinomial((weights > 0).float(), 1, generator=gen).squeeze(1)
    low = torch.where(cell > 0, cdf.gather(1, (cell - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    high = cdf.gather(1, cell.unsqueeze(1)).squeeze(1)
    assert torch.equal(inverse_cdf_blocked(weights, (low + high) / 2 / cdf[:, -1]), cell)
    top = inverse_cdf_blocked(weights, torch.full((rows,), 1 - 2**-53, dtype=torch.float64))
    assert bool((weights.gather(1, top.unsqueeze(1)) > 0).all())
