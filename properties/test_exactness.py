"""Exactness for any draft: emitted tokens must be distributed exactly as the target says.

(a) Whole sequences from repeated verify calls on a context-dependent Markov pair, tested
against the exact L-token joint. (b) Single calls whose rows and positions all differ, tested
per row and position, their inputs laid out in memory as engines hand them over (slices of
larger buffers, padded vocabularies, every other row, vocabulary-major; spectest.cases.layouts). A token of target probability zero must never appear (exact).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from spectest import rules
from spectest import strategies as sst
from spectest.cases.layouts import LAYOUTS, lay_out
from spectest.cases.tensors import HALF, as_given, repeat_rows
from spectest.cases.toy_models import markov_pair
from spectest.protocol import RAGGED as RAGGED_DRAFTS
from spectest.protocol import STRIDED
from spectest.sampling import RepeatedCategorical
from spectest.suite.loop import generate, sequence_index
from spectest.suite.positions import check_every_position

POSITIONS = sst.CaseRanges(batch=(65, 96), k=(1, 8), vocab=(2, 1536))
# Inputs in every layout an engine hands over (models that declare spectest_contiguous_only get contiguous ones).
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
        built_target, built_draft = sst.build_chain(case)
        target, target_np = as_given(built_target, device=spec.device, dtype=case.dtype)
        draft, draft_np = as_given(built_draft, device=spec.device, dtype=case.dtype)
        draft_gen, verify_gen = spec.generators(case.seed)
        drafter = RepeatedCategorical(draft)
        layout = case.layout if STRIDED in spec.model.capabilities else "contiguous"

        def call(reps: int) -> torch.Tensor:
            drafts = drafter.sample(reps, draft_gen).reshape(-1, case.k)
            inputs = (drafts, repeat_rows(draft, reps), repeat_rows(target, reps))
            return spec.verify(*(lay_out(tensor, layout) for tensor in inputs), verify_gen)

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

    # The explicit case: strided, tails masked on both sides, in half precision if the model takes it.
    explicit = sst.ChainCase(
        batch=80,
        k=6,
        vocab=1100,
        kinds=(("dirichlet", "far"), ("sparse", "zero_heavy"), ("masked_tail", "masked_like_target")),
        seed=3,
        dtype=next((d for d in HALF if d in spec.model.dtypes), "float32"),
        layout="vocab-padded",
    )
    spec.given(POSITIONS.chain_cases(layouts=LAYOUTS, dtypes=spec.model.dtypes), body, explicit=[explicit])


# Ragged batches: each row carries 0..K drafts (vLLM's per-request counts, FlashInfer's -1 padding).
RAGGED = sst.CaseRanges(batch=(65, 96), k=(1, 8), vocab=(2, 1024))


def ragged_inputs(case: sst.ChainCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(target [B, K + 1, V], draft [B, K, V], drafts per row [B]): past a row's count, its draft
    and target rows are padding (uniform), so a bonus taken from the wrong position shows."""
    target, draft = sst.build_chain(case)
    rng = np.random.default_rng(case.seed + 2)
    lengths = rng.integers(0, case.k + 1, size=case.batch)
    lengths[:2] = (0, case.k)  # every case has an empty row and a full one
    slots = np.arange(case.k + 1)
    target = np.where((slots[None, :] > lengths[:, None])[..., None], 1.0 / case.vocab, target)
    draft = np.where((slots[None, : case.k] >= lengths[:, None])[..., None], 1.0 / case.vocab, draft)
    return target, draft, lengths


@pytest.mark.spec_property(examples=6, explicit=1, checks=1, needs=(RAGGED_DRAFTS,))
def test_short_rows_emit_at_most_their_drafts_plus_one(spec) -> None:
    """Rows with fewer than K drafts (marked as the model declares): at most n_r + 1 tokens come
    out (exact), and each row's tokens, its bonus at position n_r included, are exact."""

    def body(case: sst.ChainCase) -> None:
        built_target, built_draft, lengths = ragged_inputs(case)
        target, target_np = as_given(built_target, device=spec.device, dtype=case.dtype)
        draft, draft_np = as_given(built_draft, device=spec.device, dtype=case.dtype)
        counts = torch.as_tensor(lengths, device=spec.device)
        draft_gen, verify_gen = spec.generators(case.seed)
        drafter = RepeatedCategorical(draft)

        def call(reps: int) -> torch.Tensor:
            drafts = drafter.sample(reps, draft_gen).reshape(-1, case.k)
            return spec.verify(
                drafts,
                repeat_rows(draft, reps),
                repeat_rows(target, reps),
                verify_gen,
                num_draft_tokens=counts.repeat(reps),
            )

        check_every_position(
            spec,
            target_np,
            draft_np,
            call,
            seed=case.seed,
            case=f"{case}, drafts per row {lengths.tolist()}",
            row_labels=[f" ({n} drafts)" for n in lengths],
            max_case_elements=MAX_CASE_ELEMENTS,
            max_call_elements=MAX_CALL_ELEMENTS,
            lengths=lengths,
        )

    explicit = sst.ChainCase(batch=72, k=5, vocab=300, kinds=(("dirichlet", "far"), ("peaky", "close")), seed=5)
    spec.given(RAGGED.chain_cases(dtypes=spec.model.dtypes), body, explicit=[explicit])
