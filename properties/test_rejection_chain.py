"""The rejection chain: a rejection at position k discards every later position.

Forced rejection: drafts before k are accepted with certainty and p(d_k) = 0 rejects d_k with
certainty, so exactly k + 1 tokens must come out and no later draft may appear, whatever
follows. Forced acceptance: every draft is accepted with certainty, so all K drafts and one
bonus token come out, the bonus distributed as target_probs[:, K] of its own row.

"Accepted with certainty" means p = q. For a model that declares ``standard-rejection`` that is
any p = q (min(1, p/q) = 1 exactly); for any other lossless verifier (one that ignores q, say)
only p = q = one-hot at the draft forces acceptance, so those rows use that.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from spectest import rules
from spectest import strategies as sst
from spectest.cases.tensors import RepeatedBatch, as_given, to_tensor
from spectest.cases.toy_models import target_distribution

REJECTIONS = sst.CaseRanges(batch=(65, 512), max_elements=20_000_000)
BONUSES = sst.CaseRanges(batch=(65, 128), k=(1, 8), vocab=(2, 1100))
REPEATS = 4  # independent verify calls per forced-rejection case (exact checks: cheap)
MAX_CASE_ELEMENTS = 400_000_000  # probabilities handed to the verifier per case, over all calls
MAX_CALL_ELEMENTS = 8_000_000  # per verify call


def certain_acceptance(draft: np.ndarray, drafts: np.ndarray, standard: bool) -> np.ndarray:
    """Draft rows that make every lossless verifier accept: q itself for a standard verifier
    (the caller sets p = q), one-hot at the drafted token otherwise."""
    if standard:
        return draft
    one_hot = np.zeros_like(draft)
    np.put_along_axis(one_hot, drafts[..., None], 1.0, axis=-1)
    return one_hot


def draw_numpy_drafts(rng: np.random.Generator, draft: np.ndarray) -> np.ndarray:
    cdf = draft.cumsum(axis=-1)
    u = rng.random(draft.shape[:-1])[..., None] * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(axis=-1), draft.shape[-1] - 1)


def forced_rejection_inputs(
    case: sst.ChainCase, standard: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Drafts, q, p and the rejection position of every row (float64 numpy)."""
    target, draft = sst.build_chain(case)
    rng = np.random.default_rng(case.seed + 1)
    b, k, v = case.batch, case.k, case.vocab
    reject_at = rng.integers(0, k, size=b)
    drafts = draw_numpy_drafts(rng, draft)
    before = np.arange(k)[None, :] < reject_at[:, None]
    draft = np.where(before[..., None], certain_acceptance(draft, drafts, standard), draft)
    for r in range(b):
        target[r, :k] = draft[r]  # p = q: certain before k, and tempting after k
        p = target_distribution(rng, v, "dirichlet")
        p[drafts[r, reject_at[r]]] = 0.0
        if p.sum() <= 0:  # only possible for V = 1
            raise ValueError("forced rejection needs V >= 2")
        target[r, reject_at[r]] = p / p.sum()
    return drafts, draft, target, reject_at


@pytest.mark.spec_property(examples=10, checks=0, cost=1.5)
def test_rejection_discards_every_later_position(spec) -> None:
    def body(case: sst.ChainCase) -> None:
        drafts_np, draft_np, target_np, reject_at = forced_rejection_inputs(case, spec.standard)
        drafts = torch.as_tensor(drafts_np, device=spec.device)
        draft = to_tensor(draft_np, device=spec.device, dtype=case.dtype)
        target = to_tensor(target_np, device=spec.device, dtype=case.dtype)
        _, verify_gen = spec.generators(case.seed)
        expected = torch.as_tensor(reject_at, device=spec.device) + 1
        for _ in range(REPEATS):
            emitted = spec.verify(drafts, draft, target, verify_gen)
            lengths = (emitted != -1).sum(dim=1)
            wrong = (lengths != expected).nonzero()
            if wrong.numel():
                r = int(wrong[0])
                spec.require(
                    False,
                    rules.REJECTION_LENGTH,
                    f"row {r}: drafts {drafts_np[r].tolist()}, p = q before position {reject_at[r]} and "
                    f"p(draft) = 0 there, so exactly {reject_at[r] + 1} tokens must come out; got "
                    f"{emitted[r].tolist()} ({case})",
                )
            rows = torch.arange(case.batch, device=spec.device)
            correction = emitted[rows, expected - 1]
            p_correction = target[rows, expected - 1, correction]
            bad = ((correction == drafts[rows, expected - 1]) | (p_correction <= 0)).nonzero()
            if bad.numel():
                r = int(bad[0])
                spec.require(
                    False,
                    rules.CORRECTION_FROM_RESIDUAL,
                    f"row {r}: rejected draft {drafts_np[r, reject_at[r]]} at position {reject_at[r]} was "
                    f"replaced by token {int(correction[r])} of target probability {float(p_correction[r]):.3g} "
                    f"({case})",
                )

    spec.given(REJECTIONS.chain_cases(dtypes=spec.model.dtypes), body)


@pytest.mark.spec_property(examples=6, checks=1, cost=2.5)
def test_all_accepted_then_bonus_from_its_own_row(spec) -> None:
    def body(case: sst.ChainCase) -> None:
        started = time.perf_counter()
        built_target, built_draft = sst.build_chain(case)
        target, target_np = as_given(built_target, device=spec.device, dtype=case.dtype)
        draft, _ = as_given(built_draft, device=spec.device, dtype=case.dtype)
        b, k, v = case.batch, case.k, case.vocab
        per_rep = b * (2 * k + 1) * v
        check = spec.distribution(
            rules.BONUS,
            target_np[:, k],
            case_seed=case.seed,
            min_draws=20,
            max_draws=max(20, MAX_CASE_ELEMENTS // per_rep),
            labels=[f"row {r}: " for r in range(b)],
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        batch = RepeatedBatch(target, draft)
        while not check.done:
            reps = check.next_batch(max(1, MAX_CALL_ELEMENTS // per_rep))
            drafts, draft_probs, target_probs = batch.draw(reps, draft_gen)
            if not spec.standard:
                draft_probs = torch.zeros_like(draft_probs).scatter_(-1, drafts.unsqueeze(-1), 1.0)
            target_probs[:, :k] = draft_probs  # p = q at every draft position: all K accepted
            emitted = spec.verify(drafts, draft_probs, target_probs, verify_gen)
            # All K accepted means K + 1 tokens: the drafts, then the bonus (a correction that happens
            # to equal its draft still leaves the bonus slot empty).
            short = ((emitted != -1).sum(dim=1) < k + 1).nonzero()
            if short.numel():
                r = int(short[0])
                spec.require(
                    False,
                    rules.EQUAL_DRAFTS_ACCEPTED,
                    f"row {r % b}: p = q at all {k} positions, drafts {drafts[r].tolist()}, got {emitted[r].tolist()} "
                    f"({case})",
                )
            rows = torch.arange(b, device=spec.device).repeat(reps)
            check.add(torch.bincount(rows * v + emitted[:, k], minlength=b * v).view(b, v).cpu().numpy(), reps)
            spec.require_possible(check, lambda g, c: f"row {g} bonus token {c} (position K={k})", str(case))
        spec.conclude(check, context=f"bonus of {check.draws} all-accepted passes per row, {case}", started=started)

    spec.given(BONUSES.chain_cases(dtypes=spec.model.dtypes), body)
