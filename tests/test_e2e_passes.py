"""Tokens per pass from an engine's own passes (spectest.e2e.passes): the acceptance trials, their PIT, the passes
read from each real engine's records, token match's efficiency, and a loop that throws accepted drafts away.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from spectest import rules
from spectest.e2e.passes import expected_tokens_per_pass, trial_pit, trials
from tests.engines import ENGINES, SLOW
from tests.runner_helpers import run_pytest


def test_acceptance_trials_read_from_the_passes_and_their_pit_is_uniform():
    """A pass of K drafts emitting L tokens verified min(L, K) drafts: L - 1 accepted, then a
    rejection unless L = K + 1 (the bonus). Bernoulli(a) outcomes give Uniform(0, 1) PITs; a loop
    accepting less than a does not."""
    index, offset, accepted = trials([3, 1, 5, 2], [4, 4, 4, 1])
    assert index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9] and offset.tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 0]
    assert accepted.tolist() == [True, True, False, False, True, True, True, True, True]
    rng = np.random.default_rng(4)
    a = rng.uniform(0.05, 0.95, 20000)
    fair = rng.random(a.size) < a
    assert stats.kstest(trial_pit(a, fair, rng.random(a.size)), "uniform").pvalue > 1e-6
    stingy = rng.random(a.size) < 0.8 * a
    assert stats.kstest(trial_pit(a, stingy, rng.random(a.size)), "uniform").pvalue < 1e-6
    assert expected_tokens_per_pass([1.0, 1.0]) == 3.0 and expected_tokens_per_pass([0.5, 0.5]) == 1.75


def test_a_token_match_loop_has_its_acceptance_efficiency_measured_not_judged(tmp_path):
    """An exact loop that accepts by token match (llama.cpp's and MLX-LM's) and does not declare
    standard rejection: the tokens-per-pass property skips with its acceptance
    efficiency, whose interval covers token match's chance over standard rejection's (sum p q over sum
    min(p, q) at the same contexts) and lies below 1."""
    engine = f"{ENGINES / 'markov.py'}:token_match"
    run = run_pytest(
        [
            "--spec-engine",
            engine,
            "-n",
            "0",
            "--spec-seed",
            "2",
            "--spec-budget",
            "quick",
            "-rs",
            "-k",
            "pass or follows",
        ],
        tmp_path,
    )
    name = "markov.py:token_match"
    key = (name, "test_tokens_per_pass_follow_the_engines_acceptance")
    assert run.results[key].outcome == "skipped", run.explain(*key)
    [figure] = [f for f in run.document["figures"] if f["model"] == name and "acceptance_efficiency" in f]
    low, high = (bound / figure["acceptance_standard_rejection"] for bound in figure["acceptance_interval"])
    expected = figure["acceptance_token_match"] / figure["acceptance_standard_rejection"]
    assert low <= expected <= high and high < 1, run.explain(*key)
    assert "acceptance efficiency against standard rejection" in run.output
    assert "Failing explicit example" not in run.output, "a skip is no failure: its reason must not read as one"


def test_mlx_passes_are_read_from_its_from_draft_flags():
    """MLX-LM yields whether each token came from the draft; a pass drafts min(tokens left, K) and ends at
    its first target token; the output's last token is reported as a bonus whatever it was (the two
    endings look alike there), so no trial is chosen by its outcome."""
    from spectest.e2e.engines.mlx_lm import passes_from_flags

    # passes: [d, d, T] [T] [d, d, d, d, T] [d, d, d (the end)]: K = 4, 12 tokens
    flags = [True, True, False, False, True, True, True, True, False, True, True]
    assert passes_from_flags([*flags, True], 4, 12) == ([3, 1, 5, 3], [4, 4, 4, 2])
    assert passes_from_flags([*flags[:-1], False], 4, 11) == ([3, 1, 5, 2], [4, 4, 4, 1])
    assert passes_from_flags([False] * 3, 4, 3) == ([1, 1, 1], [3, 2, 0])
    _, _, accepted = trials(*passes_from_flags([*flags, True], 4, 12))
    assert accepted.tolist() == [True, True, False, False, True, True, True, True, True, True]


def test_llama_cpps_draft_model_calls_give_its_passes():
    """llama-cpp-python calls its draft model once per target pass after the prompt's (which samples the
    first token), with the sequence so far: the calls tile the output into passes. The last pass's last
    token is reported as a bonus whatever it was, as for MLX-LM; calls that do not tile the output are the
    adapter's error, not a verdict."""
    from spectest.e2e.engines.llama_cpp import passes_from_calls
    from spectest.e2e.passes import drafting_passes

    # a 3-token prompt, 11 tokens: the prompt's pass [1]; drafts of 4 at lengths 4, 7 and 12: [3] [5] [2 (the end)]
    assert passes_from_calls([(4, 4), (7, 4), (12, 4)], 3, 11) == ([1, 3, 5, 2], [0, 4, 4, 1])
    assert passes_from_calls([(4, 0), (5, 4)], 3, 4) == ([1, 1, 2], [0, 0, 1])  # a look-up that found nothing
    assert passes_from_calls([], 3, 1) == ([1], [0]) and passes_from_calls([], 3, 0) == ([], [])
    _, _, accepted = trials(*passes_from_calls([(4, 4), (7, 4), (12, 4)], 3, 11))
    assert accepted.tolist() == [True, True, False, True, True, True, True, True]
    assert drafting_passes([1, 3, 5, 2], "prefill") == [3, 5, 2] and drafting_passes([3, 5], "drafted") == [3, 5]
    with pytest.raises(RuntimeError, match="do not tile"):
        passes_from_calls([(4, 4), (4, 4)], 3, 6)


def test_a_loop_that_throws_accepted_drafts_away_fails_tokens_per_pass(tmp_path):
    """Exact output, one token per pass where its acceptance allows about two: the acceptance
    trials along its own contexts catch it (read from the results file)."""
    pytest.importorskip("transformers")
    run = run_pytest(
        [
            "--spec-engine",
            f"{SLOW}:keeps_one_token_per_pass",
            "-n",
            "0",
            "--spec-no-shrink",
            "-k",
            "tokens_per_pass",
        ],
        tmp_path,
    )
    key = ("slow_transformers.py:keeps_one_token_per_pass", "test_tokens_per_pass_follow_the_engines_acceptance")
    outcome = run.results[key]
    assert outcome.outcome == "failed" and outcome.failure == {
        "kind": "statistical",
        "rule": rules.ACCEPTANCE_TRIALS,
    }, run.explain(*key)
