"""The harness tested through the real plugin: correct verifiers pass, buggy ones fail where they should."""

from __future__ import annotations

import importlib.util
from dataclasses import astuple
from pathlib import Path

import pytest

from tests.runner_helpers import Run, run_pytest

REPO = Path(__file__).resolve().parent.parent
VERIFIERS = REPO / "tests" / "verifiers"
CORRECT = ["reference", "exponential_race", "ignores_draft_probs", "as_object"]
# Logits-level controls (their chain verify is one of the above), run on the sampling properties.
CORRECT_LOGITS = ["reference", "one_hot_draft_logits", "min_p_first", "propose_with_chain_verify"]
PROPERTIES = 13  # tests in properties/ besides the wall-clock speed property (each runs once per model)
NOT_SPEED = ["-m", "not spec_speed"]  # the speed property's stability is measured on its own (README)
SAMPLING = "properties/test_sampling_params.py"
# property -> capabilities it needs (a model without them must skip it, saying why)
NEEDS = {
    "test_logits_rows_follow_the_processed_target": {"logits"},
    "test_greedy_rows_equal_greedy_decoding": {"logits"},
    "test_drafts_follow_the_reported_probs": {"propose"},
    "test_propose_then_verify_is_lossless": {"propose"},
    "test_seeded_rows_ignore_the_rest_of_the_batch": {"logits", "per-row-seeds"},
}
CAPABILITIES = {
    "reference": {"logits", "propose", "per-row-seeds"},
    "one_hot_draft_logits": {"logits"},
    "min_p_first": {"logits", "propose", "per-row-seeds"},
    "propose_with_chain_verify": {"propose"},
}


def _load(file: str):
    spec = importlib.util.spec_from_file_location(f"spectest_meta_{Path(file).stem}", VERIFIERS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUGS = _load("buggy.py").BUGS
LOGITS_BUGS = _load("buggy_logits.py").BUGS


def model_arg(name: str) -> str:
    if name == "reference":
        return name
    file = (
        "correct.py" if name in CORRECT + CORRECT_LOGITS else "buggy_logits.py" if name in LOGITS_BUGS else "buggy.py"
    )
    return f"{VERIFIERS / file}:{name}"


def expected_outcome(model: str, prop: str) -> str:
    """passed, or skipped where the model lacks a capability the property needs."""
    return "passed" if NEEDS.get(prop, set()) <= CAPABILITIES.get(model, set()) else "skipped"


def assert_all_as_expected(run: Run, models: list[str]) -> None:
    wrong = {
        key: (o.outcome, o.text[-2000:])
        for key, o in run.results.items()
        if o.outcome != expected_outcome(key[0].rpartition(":")[2], key[1])
    }
    assert not wrong, (
        f"correct samplers did not pass (or skip for a missing capability):\n{wrong}\n{run.output[-3000:]}"
    )
    assert run.returncode == 0


@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory) -> Run:
    """Every buggy verifier through one real pytest run of the property suite (no shrinking)."""
    args = [a for name in BUGS for a in ("--spec-model", model_arg(name))]
    return run_pytest([*args, "--spec-no-shrink", *NOT_SPEED], tmp_path_factory.mktemp("buggy"))


@pytest.fixture(scope="module")
def buggy_logits_run(tmp_path_factory) -> Run:
    """Every buggy logits-level sampler through one real run of the sampling-parameter properties."""
    args = [a for name in LOGITS_BUGS for a in ("--spec-model", model_arg(name))]
    return run_pytest([*args, "--spec-no-shrink", str(REPO / SAMPLING)], tmp_path_factory.mktemp("buggy_logits"))


def assert_caught(run: Run, model: str, must_fail: tuple[str, ...], text: str) -> None:
    for prop in must_fail:
        outcome, report = astuple(run.results[(model, prop)])
        assert outcome == "failed", f"{model} should fail {prop}, but it {outcome}"
        assert model in report, f"the failure of {prop} should name the implementation {model}"
        assert text in report, f"the failure of {prop} for {model} should say {text!r}; it says:\n{report[-3000:]}"


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_buggy_verifier_fails_the_right_properties(buggy_run, bug):
    assert_caught(buggy_run, f"buggy.py:{bug}", *BUGS[bug])


@pytest.mark.parametrize("bug", sorted(LOGITS_BUGS))
def test_buggy_logits_sampler_fails_the_right_properties(buggy_logits_run, bug):
    assert_caught(buggy_logits_run, f"buggy_logits.py:{bug}", *LOGITS_BUGS[bug])


def test_correct_verifiers_pass_everything(tmp_path):
    args = [a for name in CORRECT for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, *NOT_SPEED], tmp_path)
    assert_all_as_expected(run, CORRECT)
    assert len(run.results) == PROPERTIES * len(CORRECT), run.output[-3000:]


def test_correct_logits_samplers_pass_the_sampling_properties(tmp_path):
    """Reference, one-hot-draft control, vLLM's filter order, and propose paired with verify."""
    args = [a for name in CORRECT_LOGITS for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, str(REPO / SAMPLING)], tmp_path)
    assert_all_as_expected(run, CORRECT_LOGITS)
    assert len(run.results) == len(NEEDS) * len(CORRECT_LOGITS), run.output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 21))
def test_correct_verifiers_pass_over_many_seeds(tmp_path, seed):
    """Twenty seeds, default budget, all four correct verifiers: a correct sampler never fails."""
    args = [a for name in CORRECT for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, "--spec-seed", str(seed), *NOT_SPEED, "--ignore", str(REPO / SAMPLING)], tmp_path)
    assert_all_as_expected(run, CORRECT)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 11))
def test_correct_logits_samplers_pass_over_many_seeds(tmp_path, seed):
    """Ten seeds of the sampling-parameter properties: the reference and the three logits controls."""
    args = [a for name in CORRECT_LOGITS for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, "--spec-seed", str(seed), str(REPO / SAMPLING)], tmp_path)
    assert_all_as_expected(run, CORRECT_LOGITS)
    assert len(run.results) == len(NEEDS) * len(CORRECT_LOGITS), run.output[-3000:]


SLOW = ["full_residual_every_position", "sleeps_per_rejection"]
SPEED = "test_measured_speedup_follows_the_model"


def test_speed_property_passes_the_reference_and_fails_slow_verifiers(tmp_path):
    """Exact but slow verifiers (tests/verifiers/slow.py) fail the speed property by its cost rule;
    the reference passes it; the report plots the sweep."""
    args = ["--spec-model", "reference"] + [
        a for name in SLOW for a in ("--spec-model", f"{VERIFIERS / 'slow.py'}:{name}")
    ]
    run = run_pytest([*args, "-k", "speed", "--spec-report", str(tmp_path / "report")], tmp_path)
    assert run.results[("reference", SPEED)].outcome == "passed", run.output[-3000:]
    for name in SLOW:
        outcome = run.results[(f"slow.py:{name}", SPEED)]
        assert outcome.outcome == "failed", f"{name} should fail the speed property:\n{run.output[-3000:]}"
        assert outcome.failure == {"kind": "rule", "rule": "a pass costs at most x1.1 the model's"}, outcome.text
    figures = [f for f in run.document["figures"] if f.get("speed_points")]
    assert {f["model"] for f in figures} == {"reference", *(f"slow.py:{name}" for name in SLOW)}
    assert all(len(f["speed_points"]) == 4 and f["break_even_predicted"] is not None for f in figures)
    assert "Speedup against acceptance" in (tmp_path / "report" / "report.html").read_text()
