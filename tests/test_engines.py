"""Engine adapters and slow implementations: skip cleanly, reach a verdict within the time budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from spectest.checks import DistributionCheck
from spectest.resolve import resolve_model
from tests.runner_helpers import run_pytest

REPO = Path(__file__).resolve().parent.parent
GPU_ADAPTERS = ["vllm", "flashinfer"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize("name", GPU_ADAPTERS)
def test_gpu_adapters_resolve_and_say_why_they_cannot_run(name):
    model = resolve_model(name)
    assert model.unavailable and ("not installed" in model.unavailable or "CUDA" in model.unavailable)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_unavailable_adapters_skip_every_property_with_the_reason(tmp_path):
    run = run_pytest(["--spec-model", "vllm", "--spec-model", "flashinfer", "-m", "not spec_speed"], tmp_path)
    assert run.returncode == 0 and run.results, run.output[-2000:]
    assert {o.outcome for o in run.results.values()} == {"skipped"}
    assert all("cannot run here" in o.text for o in run.results.values())
    assert "vllm [standard-rejection] (unavailable:" in run.output


def test_slow_per_row_sampler_reaches_a_verdict_within_the_property_budget(tmp_path):
    """transformers' step handles one row per call: the run finishes, passes, and reports the
    weaker effect each cut-short check could still detect."""
    pytest.importorskip("transformers")
    report = tmp_path / "out"
    run = run_pytest(
        ["--spec-model", "transformers", "--spec-property-seconds", "6", "-k", "every_row or bonus",
         "--spec-report", str(report)],
        tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert "cut short by --spec-property-seconds (6 s per property) on transformers" in run.output
    checks = json.loads((report / "results.json").read_text())["checks"]
    limited = [c for c in checks if c["time_limited"]]
    assert limited and all(c["draws"] < c["planned_draws"] for c in limited)
    assert all(c["min_detectable_tv"] > 0 for c in limited)
    durations = [t["duration_s"] for t in json.loads((report / "results.json").read_text())["tests"]]
    assert max(durations) < 6 * 4, durations  # the budget, plus minimum draws and the exact parts


def test_a_time_limited_check_stops_at_its_minimum_draws_and_says_so():
    probs = np.full((1, 10), 0.1)
    check = DistributionCheck("slow", probs, alpha=1e-3, tolerance=0.01, min_draws=50, max_draws=10**6,
                              time_budget=1e-9)  # fmt: skip
    rng = np.random.default_rng(0)
    while not check.done:
        batch = check.next_batch(10**6)
        check.add(rng.multinomial(batch, probs[0])[None, :], batch)
    result = check.result()
    assert check.draws == 50 and result.time_limited and result.passed
    assert "time-limited: 50 of" in result.summary() and result.min_detectable_tv > 0.01


def test_transformers_adapter_leaves_the_global_rng_alone():
    pytest.importorskip("transformers")
    model = resolve_model("transformers")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    q = torch.full((2, 3, 7), 1 / 7)
    p = torch.softmax(torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(1)), -1)
    model.verify(torch.zeros((2, 3), dtype=torch.int64), q, p, generator=torch.Generator().manual_seed(0))
    assert torch.equal(before, torch.random.get_rng_state())


def test_worked_example_adapter_passes_the_exact_properties(tmp_path):
    model = f"{REPO / 'examples' / 'wrap_my_sampler.py'}:ADAPTER"
    run = run_pytest(["--spec-model", model, "-k", "rejection or inputs or same_generator"], tmp_path)
    assert run.returncode == 0 and len(run.results) == 4, run.output[-3000:]
