"""The harness tested through the real plugin: correct verifiers pass, buggy ones fail where they should."""

from __future__ import annotations

import importlib.util
from dataclasses import astuple
from pathlib import Path

import pytest

from tests.runner_helpers import Run, run_pytest

VERIFIERS = Path(__file__).resolve().parent / "verifiers"
CORRECT = ["reference", "exponential_race", "ignores_draft_probs", "as_object"]
PROPERTIES = 8  # tests in properties/ besides the wall-clock speed property (each runs once per model)
NOT_SPEED = ["-m", "not spec_speed"]  # the speed property's stability is measured on its own (README)


def _load_buggy():
    spec = importlib.util.spec_from_file_location("spectest_meta_buggy", VERIFIERS / "buggy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUGS = _load_buggy().BUGS


def model_arg(name: str) -> str:
    return (
        name if name == "reference" else str(VERIFIERS / ("correct.py" if name in CORRECT else "buggy.py")) + f":{name}"
    )


@pytest.fixture(scope="module")
def buggy_run(tmp_path_factory) -> Run:
    """Every buggy verifier through one real pytest run of the property suite (no shrinking)."""
    args = [a for name in BUGS for a in ("--spec-model", model_arg(name))]
    return run_pytest([*args, "--spec-no-shrink", *NOT_SPEED], tmp_path_factory.mktemp("buggy"))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_buggy_verifier_fails_the_right_properties(buggy_run, bug):
    must_fail, text = BUGS[bug]
    model = f"buggy.py:{bug}"
    for prop in must_fail:
        outcome, report = astuple(buggy_run.results[(model, prop)])
        assert outcome == "failed", f"{bug} should fail {prop}, but it {outcome}"
        assert model in report, f"the failure of {prop} should name the implementation {model}"
        assert text in report, f"the failure of {prop} for {bug} should say {text!r}; it says:\n{report[-3000:]}"


def test_correct_verifiers_pass_everything(tmp_path):
    args = [a for name in CORRECT for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, *NOT_SPEED], tmp_path)
    failed = {key: o.text[-2000:] for key, o in run.results.items() if o.outcome != "passed"}
    assert not failed, f"correct verifiers failed:\n{failed}\n{run.output[-3000:]}"
    assert len(run.results) == PROPERTIES * len(CORRECT), run.output[-3000:]
    assert run.returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 21))
def test_correct_verifiers_pass_over_many_seeds(tmp_path, seed):
    """Twenty seeds, default budget, all four correct verifiers: a correct sampler never fails."""
    args = [a for name in CORRECT for a in ("--spec-model", model_arg(name))]
    run = run_pytest([*args, "--spec-seed", str(seed), *NOT_SPEED], tmp_path)
    failed = {key: o.text[-2000:] for key, o in run.results.items() if o.outcome != "passed"}
    assert not failed and run.returncode == 0, f"seed {seed}: {failed}"
