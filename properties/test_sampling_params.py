"""Logits, per-row sampling parameters, greedy rows, the draft side and per-row seeds.

These run for models that have the capability (``verify_logits``, ``propose``, declared
``per-row-seeds``) and skip, saying so, for the others. The expected distribution of a row is
the *processed* target: what plain sampling with that row's temperature, top-k, top-p and min-p
would draw from (see ``spectest.sampling_params``).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import strategies as st

from spectest import rules
from spectest import strategies as sst
from spectest.cases.tensors import repeat_rows
from spectest.protocol import LOGITS, PAD, PER_ROW_SEEDS, PROPOSE
from spectest.sampling import RepeatedCategorical, make_generator
from spectest.sampling_params import SamplingParams
from spectest.suite.positions import check_every_position

MAX_CASE_ELEMENTS = 60_000_000
MAX_CALL_ELEMENTS = 8_000_000
RANGES = sst.CaseRanges(batch=(8, 24), k=(1, 6), vocab=(2, 1024))
GREEDY = sst.CaseRanges(batch=(1, 32), k=(1, 8), vocab=(2, 32000))
SEEDED = sst.CaseRanges(batch=(4, 24), k=(1, 6), vocab=(2, 1024))
CASES = RANGES.logits_cases()
# Every run sees a batch that mixes greedy rows, temperatures and every filter row by row.
MIXED = sst.LogitsCase(batch=24, k=4, vocab=700, seed=7, greedy_share=0.25, filter_share=0.6, masked_share=0.3)
# ... and one where every sampled row uses a single filter, each filter in a third of the rows.
# Its top logits tie in every row, so its top-k rows cut through a tie (top-k keeps the whole tie).
ONE_FILTER_EACH = sst.LogitsCase(
    batch=12, k=3, vocab=500, seed=8, greedy_share=0.0, filter_plan="one each", tie_share=1.0
)


def build(spec, case: sst.LogitsCase) -> sst.LogitsInputs:
    return sst.build_logits(case, supported=spec.model.sampling_params, order=spec.model.filter_order)


@pytest.mark.spec_property(examples=5, explicit=2, checks=1, needs=(LOGITS,), cost=3)
def test_logits_rows_follow_the_processed_target(spec) -> None:
    """Every row and position is exact against its processed target, parameters mixed row by row."""

    def body(case: sst.LogitsCase) -> None:
        inputs = build(spec, case)
        draft_logits, target_logits, params = inputs.tensors(spec.device)
        draft_gen, verify_gen = spec.generators(case.seed)
        drafter = RepeatedCategorical(torch.as_tensor(inputs.draft, device=spec.device))

        def call(reps: int) -> torch.Tensor:
            drafts = drafter.sample(reps, draft_gen).reshape(-1, case.k)
            return spec.verify_logits(
                drafts,
                repeat_rows(draft_logits, reps),
                repeat_rows(target_logits, reps),
                params.repeat(reps),
                verify_gen,
            )

        check_positions(spec, case, inputs, call)

    spec.given(CASES, body, explicit=[MIXED, ONE_FILTER_EACH])


def check_positions(spec, case: sst.LogitsCase, inputs: sst.LogitsInputs, call) -> None:
    """Every (row, position) of ``call``'s output against the case's processed target, the rows labelled by
    their parameters: what both ways in (the harness's drafts, the model's own proposals) are held to."""
    __tracebackhide__ = True
    check_every_position(
        spec,
        inputs.target,
        inputs.draft,
        call,
        seed=case.seed,
        case=str(case),
        row_labels=inputs.row_labels(),
        max_case_elements=MAX_CASE_ELEMENTS,
        max_call_elements=MAX_CALL_ELEMENTS,
    )


def greedy_expectation(drafts: np.ndarray, argmax: np.ndarray) -> np.ndarray:
    """Greedy decoding's output for one pass: drafts while they equal the target's argmax, then the argmax."""
    batch, k = drafts.shape
    matches = np.cumprod(drafts == argmax[:, :k], axis=1).sum(axis=1)
    expected = np.full((batch, k + 1), PAD, dtype=np.int64)
    for row, n in enumerate(matches):
        expected[row, :n] = drafts[row, :n]
        expected[row, n] = argmax[row, n]
    return expected


def greedy_with_any_tie(drafts: np.ndarray, emitted: np.ndarray, tied: np.ndarray) -> np.ndarray:
    """Per row: is ``emitted`` a greedy pass when any tied top token may be chosen? Drafts are kept
    while each is one of its position's top tokens; the last token is a top token, and (before K)
    not the draft, which would have been kept."""
    batch, k = drafts.shape
    ok = np.ones(batch, dtype=bool)
    for row in range(batch):
        tokens = emitted[row][emitted[row] != PAD]
        n = tokens.size - 1
        kept = bool((tokens[:n] == drafts[row, :n]).all()) and bool(tied[row, np.arange(n), drafts[row, :n]].all())
        last = 0 <= tokens[-1] < tied.shape[-1] and bool(tied[row, n, tokens[-1]])
        ok[row] = kept and last and (n == k or tokens[-1] != drafts[row, n])
    return ok


def has_ties(logits: np.ndarray) -> bool:
    return bool(((logits == logits.max(axis=-1, keepdims=True)).sum(axis=-1) > 1).any())


def tied_tokens(logits: np.ndarray) -> str:
    tied = logits == logits.max(axis=-1, keepdims=True)
    return "; ".join(f"pos {i}: {np.flatnonzero(row).tolist()}" for i, row in enumerate(tied) if row.sum() > 1)


@pytest.mark.spec_property(examples=8, explicit=1, checks=0, needs=(LOGITS,))
def test_greedy_rows_equal_greedy_decoding(spec) -> None:
    """At temperature 0 the output is greedy decoding of the target, token for token, for any
    draft, with random rows in the same batch (exact). Top logits tie exactly in some rows (as bf16
    logits often do); ties break as the model declares (``spectest_tie_break``: the lowest id, as
    torch.argmax, unless it says "any")."""

    def body(case: sst.LogitsCase) -> None:
        inputs = build(spec, case)
        draft_logits, target_logits, params = inputs.tensors(spec.device)
        rng = np.random.default_rng(case.seed)
        argmax = inputs.target_logits.argmax(axis=-1)
        # Any draft: half the slots carry the target's choice (long accepted runs), half a random token.
        drafts = np.where(
            rng.random((case.batch, case.k)) < 0.5,
            argmax[:, : case.k],
            rng.integers(0, case.vocab, (case.batch, case.k)),
        )
        emitted = (
            spec.verify_logits(
                torch.as_tensor(drafts, device=spec.device),
                draft_logits,
                target_logits,
                params,
                make_generator(case.seed, spec.device),
            )
            .cpu()
            .numpy()
        )
        greedy = inputs.params.greedy.numpy()
        if spec.model.tie_break == "any":
            tied = inputs.target_logits == inputs.target_logits.max(axis=-1, keepdims=True)
            wrong = np.flatnonzero(greedy & ~greedy_with_any_tie(drafts, emitted, tied))
            expected = emitted  # any tied token may come out: the message shows what did
        else:
            expected = greedy_expectation(drafts, argmax)
            wrong = np.flatnonzero(greedy & (emitted != expected).any(axis=1))
        detail = "; ".join(
            f"row {r}: drafts {drafts[r].tolist()}, target argmax {argmax[r].tolist()}, expected "
            f"{expected[r].tolist()}, got {emitted[r].tolist()}"
            + (
                f", tied at the top: {tied_tokens(inputs.target_logits[r])}"
                if has_ties(inputs.target_logits[r])
                else ""
            )
            for r in wrong[:3]
        )
        spec.require(
            wrong.size == 0,
            rules.GREEDY_IS_ARGMAX,
            f"{wrong.size} of {int(greedy.sum())} greedy rows differ ({detail}); "
            f"{int((~greedy).sum())} random rows shared the batch; {case}",
        )

    spec.given(
        GREEDY.logits_cases(greedy_share=st.sampled_from((0.5, 1.0))),
        body,
        explicit=[sst.LogitsCase(batch=16, k=8, vocab=32000, seed=9, greedy_share=0.5, tie_share=1.0)],
    )


@pytest.mark.spec_property(examples=4, explicit=1, checks=1, needs=(PROPOSE,), cost=2.5)
def test_drafts_follow_the_reported_probs(spec) -> None:
    """Draft honesty: propose's tokens are distributed as the draft_probs it reports, which
    depend only on the inputs (every copy of a row reports the same q)."""

    def body(case: sst.LogitsCase) -> None:
        started = time.perf_counter()
        inputs = build(spec, case)
        draft_logits, _, params = inputs.tensors(spec.device)
        b, k, v = draft_logits.shape
        propose_gen, _ = spec.generators(case.seed)
        _, reported = spec.propose(draft_logits, params, propose_gen)
        reported_np = reported.double().cpu().numpy()
        expected = reported_np / reported_np.sum(-1, keepdims=True)
        check = spec.distribution(
            rules.REPORTED_DRAFTS,
            expected.reshape(b * k, v),
            case_seed=case.seed,
            min_draws=20,
            max_draws=max(20, MAX_CASE_ELEMENTS // (2 * b * k * v)),
            labels=[f"row {r}{label} pos {i}: " for r, label in enumerate(inputs.row_labels()) for i in range(k)],
        )
        slots = torch.arange(k, device=spec.device)
        while not check.done:
            reps = check.next_batch(max(1, MAX_CALL_ELEMENTS // (b * k * v)))
            tokens, probs = spec.propose(repeat_rows(draft_logits, reps), params.repeat(reps), propose_gen)
            copies = probs.view(reps, b, k, v)
            if not bool(torch.isclose(copies, reported.unsqueeze(0), rtol=1e-4, atol=1e-6).all()):
                drift = (copies.double() - reported.double().unsqueeze(0)).abs().amax().item()
                spec.require(
                    False,
                    rules.DRAFT_PROBS_DETERMINISTIC,
                    f"copies of the same rows reported draft_probs differing by up to {drift:.3g}; {case}",
                )
            rows = torch.arange(b, device=spec.device).repeat(reps).unsqueeze(1)
            counts = torch.bincount(((rows * k + slots) * v + tokens).flatten(), minlength=b * k * v)
            check.add(counts.view(b * k, v).cpu().numpy(), reps)
            spec.require_possible(
                check,
                lambda g, c: f"row {g // k} position {g % k} token {c}",
                str(case),
                rule=rules.NEVER_DRAFTS_IMPOSSIBLE,
                source="reported draft",
            )
        context = f"{check.draws} proposals of {b} rows x {k} positions, {case}"
        spec.conclude(check, context=context, started=started)

    spec.given(CASES, body, explicit=[MIXED])


@pytest.mark.spec_property(examples=4, explicit=2, checks=1, needs=(PROPOSE,), cost=4)
def test_propose_then_verify_is_lossless(spec) -> None:
    """propose followed by verify_logits (or by verify with the reported q and the processed
    target) emits exactly the processed target at every row and position."""

    def body(case: sst.LogitsCase) -> None:
        inputs = build(spec, case)
        draft_logits, target_logits, params = inputs.tensors(spec.device)
        target_probs = torch.as_tensor(inputs.target, device=spec.device, dtype=torch.float32)
        propose_gen, verify_gen = spec.generators(case.seed)

        def call(reps: int) -> torch.Tensor:
            many = params.repeat(reps)
            drafts, reported = spec.propose(repeat_rows(draft_logits, reps), many, propose_gen)
            if LOGITS in spec.model.capabilities:
                return spec.verify_logits(
                    drafts, repeat_rows(draft_logits, reps), repeat_rows(target_logits, reps), many, verify_gen
                )
            return spec.verify(drafts, reported, repeat_rows(target_probs, reps), verify_gen)

        check_positions(spec, case, inputs, call)

    spec.given(CASES, body, explicit=[MIXED, ONE_FILTER_EACH])


@pytest.mark.spec_property(examples=10, explicit=1, checks=0, needs=(LOGITS, PER_ROW_SEEDS))
def test_seeded_rows_ignore_the_rest_of_the_batch(spec) -> None:
    """Per-row seeds: a seeded row's output is the same alone, moved, duplicated, or among other
    rows, whatever the call's generator (exact)."""

    def body(case: sst.LogitsCase) -> None:
        inputs = build(spec, case)
        others = build(spec, replace(case, seed=case.seed ^ 0x9E3779B9))
        draft_logits, target_logits, params = inputs.tensors(spec.device)
        drafts = RepeatedCategorical(torch.as_tensor(inputs.draft)).sample(1, make_generator(case.seed))[0]
        alone = spec.verify_logits(
            drafts.to(spec.device), draft_logits, target_logits, params, make_generator(case.seed, spec.device)
        )
        # The same rows twice each, shuffled among as many other rows, under another generator.
        other_drafts = RepeatedCategorical(torch.as_tensor(others.draft)).sample(1, make_generator(case.seed + 1))[0]
        b = case.batch
        pool = torch.cat([torch.arange(b), torch.arange(b), b + torch.arange(b)])
        order = torch.as_tensor(np.random.default_rng(case.seed).permutation(pool.numel()))
        source = pool[order]
        o_draft, o_target, o_params = others.tensors(spec.device)
        mixed = spec.verify_logits(
            torch.cat([drafts, other_drafts])[source].to(spec.device),
            torch.cat([draft_logits, o_draft])[source.to(spec.device)],
            torch.cat([target_logits, o_target])[source.to(spec.device)],
            SamplingParams.cat([params, o_params]).take(source),
            make_generator(case.seed + 2, spec.device),
        )
        mine = (source < b).nonzero().flatten()
        got = mixed.cpu()[mine]
        want = alone.cpu()[source[mine]]
        differ = (got != want).any(dim=1).nonzero().flatten()
        detail = "; ".join(
            f"row {int(source[mine][i])} ({inputs.params.describe_row(int(source[mine][i]))}) gave "
            f"{want[i].tolist()} alone and {got[i].tolist()} at position {int(mine[i])} of the mixed batch"
            for i in differ[:3]
        )
        spec.require(
            differ.numel() == 0,
            rules.SEEDED_ROWS,
            f"{differ.numel()} of {mine.numel()} seeded placements differ: {detail}; {case}",
        )

    spec.given(
        SEEDED.logits_cases(greedy_share=st.just(0.0), seeded=True),
        body,
        explicit=[sst.LogitsCase(batch=16, k=4, vocab=300, seed=5, greedy_share=0.0, seeded=True)],
    )
