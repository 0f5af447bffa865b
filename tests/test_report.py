"""Results file and reports: schema, failures shown, HTML parses and escapes, xdist, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from spectest.reporting import plots, report, results
from tests.runner_helpers import once_per_run, run_pytest

VERIFIERS = Path(__file__).resolve().parent / "verifiers"
QUICK = ["--spec-budget", "quick", "--spec-no-shrink", "-m", "not spec_speed"]


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
        if tag == "script":
            self.scripts += 1


@pytest.fixture(scope="session")
def failing_run(tmp_path_factory) -> Path:
    """A real run with one correct and one buggy model, reported into a directory."""
    args = ["--spec-model", "reference", "--spec-model", f"{VERIFIERS / 'buggy.py'}:accept_all", *QUICK]

    def report(work: Path) -> Path:
        run_pytest([*args, "-k", "rejection or every_row", "--spec-report", str(work / "out")], work)
        return work / "out"

    return once_per_run(tmp_path_factory, "failing_run", report)


def test_results_file_follows_its_schema(failing_run):
    document = json.loads((failing_run / "results.json").read_text())
    jsonschema.validate(document, results.RESULTS_SCHEMA)
    assert document["environment"]["packages"]["torch"] and document["environment"]["seed"] >= 0
    models = {m["name"]: m for m in document["environment"]["models"]}
    assert {"logits", "propose", "per-row-seeds"} <= set(models["reference"]["capabilities"])
    assert {t["model"] for t in document["tests"]} == {"reference", "buggy.py:accept_all"}


def test_a_failing_run_shows_its_failures_everywhere(failing_run):
    document = results.load(failing_run / "results.json")
    failed = [t for t in document["tests"] if t["outcome"] == "failed"]
    assert {t["model"] for t in failed} == {"buggy.py:accept_all"}
    assert any("broke rule 'a rejection at position k emits exactly k + 1 tokens'" in t["message"] for t in failed)
    summary = (failing_run / "summary.md").read_text()
    assert "| buggy.py:accept_all | 1 | 2 | 0 |" in summary and "### Failures" in summary  # it passes forced acceptance
    page = (failing_run / "report.html").read_text()
    assert "a rejection at position k emits exactly k + 1 tokens" in page


def test_html_parses_and_embeds_its_plots(failing_run):
    parser = Collect()
    parser.feed((failing_run / "report.html").read_text())
    # Verdict table and break-even table at least (accept_all fails exact rules: no failing-cell plot).
    assert len(parser.images) >= 2 and all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert parser.scripts == 0


def test_hostile_model_name_is_escaped(tmp_path):
    hostile = "<script>alert('spectest')</script>"
    script = textwrap.dedent(
        f"""
        from spectest import REFERENCE, check_verifier
        check_verifier(REFERENCE.verify, name={hostile!r}, budget="quick", raise_on_failure=False,
                       pytest_args=["-q", "-k", "inputs_are_not", "--spec-report", "out"])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(" in page
    summary = (tmp_path / "out" / "summary.md").read_text()  # GitHub renders HTML inside Markdown
    assert "<script>" not in summary and "&lt;script&gt;alert(" in summary
    assert results.load(tmp_path / "out" / "results.json")["tests"][0]["model"] == hostile


def test_without_matplotlib_the_report_says_so_and_keeps_the_json(failing_run, tmp_path, monkeypatch):
    monkeypatch.setattr(plots, "available", lambda: False)
    document = results.load(failing_run / "results.json")
    report.render(document, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "Plots unavailable: matplotlib is not installed" in page and "data:image/png" not in page
    assert results.load(failing_run / "results.json") == document


def test_xdist_run_writes_one_complete_results_file(tmp_path):
    args = ["--spec-model", "reference", *QUICK, "-n", "2", "--spec-report", str(tmp_path / "out")]
    run = run_pytest(
        [
            *args,
            "-k",
            "not sampling_params and not sequences and not every_row and not tree and not token_wise and not short_rows"
            " and not large_vocabularies",
        ],
        tmp_path,
    )
    assert run.returncode == 0, run.output[-3000:]
    document = results.load(tmp_path / "out" / "results.json")
    assert len(document["tests"]) == 6 and all(t["outcome"] == "passed" for t in document["tests"])
    assert document["checks"] and {c["seed"] for c in document["checks"]} == {document["environment"]["seed"]}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "results.json", "summary.md"]


def test_report_and_compare_commands(failing_run, tmp_path):
    cli = [sys.executable, "-m", "spectest.cli"]
    rendered = subprocess.run(
        [*cli, "report", str(failing_run / "results.json"), "-o", str(tmp_path)], capture_output=True, text=True
    )
    assert rendered.returncode == 0 and (tmp_path / "report.html").exists()
    compared = subprocess.run(
        [*cli, "compare", str(failing_run / "results.json"), str(failing_run / "results.json")],
        capture_output=True,
        text=True,
    )
    assert compared.returncode == 0
    assert "| buggy.py:accept_all | test_rejection_discards_every_later_position | failed | failed |" in compared.stdout
    bad = subprocess.run(
        [*cli, "report", str(tmp_path / "report.html"), "-o", str(tmp_path)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "error:" in bad.stderr


def test_acceptance_figures_are_recorded_and_plotted(tmp_path):
    args = ["--spec-model", "reference", *QUICK, "-k", "tokens_per_call", "--spec-report", str(tmp_path / "out")]
    run_pytest(args, tmp_path)
    document = results.load(tmp_path / "out" / "results.json")
    figures = [f for f in document["figures"] if "prefix_acceptance" in f]
    assert figures and all(
        len(f["prefix_acceptance"]) == f["k"] == len(f["prefix_acceptance_optimal"]) for f in figures
    )
    # The reference is standard rejection sampling: its prefix acceptance is the optimum, up to noise.
    assert all(
        abs(m - o) < 0.05
        for f in figures
        for m, o in zip(f["prefix_acceptance"], f["prefix_acceptance_optimal"], strict=True)
    )
    assert "Per-position acceptance against the optimum" in (tmp_path / "out" / "report.html").read_text()


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    results.write_atomically(tmp_path / "results.json", {"schema": results.SCHEMA, "x": float("nan")})
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]
    assert json.loads((tmp_path / "results.json").read_text())["x"] is None


def test_the_end_to_end_speed_figure_is_plotted_measured_against_predicted():
    speed = {"k": 4, "measured": [0.37, 0.36, 0.38], "predicted": [0.38, 0.37, 0.39]}
    figures = [{"kind": "figure", "model": "transformers-assisted", "e2e_speed": speed}, {"model": "x", "k": 4}]
    image = plots.e2e_speedup(figures)
    assert image is not None and image.startswith(b"\x89PNG")
    assert plots.e2e_speedup(figures[1:]) is None
