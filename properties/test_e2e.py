"""End to end: an engine's whole generation loop with speculative decoding on, against its own target.

``pytest --spec-engine X`` runs these on X (``spectest.e2e.protocol``). The harness computes every
token's processed target itself, from the engine's raw target logits along its own output and
each request's parameters: it never trusts the engine's processing, which is where loop bugs live
(parameters not applied to the target, the wrong logits slice, argmax fallbacks, stale caches,
rejected drafts left in the output, seeds ignored).
"""

from __future__ import annotations

import pytest
import torch

from spectest import rules
from spectest.e2e.cases import EngineCase, engine_cases, most_random_request
from spectest.e2e.first_tokens import check_first_tokens
from spectest.e2e.output import Tally, check_engine_output, require_exact, score
from spectest.e2e.passes import check_acceptance
from spectest.e2e.protocol import BATCH_INVARIANT, DRAFT_LOGITS, PLAIN, SCORED, SEEDED, TWIN
from spectest.e2e.speed_check import check_engine_speed
from spectest.e2e.twin import check_against_twin
from spectest.sampling_params import NO_SEED, SamplingParams

GREEDY_CALLS = 2


@pytest.mark.spec_property(examples=2, explicit=1, checks=6, needs=(SCORED,))
def test_engine_output_follows_the_target(spec_e2e) -> None:
    """Every token of greedy, plain and filtered requests against the processed target: exact rules,
    and the PIT by token id, by probability and (for an engine with draft logits) by draft/target
    ratio, by position (and by offset in the pass for an engine that reports its passes and
    verifies token-wise)."""
    spec_e2e.given(
        engine_cases(),
        lambda case: check_engine_output(spec_e2e, case),
        explicit=[EngineCase(requests=8, max_new_tokens=16, prompt_lengths=(2, 8), mix="mixed", seed=1)],
    )


# The order is the run's schedule: pytest-xdist hands each worker two consecutive tests at a time and a worker
# commits to its next test before the current one ends, so the two longest properties (the output above, the first
# tokens below) are kept apart by a short exact one; together on one worker they had the other idle (MLX-LM: 184 s
# where 161 s would do).
@pytest.mark.spec_property(examples=3, explicit=1, checks=0, needs=(SCORED,))
def test_greedy_requests_equal_greedy_decoding(spec_e2e) -> None:
    """Temperature 0 requests give greedy decoding of the target token for token (exact ties by the
    engine's declared rule, near-ties within 1e-4 skipped and counted)."""

    def body(case: EngineCase) -> None:
        tally = Tally()
        for call in range(GREEDY_CALLS):
            reqs = spec_e2e.requests(case, call)
            outputs = spec_e2e.generate(reqs.prompts, reqs.params, case.max_new_tokens, reqs.seed)
            require_exact(spec_e2e, reqs, score(spec_e2e, reqs, outputs), tally, case)

    spec_e2e.given(
        engine_cases(mixes=("greedy",), new_tokens=(4, 32)),
        body,
        explicit=[EngineCase(requests=4, max_new_tokens=32, prompt_lengths=(1, 8), mix="greedy", seed=2)],
    )


@pytest.mark.spec_property(examples=1, explicit=1, checks=1, needs=(SCORED,))
def test_first_tokens_of_one_prompt_follow_the_target(spec_e2e) -> None:
    """One prompt in every request of a call, one set of parameters: the first tokens are independent
    draws from one processed target, tested token by token over the whole vocabulary (every id its own
    cell where the draws are sparse), where the PIT's ten bins would hide mass moved between neighbours."""
    spec_e2e.given(
        engine_cases(requests=(32, 32), new_tokens=(2, 2), mixes=("sampled",)),
        lambda case: check_first_tokens(spec_e2e, case),
        explicit=[EngineCase(requests=32, max_new_tokens=2, prompt_lengths=(6, 6), mix="sampled", seed=4)],
    )


@pytest.mark.spec_property(examples=1, explicit=1, checks=1, needs=(SCORED, DRAFT_LOGITS))
def test_tokens_per_pass_follow_the_engines_acceptance(spec_e2e) -> None:
    """Every draft the loop verified, against sum_x min(p, q) of the processed target and draft along
    the engine's own contexts: a loop that throws accepted drafts away accepts fewer than its own
    acceptance allows (see spectest.e2e.passes). An engine that does not declare standard rejection
    has its acceptance efficiency measured and reported instead (a skip with the figures)."""
    spec_e2e.given(
        engine_cases(mixes=("sampled", "filtered")),
        lambda case: check_acceptance(spec_e2e, case),
        explicit=[EngineCase(requests=8, max_new_tokens=16, prompt_lengths=(2, 8), mix="sampled", seed=3)],
    )


@pytest.mark.spec_property(examples=1, explicit=1, checks=1, needs=(TWIN,))
def test_output_follows_a_twin_without_speculation(spec_e2e) -> None:
    """A server against a twin endpoint of the same model with speculation off (--spec-reference-url):
    one prompt with one set of parameters in 8 requests of a call, the rest of the call's crowd mixed;
    the two samples' tokens at each position tested for homogeneity (see spectest.e2e.twin)."""
    spec_e2e.given(
        engine_cases(requests=(8, 8), new_tokens=(2, 4), mixes=("sampled",)),
        lambda case: check_against_twin(spec_e2e, case),
        explicit=[EngineCase(requests=8, max_new_tokens=4, prompt_lengths=(4, 4), mix="sampled", seed=5)],
    )


@pytest.mark.spec_property(examples=2, checks=0, needs=(SEEDED,))
def test_same_seed_same_output(spec_e2e) -> None:
    """A batch generated twice with the same seeds gives the same tokens."""

    def body(case: EngineCase) -> None:
        reqs = spec_e2e.requests(case, 0)
        first = spec_e2e.generate(reqs.prompts, reqs.params, case.max_new_tokens, reqs.seed)
        again = spec_e2e.generate(reqs.prompts, reqs.params, case.max_new_tokens, reqs.seed)
        for row, (a, b) in enumerate(zip(first, again, strict=True)):
            spec_e2e.require(
                a == b,
                rules.E2E_SEEDED,
                f"{reqs.describe(row)}, run seed {reqs.seed}: first {a}, then {b} ({case.describe()})",
            )

    spec_e2e.given(engine_cases(mixes=("mixed", "filtered")), body)


@pytest.mark.spec_property(examples=2, checks=0, needs=(BATCH_INVARIANT,))
def test_seeded_requests_ignore_the_batch(spec_e2e) -> None:
    """Requests with their own seeds give the same tokens alone and inside a batch of other requests
    (moved to the end, under another run seed): the call's first request as drawn, and its most random
    one (sampled, unfiltered if any is, the hottest), whose tokens change whenever it is handed another
    request's parameters or random stream; a greedy or one-token request cannot show that."""

    def body(case: EngineCase) -> None:
        reqs, others = spec_e2e.requests(case, 0), spec_e2e.requests(case, 1)
        params = SamplingParams.cat([reqs.params.take(torch.tensor([0])), others.params]).clone()
        prompts = [reqs.prompts[0], *others.prompts]
        under_test = [0, *({most_random_request(params)} - {0, None})]
        for row in under_test:
            if int(params.seed[row]) == NO_SEED:
                params.seed[row] = reqs.seed + row  # a request under test always carries its own seed
        alone = [
            spec_e2e.generate([prompts[row]], params.take(torch.tensor([row])), case.max_new_tokens, reqs.seed)[0]
            for row in under_test
        ]
        order = [*range(1, len(prompts)), 0]
        mixed = spec_e2e.generate(
            [prompts[i] for i in order], params.take(torch.tensor(order)), case.max_new_tokens, reqs.seed + 1
        )
        for row, tokens in zip(under_test, alone, strict=True):
            place = order.index(row)
            spec_e2e.require(
                tokens == mixed[place],
                rules.E2E_BATCH_INVARIANT,
                f"prompt {prompts[row]} ({params.describe_row(row)}): alone {tokens}, row {place} of a batch of "
                f"{len(order)} {mixed[place]} ({case.describe()})",
            )

    spec_e2e.given(engine_cases(mixes=("mixed", "filtered")), body)


@pytest.mark.spec_e2e_speed
@pytest.mark.spec_property(examples=1, checks=1, needs=(SCORED, PLAIN, DRAFT_LOGITS))
def test_engine_speedup_follows_its_model(spec_e2e) -> None:
    """Runs when asked (--spec-e2e-speed; timing needs a quiet machine and minutes): the engine's
    speculative and plain decoding of the same requests in rounds, against the tokens-per-pass model
    with the engine's own measured costs and its own acceptance rule, standard rejection or token match
    (see spectest.e2e.speed)."""
    seed = spec_e2e.session.seed
    case = EngineCase(requests=16, max_new_tokens=16, prompt_lengths=(4, 8), mix="sampled", seed=seed, seeded=0.0)
    check_engine_speed(spec_e2e, case)  # one workload, timed: nothing for Hypothesis to search or shrink
