"""The acceptance chain against the analytic model of simulators/.

For a verifier that declares ``standard-rejection`` the number of tokens each call emits must
follow the exact chain model: per row from a_i = sum min(p_i, q_i) (context-free), and per
start context by dynamic programming over contexts (Markov). One that declares
``block-verification`` follows the exact block model instead (enumerated over draft sequences,
so its cases keep V^K small), and must accept at least as many tokens per call as token-wise
verification on the same inputs (the guarantee of Sun et al. 2024). Other lossless verifiers may accept
less (one that ignores q, say): for them the measured acceptance is reported as an efficiency
figure, and they fail only if they beat the maximal-coupling bound, which no lossless verifier
can: P(first j emitted tokens = first j drafts) <= sum over j-token sequences of min(P, Q).
A lossy model (spectest.statistics.tv) is bound by neither: its tokens per call are reported, the
speed its loss buys.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from spectest.simulators import acceptance_probability, tokens_per_pass
from spectest.simulators.block import block_tokens_per_pass
from spectest.simulators.markov import MarkovChainModel, context_free_prefix_bound

from spectest import rules
from spectest import strategies as sst
from spectest.cases.tensors import RepeatedBatch, to_tensor
from spectest.cases.toy_models import markov_pair
from spectest.protocol import BLOCK_VERIFICATION, PAD

CALLS = sst.CaseRanges(batch=(65, 96), k=(1, 8), vocab=(2, 512))
BLOCK_CALLS = sst.CaseRanges(batch=(65, 96), k=(1, 4), vocab=(2, 12))  # the block model enumerates V^K drafts
MAX_CASE_ELEMENTS = 200_000_000
MAX_CALL_ELEMENTS = 8_000_000
BOUND_SEQUENCES = 4096  # enumerate at most this many prefixes per row for the coupling bound


def bernstein_p_value(successes: float, means: np.ndarray) -> float:
    """P(sum of independent Bernoullis with means <= ``means`` reaches ``successes``), bounded by
    Bernstein's inequality (valid without approximation; variance <= min(mean, 1/4) each)."""
    excess = successes - means.sum()
    if excess <= 0:
        return 1.0
    variance = np.minimum(means, 0.25).sum()
    return float(min(1.0, math.exp(-(excess**2) / (2 * (variance + excess / 3)))))


# Every run sees drafts that miss the target by a wide margin: a verifier that accepts less than
# the standard rule (or more) moves tokens per call by several per cent there, whatever else is drawn.
FAR_DRAFTS = sst.ChainCase(batch=80, k=4, vocab=16, kinds=(("dirichlet", "far"), ("peaky", "close")), seed=7)
# The same for block verifiers, over a vocabulary whose V^K draft sequences the exact model enumerates quickly.
FAR_BLOCK = sst.ChainCase(batch=80, k=4, vocab=8, kinds=(("dirichlet", "far"), ("peaky", "close")), seed=7)


@pytest.mark.spec_property(examples=6, explicit=1, checks=1)
def test_tokens_per_call_follow_the_chain_model(spec) -> None:
    def body(case: sst.ChainCase) -> None:
        started = time.perf_counter()
        target_np, draft_np = sst.build_chain(case)
        b, k, v = case.batch, case.k, case.vocab
        if spec.block:
            exact = np.stack([block_tokens_per_pass(target_np[r], draft_np[r]).probs for r in range(b)])
        else:
            exact = tokens_per_pass(acceptance_probability(target_np[:, :k], draft_np)).probs  # [B, K + 1]
        per_rep = b * (2 * k + 1) * v
        batch = RepeatedBatch(
            to_tensor(target_np, device=spec.device, dtype=case.dtype),
            to_tensor(draft_np, device=spec.device, dtype=case.dtype),
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        check = spec.distribution(
            rules.BLOCK_TOKENS_PER_CALL if spec.block else rules.TOKENS_PER_CALL,
            exact,
            case_seed=case.seed,
            min_draws=50,
            max_draws=max(50, MAX_CASE_ELEMENTS // per_rep),
            labels=[f"row {r}: " for r in range(b)],
            cell_name=lambda i: f"L={i + 1}",
        )
        matches = np.zeros((b, k))
        while not check.done:
            reps = check.next_batch(max(1, MAX_CALL_ELEMENTS // per_rep))
            drafts, draft_probs, target_probs = batch.draw(reps, draft_gen)
            emitted = spec.verify(drafts, draft_probs, target_probs, verify_gen)
            lengths = (emitted != PAD).sum(dim=1)
            rows = torch.arange(b, device=spec.device).repeat(reps)
            check.add(
                torch.bincount(rows * (k + 1) + lengths - 1, minlength=b * (k + 1)).view(b, k + 1).cpu().numpy(), reps
            )
            prefix = torch.cumprod((emitted[:, :k] == drafts).to(torch.int64), dim=1)
            matches += (
                torch.zeros((b, k), dtype=torch.int64, device=spec.device).index_add_(0, rows, prefix).cpu().numpy()
            )
        measured = float((check.counts * np.arange(1, k + 2)).sum() / check.counts.sum())
        optimal = float((exact * np.arange(1, k + 2)).sum(axis=1).mean())
        calls = b * check.draws
        optimum = np.cumprod(acceptance_probability(target_np[:, :k], draft_np), axis=1).mean(axis=0)
        spec.record(
            {
                "efficiency": measured / optimal,
                "tokens_per_call": measured,
                "optimal_tokens_per_call": optimal,
                "k": k,
                # P(first j emitted tokens are the first j drafts), measured vs standard rejection sampling
                "prefix_acceptance": (matches.sum(axis=0) / calls).tolist(),
                "prefix_acceptance_optimal": optimum.tolist(),
            }
        )
        context = f"{check.draws} calls per row, {case}; tokens per call {measured:.4f}, standard optimum {optimal:.4f}"
        if spec.standard or spec.block:
            spec.conclude(check, context=context, started=started)
            return
        if spec.lossy:  # a lossy scheme may accept more than any lossless one: nothing binds it
            return
        # Not declared standard: only the maximal-coupling bound is binding.
        for j in range(1, k + 1):
            bounds = np.array(
                [context_free_prefix_bound(target_np[r], draft_np[r], j, BOUND_SEQUENCES) for r in range(b)]
            )
            p_value = bernstein_p_value(matches[:, j - 1].sum(), np.repeat(bounds, check.draws))
            spec.require(
                p_value >= spec.alpha / k,
                rules.COUPLING_BOUND,
                f"the first {j} emitted tokens equal the drafts in {int(matches[:, j - 1].sum())} of {b * check.draws} "
                f"calls, but no lossless verifier can exceed {bounds.mean() * b * check.draws:.1f} on average "
                f"(Bernstein p <= {p_value:.3g} < {spec.alpha / k:.2g}); {context}",
            )

    if spec.block:
        spec.given(BLOCK_CALLS.chain_cases(), body, explicit=[FAR_BLOCK])
    else:
        spec.given(CALLS.chain_cases(), body, explicit=[FAR_DRAFTS])


@pytest.mark.spec_property(examples=4, explicit=1, checks=1, needs=(BLOCK_VERIFICATION,))
def test_accepts_at_least_as_many_tokens_as_token_wise(spec) -> None:
    """Block verification's guarantee: on the same inputs, at least the tokens per call of
    token-wise rejection sampling (known exactly). One-sided Hoeffding test on the mean deficit
    (L in [1, K + 1]), with enough calls that a deficit of tolerance * K tokens fails with
    probability 1 - alpha."""

    def body(case: sst.ChainCase) -> None:
        target_np, draft_np = sst.build_chain(case)
        b, k, v = case.batch, case.k, case.vocab
        token_wise = tokens_per_pass(acceptance_probability(target_np[:, :k], draft_np)).mean  # [B]
        log_level = math.log(1 / spec.alpha)
        calls_needed = math.ceil(2 * log_level / spec.tolerance**2)
        reps_needed = max(1, math.ceil(calls_needed / b))
        per_rep = b * (2 * k + 1) * v
        batch = RepeatedBatch(
            to_tensor(target_np, device=spec.device, dtype=case.dtype),
            to_tensor(draft_np, device=spec.device, dtype=case.dtype),
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        total, calls, done = 0.0, 0, 0
        while done < reps_needed:
            reps = min(reps_needed - done, max(1, MAX_CALL_ELEMENTS // per_rep))
            drafts, draft_probs, target_probs = batch.draw(reps, draft_gen)
            emitted = spec.verify(drafts, draft_probs, target_probs, verify_gen)
            total += float((emitted != PAD).sum())
            calls += b * reps
            done += reps
        measured, expected = total / calls, float(token_wise.mean())
        deficit = expected - measured
        p_value = math.exp(-2 * calls * deficit**2 / k**2) if deficit > 0 else 1.0
        spec.record({"tokens_per_call": measured, "token_wise_tokens_per_call": expected, "k": k})
        spec.require(
            p_value >= spec.alpha,
            rules.AT_LEAST_TOKEN_WISE,
            f"{measured:.4f} tokens per call over {calls} calls, token-wise verification gives {expected:.4f} on the "
            f"same inputs: a deficit of {deficit:.4f} tokens (Hoeffding p <= {p_value:.3g} < {spec.alpha:.2g}; these calls "
            f"detect a deficit of {spec.tolerance * k:.3g} tokens with probability >= {1 - spec.alpha:.6g}); {case}",
        )

    spec.given(CALLS.chain_cases(), body, explicit=[FAR_DRAFTS])


@pytest.mark.spec_property(examples=6, explicit=1, checks=1)
def test_markov_tokens_per_pass_follow_the_exact_model(spec) -> None:
    if not spec.standard:
        pytest.skip(
            f"{spec.model.name} does not declare standard-rejection: the exact tokens-per-pass model holds only "
            "for token-wise rejection sampling (its efficiency is reported by test_tokens_per_call_follow_the_chain_model)"
        )

    def body(case: sst.MarkovCase) -> None:
        started = time.perf_counter()
        target, draft = markov_pair(np.random.default_rng(case.seed), case.vocab, case.target_kind, case.draft_kind)
        model = MarkovChainModel(target.table, draft.table)
        exact = model.tokens_per_pass(case.k).probs  # [V + 1, K + 1], by start context
        long_run = model.long_run_tokens_per_pass(case.k)
        passes_per_sequence = case.length / long_run
        reach = model.long_run_contexts(case.k) * passes_per_sequence
        reach[model.start] = 1.0
        check = spec.distribution(
            rules.TOKENS_PER_PASS,
            exact,
            case_seed=case.seed,
            min_draws=500,
            max_draws=200_000,
            reach=reach,
            labels=[f"context {c}: " for c in range(case.vocab + 1)],
            cell_name=lambda i: f"L={i + 1}",
        )
        for run, sequences in spec.markov_sequences(check, target, draft, case):
            cells = run.pass_contexts * (case.k + 1) + run.tokens_per_pass - 1
            counts = torch.bincount(cells, minlength=exact.size).view(exact.shape)
            check.add(counts.cpu().numpy(), sequences)
        measured = float((check.counts * np.arange(1, case.k + 2)).sum() / check.counts.sum())
        optimal = float(
            (check.counts.sum(axis=1) * (exact * np.arange(1, case.k + 2)).sum(axis=1)).sum() / check.counts.sum()
        )
        spec.record({"efficiency": measured / optimal, "tokens_per_pass": measured, "long_run_exact": long_run})
        context = f"{check.draws} sequences, {case}; tokens per pass {measured:.4f}, exact long run {long_run:.4f}"
        spec.conclude(check, context=context, started=started)

    # Every run sees a pair whose drafts are far from the targets: acceptance bugs show there.
    far = sst.MarkovCase(vocab=4, k=4, length=9, target_kind="dirichlet", draft_kind="far", seed=3)
    spec.given(sst.markov_cases(max_vocab=5, max_cells=10**6), body, explicit=[far])
