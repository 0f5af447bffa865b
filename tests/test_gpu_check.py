"""The prepared GPU check (.ci/gpu-check, .ci/gpu_check.py), as far as a CPU can hold it: its plan takes every
registered subject from the entry points and says why each skipped one cannot run, and its summary reads every
verdict from the files the steps write (a broken kernel counts as caught only when its property failed by a rule
or a statistical check). tests/test_engines.py checks that the run itself stops at once without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def gpu_check():
    spec = importlib.util.spec_from_file_location("spectest_gpu_check", REPO / ".ci" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU plan")
def test_the_plan_lists_every_registered_subject_and_its_steps(tmp_path):
    pytest.importorskip("triton")
    # TRITON_INTERPRET=1 makes the Triton kernel available here, so its steps are planned too.
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        ["bash", str(REPO / ".ci" / "gpu-check"), "--plan"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("gpu-check --plan: no CUDA GPU here, so this is the plan only")
    subjects = {line.split()[0]: line for line in lines if line.startswith("  ") and not line.startswith("  [")}
    registered = {
        point.name for group in ("spectest.models", "spectest.engines") for point in entry_points(group=group)
    }
    assert registered <= set(subjects), registered - set(subjects)
    assert {"sglang-tree", "vllm-e2e", "reference-cupy"} <= registered
    assert "skip: the 'vllm' package is not installed" in subjects["vllm-e2e"]
    assert subjects["reference-triton"].endswith("run")
    steps = [line for line in lines if line.startswith("  [")]
    broken = next(step for step in steps if step.startswith("  [1] broken kernels"))
    for bug in ("residual_from_position_0", "id_past_v", "uniform_reused"):
        assert f"--spec-model spectest.gpu.triton:{bug}" in broken
    assert any("memcheck reference-triton" in step for step in steps)
    assert any("racecheck reference-triton" in step for step in steps)
    assert any(step.startswith("  [1] compile gate") for step in steps)
    assert any(step.startswith("  [2] bandwidth benchmark") and "reference-triton" in step for step in steps)
    timed = next(step for step in steps if step.startswith("  [2] default run reference-triton"))
    assert "--spec-model reference-triton --spec-device cuda" in timed and "--spec-budget" not in timed
    assert any(step.startswith("  [1] suite reference ") and "--spec-device cuda" in step for step in steps)
    assert list(tmp_path.iterdir()) == [], "the plan writes nothing"


def write(path: Path, document: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def result(model: str, prop: str, outcome: str, failure: dict | None = None) -> dict:
    """One test's record as a results file holds it."""
    return {"model": model, "property": prop, "outcome": outcome, "failure": failure}


def test_the_summary_reads_each_verdict_from_the_files_the_steps_wrote(tmp_path, monkeypatch):
    check = gpu_check()
    monkeypatch.setattr(check.shutil, "which", lambda name: f"/usr/local/cuda/bin/{name}")  # as on a GPU machine
    subjects = [
        check.Subject("reference", "model", None),
        check.Subject("reference-triton", "model", None),
        check.Subject("vllm", "model", "the 'vllm' package is not installed"),
    ]
    steps = check.plan("python", subjects)
    write(
        tmp_path / "suite" / "reference.json",
        {"tests": [result("reference", "a", "passed"), result("reference", "b", "skipped")]},
    )
    write(tmp_path / "suite" / "reference-triton.json", {"tests": [result("reference-triton", "a", "passed")]})
    prop = check.CATCHING_PROPERTY
    write(
        tmp_path / "broken.json",
        {
            "tests": [
                result(
                    "spectest.gpu.triton:residual_from_position_0",
                    prop,
                    "failed",
                    {"kind": "statistical", "rule": "per-position"},
                ),
                result("spectest.gpu.triton:id_past_v", prop, "failed", {"kind": "harness", "rule": "crash"}),
                result("spectest.gpu.triton:uniform_reused", prop, "passed"),
            ]
        },
    )
    write(tmp_path / "compile-gate.json", {"results": [{"label": "triton chain", "status": "ok"}]})
    rows = [
        {"reference-triton_x_floor": 1.5, "reference-triton_x_best_floor": 2.0, "reference-triton_x_flashinfer": 0.5},
        {"reference-triton_x_floor": 2.5, "reference-triton_x_best_floor": 3.0, "reference-triton_x_flashinfer": 1.25},
    ]
    write(tmp_path / "bench.json", {"rows": rows})
    timing = {"total_s": 9.0, "calls_s": 4.0, "inputs_s": 3.0, "statistics_s": 2.0}
    write(
        tmp_path / "default-run.json",
        {
            "tests": [result("reference-triton", "a", "passed"), result("reference-triton", "b", "passed")],
            "figures": [
                {"model": "reference-triton", "timing": timing},
                {"model": "reference-triton", "timing": timing},
            ],
        },
    )
    (tmp_path / "logs").mkdir()
    outcomes = {step.name: {"exit": 0, "seconds": 1.0, "timed_out": False} for step in steps}
    text, verdict = check.summarise(subjects, steps, outcomes, tmp_path)
    assert "reference                          model   passed 1 skipped 1" in text
    assert "skipped: the 'vllm' package is not installed" in text
    assert "residual_from_position_0" in text and "caught (statistical: per-position)" in text
    assert "NOT CAUGHT: failed" in text, "a harness crash is no catch"
    assert "NOT CAUGHT: passed" in text
    assert "compile 1/1 ok" in text and "median 2.0x the floor over 2 shapes (2.5x at the run's best copy)" in text
    assert "0.88x FlashInfer's time (median), faster at 1 of 2 shapes" in text
    assert (
        "default run reference-triton: 1.0 s wall (target 15 s), exit 0, passed 2; CPU in the properties 18.0 s: "
        in text
    )
    assert "the kernel's calls 8.0 s, generating inputs 6.0 s, statistics 4.0 s" in text
    assert verdict.failed == ["spectest.gpu.triton:id_past_v", "spectest.gpu.triton:uniform_reused"], verdict
    # Every broken kernel caught: then everything held.
    write(
        tmp_path / "broken.json",
        {
            "tests": [
                result(f"spectest.gpu.triton:{bug}", prop, "failed", {"kind": "rule", "rule": "r"})
                for bug in ("residual_from_position_0", "id_past_v", "uniform_reused")
            ]
        },
    )
    assert check.summarise(subjects, steps, outcomes, tmp_path)[1].headline == "all held"
    # A subject's timeout is no pass, and no failure either.
    outcomes["suite reference"]["timed_out"] = True
    text, verdict = check.summarise(subjects, steps, outcomes, tmp_path)
    assert verdict.headline == "incomplete (timed out): reference" and "timed out after 210 s" in text
    # A sanitizer's error is a failure.
    outcomes["suite reference"]["timed_out"] = False
    sanitizer = next(step for step in steps if step.kind == "sanitizer")
    outcomes[sanitizer.name] = {"exit": 99, "seconds": 1.0, "timed_out": False}
    assert check.summarise(subjects, steps, outcomes, tmp_path)[1].failed == [sanitizer.name]
