"""Exactness for any draft: emitted tokens must be distributed exactly as the target says.

(a) Whole sequences from repeated verify calls on a context-dependent Markov pair, tested
against the exact L-token joint. (b) Single calls whose rows and positions all differ, tested
per row and position. A token of target probability zero must never appear (exact).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from spectest import rules
from spectest import strategies as sst
from spectest.cases.tensors import repeat_rows, to_tensor
from spectest.cases.toy_models import markov_pair
from spectest.sampling import RepeatedCategorical
from spectest.suite.loop import generate, sequence_index
from spectest.suite.positions import check_every_position

POSITIONS = sst.CaseRanges(batch=(65, 96), k=(1, 8), vocab=(2, 1536))
MAX_SEQUENCES = 400_000  # per case; the plan asks for fewer (see spectest.engine.checks)
MAX_CASE_ELEMENTS = 400_000_000  # probabilities handed to the verifier per case, over all calls
MAX_CALL_ELEMENTS = 8_000_000  # per verify call


@pytest.mark.spec_property(examples=8, explicit=2, checks=1)
def test_sequences_follow_the_target(spec) -> None:
    def body(case: sst.MarkovCase) -> None:
        started = time.perf_counter()
        target, draft = markov_pair(np.random.default_rng(case.seed), case.vocab, case.target_kind, case.draft_kind)
        shape = [case.vocab] * case.length
        probs = target.sequence_probs(case.length)
        check = spec.distribution(
            rules.JOINT,
            probs[None, :],
            case_seed=case.seed,
            tokens=case.length,
            min_draws=1000,
            max_draws=MAX_SEQUENCES,
            cell_name=lambda i: f"sequence {list(map(int, np.unravel_index(i, shape)))}",
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        passes = 0
        while not check.done:
            batch = check.next_batch(50_000)
            run = generate(
                spec.verify,
                target,
                draft,
                n_sequences=batch,
                length=case.length,
                k=case.k,
                draft_generator=draft_gen,
                verify_generator=verify_gen,
                device=spec.device,
                dtype=getattr(torch, case.dtype),
            )
            passes += run.passes
            counts = torch.bincount(sequence_index(run.tokens, case.vocab), minlength=probs.size)
            check.add(counts.cpu().numpy()[None, :], batch)
            spec.require_possible(check, lambda g, c: check.cell_name(c), str(case))
        context = f"{check.draws} sequences of {case.length} tokens through {passes} verify calls, {case}"
        spec.conclude(check, context=context, started=started)

    spec.given(
        sst.markov_cases(),
        body,
        explicit=[
            sst.MarkovCase(vocab=3, k=4, length=7, target_kind="dirichlet", draft_kind="far", seed=1),
            sst.MarkovCase(vocab=3, k=6, length=7, target_kind="sparse", draft_kind="zero_heavy", seed=2),
        ],
    )


@pytest.mark.spec_property(examples=8, explicit=1, checks=1)
def test_every_row_and_position_is_exact(spec) -> None:
    def body(case: sst.ChainCase) -> None:
        target_np, draft_np = sst.build_chain(case)
        target = to_tensor(target_np, device=spec.device, dtype=case.dtype)
        draft = to_tensor(draft_np, device=spec.device, dtype=case.dtype)
        draft_gen, verify_gen = spec.generators(case.seed)
        drafter = RepeatedCategorical(draft)

        def call(reps: int) -> torch.Tensor:
            drafts = drafter.sample(reps, draft_gen).reshape(-1, case.k)
            return spec.verify(drafts, repeat_rows(draft, reps), repeat_rows(target, reps), verify_gen)

        check_every_position(
            spec,
            target_np,
            draft_np,
            call,
            seed=case.seed,
            case=str(case),
            max_case_elements=MAX_CASE_ELEMENTS,
            max_call_elements=MAX_CALL_ELEMENTS,
        )

    spec.given(
        POSITIONS.chain_cases(),
        body,
        explicit=[
            sst.ChainCase(
                batch=80,
                k=6,
                vocab=1100,
                kinds=(("dirichlet", "far"), ("sparse", "zero_heavy"), ("peaky", "close")),
                seed=3,
            )
        ],
    )
