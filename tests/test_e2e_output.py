"""The output properties through the real plugin (spectest.e2e.output, spectest.e2e.first_tokens): a fast exact
engine (tests/engines/markov.py) passes every one, and engines that lose a parameter or process only the draft fail
by the rule they break.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest import rules
from spectest.e2e.engines.openai_server import MLX_ORDER
from spectest.e2e.protocol import build_engine
from spectest.implementations.sampler import REFERENCE
from spectest.sampling_params import DEFAULT_ORDER, SamplingParams, process_logits
from tests.engines import E2E_PROPERTIES, ENGINES, MARKOV, TWIN
from tests.engines.markov import LazyRows, MarkovEngine, processed_row
from tests.runner_helpers import run_pytest


@pytest.mark.cost(35)
def test_an_exact_engine_passes_every_end_to_end_property(tmp_path):
    """The fast Markov engine through the real plugin (the quick budget: TV 0.1): every property
    passes (but the twin comparison, which only a server with --spec-reference-url has: it skips), the
    PIT checks reach their plan, and the results file carries the PIT histograms."""
    run = run_pytest(["--spec-engine", MARKOV, "-n", "0", "--spec-seed", "3", "--spec-budget", "quick"], tmp_path)
    outcomes = {prop: o.outcome for (_, prop), o in run.results.items()}
    twin = outcomes.pop(TWIN, None)
    assert twin == "skipped", run.output[-3000:]
    assert set(outcomes.values()) == {"passed"} and len(outcomes) == len(E2E_PROPERTIES), run.output[-3000:]
    checks = [c for c in run.document["checks"] if c["model"] == "markov.py:markov"]
    assert {c["check"].partition(", pooled")[0] for c in checks} == {
        *rules.PIT_CHECKS,
        rules.ACCEPTANCE_TRIALS,
        rules.FIRST_TOKENS,
    }
    assert all(not c.get("time_limited") for c in checks)
    assert any(f.get("pit") for f in run.document["figures"])
    assert "spectest: engines: markov.py:markov" in run.output


def test_engines_alone_run_only_the_end_to_end_properties(tmp_path):
    run = run_pytest(["--spec-engine", MARKOV, "-n", "0", "-k", "greedy_requests"], tmp_path)
    assert {prop for _, prop in run.results} == {"test_greedy_requests_equal_greedy_decoding"}, run.output[-2000:]
    # the engine's generation and the teacher forcing that scores it, apart, and the harness's share
    assert "teacher forcing" in run.output and "x the engine's generation" in run.output, run.output[-2000:]


def test_an_engine_that_loses_a_parameter_fails_naming_it(tmp_path):
    """A server that drops top-k on the way to its sampler emits tokens top-k removes: the exact rule fails
    and says top-k is the parameter that would explain them."""
    engine = f"{ENGINES / 'markov.py'}:loses_top_k"
    run = run_pytest(
        ["--spec-engine", engine, "-n", "0", "--spec-budget", "quick", "-k", "follows_the_target"], tmp_path
    )
    outcome = run.results[("markov.py:loses_top_k", "test_engine_output_follows_the_target")]
    assert outcome.outcome == "failed" and outcome.failure["rule"] == rules.NEVER_IMPOSSIBLE, outcome.text
    assert "possible if the engine ignored top_k=" in outcome.text, outcome.text


def test_an_engine_that_processes_only_the_draft_fails_by_the_pit(tmp_path):
    engine = f"{ENGINES / 'markov.py'}:temperature_only_on_draft"
    run = run_pytest(["--spec-engine", engine, "-n", "0", "--spec-no-shrink", "-k", "follows_the_target"], tmp_path)
    outcome = run.results[("markov.py:temperature_only_on_draft", "test_engine_output_follows_the_target")]
    assert outcome.outcome == "failed" and outcome.failure["rule"] in (*rules.PIT_CHECKS, rules.NEVER_IMPOSSIBLE)
    assert "replay: pytest --spec-engine" in outcome.text


@pytest.mark.slow
@pytest.mark.cost(50)
def test_first_tokens_of_one_prompt_see_a_bf16_inverse_cdf_at_a_real_vocabulary(tmp_path):
    """At V = 128256 the first tokens of one prompt, every id its own cell, catch an engine whose
    verifier samples from prefix sums stored in bfloat16; the same engine with an exact verifier passes."""
    first = "test_first_tokens_of_one_prompt_follow_the_target"
    exact, lumped = "markov.py:large_vocabulary", "markov.py:bf16_prefix_sums_at_large_vocabulary"
    args = [a for name in (exact, lumped) for a in ("--spec-engine", str(ENGINES / name))]
    run = run_pytest([*args, "-n", "2", "--spec-no-shrink", "-k", first], tmp_path)
    assert run.results[(exact, first)].outcome == "passed", run.explain(exact, first)
    outcome = run.results[(lumped, first)]
    assert outcome.failure == {"kind": "statistical", "rule": rules.FIRST_TOKENS}, run.explain(lumped, first)
    assert "first token: token" in outcome.text, outcome.text  # the ids that came out too often, by name


def test_a_greedy_draft_is_a_point_mass_on_its_argmax():
    """A draft that proposes its argmax whatever the request says (``spectest_draft_sampling = "greedy"``:
    llama.cpp's GGUF draft) has q = a point mass there, ties to the lowest id; the request's processing
    applies to sampled drafts only. An unknown value is refused when the engine is resolved."""
    from types import SimpleNamespace

    from spectest.e2e.output import draft_rows

    class Engine:
        vocab_size = 4

        def __init__(self, sampling):
            self.spectest_draft_sampling = sampling

        def generate(self, prompts, params, max_new_tokens, seed):
            return [[0] * max_new_tokens for _ in prompts]

        def target_logits(self, sequences):
            return torch.zeros(len(sequences), max(map(len, sequences)), 4)

    logits = torch.tensor([[[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 0.0]]])
    scored = SimpleNamespace(
        sequences=[[1, 2]],
        prefix=torch.tensor([[0, 0], [0, 1]]),
        params=SamplingParams.build(2, temperature=[1.0, 0.5]),
        probs=torch.zeros(2, 4, dtype=torch.float64),
    )
    rows = {}
    for sampling in ("greedy", "request"):
        engine = build_engine("draft", "test", Engine(sampling))
        spec = SimpleNamespace(engine=engine, order=engine.filter_order, draft_logits=lambda sequences: logits)
        rows[sampling] = draft_rows(spec, scored)
    assert rows["greedy"].tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert 0 < float(rows["request"][0, 3]) < 1
    with pytest.raises(ValueError, match="spectest_draft_sampling"):
        build_engine("draft", "test", Engine("top-2"))


@settings(max_examples=60, deadline=None)
@given(
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.integers(0, 60),
    top_p=st.sampled_from([1.0, 0.3, 0.75, 0.99]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    tied=st.booleans(),
)
def test_the_markov_engines_rows_processed_together_are_each_row_processed_alone(
    temperature, top_k, top_p, min_p, tied
):
    """The Markov engine (the exact subject of the end-to-end and server tests) processes a whole table in one
    call per request and draws from the kept rows: each must be, bit for bit, what processing its row alone gives
    (what it did before), ties included (logits rounded, so that top-p splits them), in either filter order for the
    same request, and a lazy table's rows too."""
    engine = MarkovEngine(seed=3)
    table = torch.round(engine.target) if tied else engine.target
    lazy = LazyRows(64, seed=1, scale=2.0)
    one = SamplingParams.build(1, temperature=[temperature], top_k=[top_k], top_p=[top_p], min_p=[min_p])
    for (rows, contexts), order in itertools.product(
        ((table, range(table.shape[0])), (lazy, (0, 5, 5, 63))), (DEFAULT_ORDER, MLX_ORDER)
    ):
        for context in contexts:
            alone = process_logits(rows[context].view(1, 1, -1), one, order=order).view(-1)
            assert torch.equal(processed_row(rows, context, one, order), alone), (context, order)


class _ThroughVerifyLogits(MarkovEngine):
    """The Markov engine verifying as it did before it kept processed rows: the reference's verify_logits on logits."""

    def verify(self, drafts, draft_logits, target_logits, params, generator):
        return REFERENCE.verify_logits(drafts, draft_logits, target_logits, params, generator=generator)


@settings(max_examples=40, deadline=None)
@given(
    temperature=st.sampled_from([0.0, 0.6, 1.0, 1.5]),
    top_k=st.integers(0, 20),
    top_p=st.sampled_from([1.0, 0.5, 0.9]),
    min_p=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_markov_engine_emits_what_the_references_verify_logits_would(temperature, top_k, top_p, min_p, seed):
    """The Markov engine's chain on the rows it processed once per request emits, token for token, what the
    reference's ``verify_logits`` on the raw logits emits (same generator, same draws), seeded and unseeded rows,
    greedy included."""
    params = SamplingParams.build(
        3, temperature=[temperature, 1.0, temperature], top_k=[top_k, 0, top_k], top_p=[top_p, 1.0, top_p],
        min_p=[min_p, 0.0, min_p], seed=[seed, -1, -1],
    )  # fmt: skip
    prompts = [[1, 2], [7], [40, 3, 3]]
    assert MarkovEngine(seed=2).generate(prompts, params, 13, seed) == _ThroughVerifyLogits(seed=2).generate(
        prompts, params, 13, seed
    )
