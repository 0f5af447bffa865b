"""Only the implementation can fail its verdict: a fault in the harness's own code is a harness error.

A plugin injects a fault into each stage of the harness in one real run: input generation, the
statistics, the speed property's cost fit, the terminal summary and the report. Each test it
strikes is reported as an error ("HARNESS ERROR", kind "harness" with the traceback in the results
file), never as the implementation's failure; the stages outside any test are recorded in the
results file's ``harness_errors``; the results file is still written; the exit code is 3. A real
bug in the same run still fails by its rule.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema

from spectest.reporting.results import RESULTS_SCHEMA
from tests.runner_helpers import run_pytest

VERIFIERS = Path(__file__).resolve().parent / "verifiers"
# property -> the stage whose fault strikes it
STRUCK = {
    "test_every_row_and_position_is_exact": "inputs",
    "test_sequences_follow_the_target": "statistics",
    "test_measured_speedup_follows_the_model": "fits",
}
FAULTS = textwrap.dedent(
    """
    import os

    from spectest.cases import chain
    from spectest.statistics import checks
    from spectest.reporting import report, summary
    from spectest.speed import bench

    def striking(test, original):
        def wrapper(*args, **kwargs):
            if test in os.environ.get("PYTEST_CURRENT_TEST", ""):
                raise FloatingPointError(f"injected fault while running {test}")
            return original(*args, **kwargs)
        return wrapper

    chain.pair_batch = striking("test_every_row_and_position_is_exact", chain.pair_batch)
    checks.DistributionCheck.result = striking("test_sequences_follow_the_target", checks.DistributionCheck.result)
    bench.PhaseFit.fit = staticmethod(striking("test_measured_speedup_follows_the_model", bench.PhaseFit.fit))

    def broken(*args, **kwargs):
        raise FloatingPointError("injected fault after the tests")

    summary.summary_lines = broken
    report.render = broken
    """
)


def test_a_fault_in_any_harness_stage_is_a_harness_error_not_a_failure(tmp_path):
    (tmp_path / "spectest_faults.py").write_text(FAULTS)
    report = tmp_path / "report"
    buggy = f"{VERIFIERS / 'buggy.py'}:returns_vocab_size"
    run = run_pytest(
        [
            "-p",
            "spectest_faults",
            "--spec-model",
            "reference",
            "--spec-model",
            buggy,
            "-n",
            "0",
            "--spec-no-shrink",
            "--spec-report",
            str(report),
            "-k",
            f"(reference and ({' or '.join(STRUCK)})) or (returns_vocab_size and rejection_discards)",
        ],
        tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 3, run.output[-3000:]
    for prop, stage in STRUCK.items():
        outcome = run.results[("reference", prop)]
        assert outcome.outcome == "error", (prop, stage, outcome.outcome, outcome.text[-1500:])
        assert outcome.failure["kind"] == "harness" and outcome.failure["stage"] == "call"
        assert "injected fault while running" in outcome.failure["traceback"]
        assert "HARNESS ERROR" in outcome.text and "not a failure of the implementation" in outcome.text
    bug = run.results[("buggy.py:returns_vocab_size", "test_rejection_discards_every_later_position")]
    assert bug.outcome == "failed" and bug.failure["kind"] == "rule", bug.text[-1500:]
    assert run.document == __import__("json").loads((report / "results.json").read_text())
    assert {e["stage"] for e in run.document["harness_errors"]} == {"summary", "report"}
    jsonschema.validate(run.document, RESULTS_SCHEMA)
    assert "3 errors" in run.output.splitlines()[-1] and "1 failed" in run.output.splitlines()[-1]
    assert run.output.count("spectest: HARNESS ERROR") == 5, run.output[-3000:]


FINISH_FAULT = textwrap.dedent(
    """
    from spectest.suite import run

    def broken(self):
        raise FloatingPointError("injected fault while recording the timing")

    run.SuiteRun.finish = broken
    """
)


def test_a_fault_while_recording_a_propertys_timing_is_a_harness_error_and_keeps_its_verdict(tmp_path):
    """The bookkeeping after a property's body (its timing record) is harness code too: a fault there
    is recorded as a harness error (exit code 3), and the verdict the property reached stands."""
    (tmp_path / "spectest_finish_fault.py").write_text(FINISH_FAULT)
    run = run_pytest(
        ["-p", "spectest_finish_fault", "--spec-model", "reference", "-n", "0", "-k", "rejection_discards"],
        tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert run.returncode == 3, run.output[-3000:]
    prop = "test_rejection_discards_every_later_position"
    assert run.results[("reference", prop)].outcome == "passed", run.output[-3000:]
    nodeid = next(t["nodeid"] for t in run.document["tests"] if t["property"] == prop)
    assert [e["stage"] for e in run.document["harness_errors"]] == [f"timing record of {nodeid}"]
    assert "injected fault while recording the timing" in run.output
