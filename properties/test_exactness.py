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
from hypothesis import strategies as st

from spectest import strategies as sst
from spectest.cases import chunked_repeats, draw_drafts, repeat_rows, to_tensor
from spectest.loop import generate, sequence_index
from spectest.models import markov_pair
from spectest.protocol import PAD
from spectest.stats import Group, chisquare_groups, impossible_cells

SEQUENCES = 20_000
ROW_SAMPLES = 24_000  # draws of position 0 per case, over all rows
MAX_ELEMENTS = 40_000_000  # bound on probabilities handed to the verifier per case


@pytest.mark.spec_property(examples=8, explicit=2, checks=1)
def test_sequences_follow_the_target(spec) -> None:
    def body(case: sst.MarkovCase) -> None:
        started = time.perf_counter()
        target, draft = markov_pair(np.random.default_rng(case.seed), case.vocab, case.target_kind, case.draft_kind)
        draft_gen, verify_gen = spec.generators(case.seed)
        run = generate(
            spec.model,
            target,
            draft,
            n_sequences=spec.samples(SEQUENCES),
            length=case.length,
            k=case.k,
            draft_generator=draft_gen,
            verify_generator=verify_gen,
            device=spec.device,
            dtype=getattr(torch, case.dtype),
            timeout=spec.session.timeout,
        )
        probs = target.sequence_probs(case.length)
        counts = torch.bincount(sequence_index(run.tokens, case.vocab), minlength=probs.size).cpu().numpy()
        impossible = impossible_cells(counts, probs)
        spec.require(
            impossible.size == 0,
            "never emits a token the target gives probability zero",
            f"{int(counts[impossible].sum())} of {counts.sum()} sequences have target probability 0, "
            f"e.g. {list(map(int, np.unravel_index(impossible[0], [case.vocab] * case.length))) if impossible.size else ''} "
            f"({case})",
        )
        context = f"{case.length}-token sequences through {run.passes} verify calls, {case}"
        shape = [case.vocab] * case.length
        joint = Group(counts, probs, cell_name=lambda i: f"sequence {list(map(int, np.unravel_index(i, shape)))}")
        spec.check_fit(
            chisquare_groups("joint sequence distribution", [joint], alpha=spec.alpha), context=context, started=started
        )

    spec.given(
        sst.markov_cases(),
        body,
        explicit=[
            sst.MarkovCase(vocab=3, k=4, length=7, target_kind="dirichlet", draft_kind="close", seed=1),
            sst.MarkovCase(vocab=2, k=8, length=12, target_kind="peaky", draft_kind="zero_heavy", seed=2),
        ],
    )


def ratio_order(p: np.ndarray, q: np.ndarray | None) -> np.ndarray:
    """Pool tokens by draft/target ratio (then p): most bugs move mass along that ratio."""
    if q is None:
        return np.argsort(p, kind="stable")
    ratio = np.divide(q, p, out=np.full_like(p, np.inf), where=p > 0)
    return np.lexsort((p, ratio))


@pytest.mark.spec_property(examples=8, explicit=1, checks=1)
def test_every_row_and_position_is_exact(spec) -> None:
    def body(case: sst.ChainCase) -> None:
        started = time.perf_counter()
        target_np, draft_np = sst.build_chain(case)
        target = to_tensor(target_np, device=spec.device, dtype=case.dtype)
        draft = to_tensor(draft_np, device=spec.device, dtype=case.dtype)
        b, k, v = case.batch, case.k, case.vocab
        repeats = -(-spec.samples(ROW_SAMPLES) // b)
        draft_gen, verify_gen = spec.generators(case.seed)
        counts = torch.zeros(b * (k + 1) * v, dtype=torch.int64, device=spec.device)
        slots = torch.arange(k + 1, device=spec.device)
        for reps in chunked_repeats(repeats, b, (2 * k + 1) * v, MAX_ELEMENTS // 8):
            draft_probs, target_probs = repeat_rows(draft, reps), repeat_rows(target, reps)
            emitted = spec.verify(draw_drafts(draft_probs, draft_gen), draft_probs, target_probs, verify_gen)
            present = emitted != PAD
            rows = torch.arange(b, device=spec.device).repeat(reps).unsqueeze(1)
            cell = (rows * (k + 1) + slots) * v + emitted.clamp_min(0)
            counts += torch.bincount(cell[present], minlength=counts.numel())
        counts_np = counts.view(b, k + 1, v).cpu().numpy()
        impossible = np.argwhere((target_np <= 0) & (counts_np > 0))
        if impossible.size:
            r, i, t = impossible[0]
            spec.require(
                False,
                "never emits a token the target gives probability zero",
                f"row {r} position {i} emitted token {t} {counts_np[r, i, t]} times ({case})",
            )
        groups = [
            Group(
                counts_np[r, i],
                target_np[r, i],
                f"row {r} pos {i} ",
                ratio_order(target_np[r, i], draft_np[r, i] if i < k else None),
            )
            for r in range(b)
            for i in range(k + 1)
        ]
        context = f"{repeats} draws of each of {b} rows, every row and position different, {case}"
        spec.check_fit(
            chisquare_groups("per-row, per-position distribution", groups, alpha=spec.alpha),
            context=context,
            started=started,
        )

    spec.given(
        sst.chain_cases(batch=st.integers(65, 96), k=sst.draft_lengths(max_k=8), vocab=sst.vocab_sizes(max_size=1536)),
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
