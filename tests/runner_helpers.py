"""Run pytest with the spectest plugin in a fresh process and read back every test's outcome."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# How many seeds the slow tier's "a correct subject passes seed after seed" meta-tests run (seeds 1..N). CI runs
# one (its 45 minutes hold the whole engine tier too); SPECTEST_META_SEEDS=3 pytest -m slow runs more.
META_SEEDS = int(os.environ.get("SPECTEST_META_SEEDS", "1"))


@dataclass
class Outcome:
    outcome: str  # passed, failed, error, skipped
    text: str
    failure: dict | None = None  # from the results file: {"kind": rule|statistical|harness, "rule": ...}


@dataclass
class Run:
    returncode: int
    output: str
    results: dict[tuple[str, str], Outcome]  # (model id, test name) -> outcome
    document: dict | None = None  # the run's results file (spectest.results/1), when it wrote one

    def explain(self, model: str, prop: str, limit: int = 4000) -> str:
        """What decided ``prop`` on ``model``, for a meta-test's failure message: the outcome, its
        failure text, and the figures and checks the run recorded for it (a passing property has no
        failure text: its figures say why it passed)."""
        outcome = self.results.get((model, prop))
        if outcome is None:
            return f"{model} on {prop}: not in the run\n{self.output[-limit:]}"
        records = [
            {key: value for key, value in record.items() if key not in ("model", "property", "counts", "model_probs")}
            for section in ("figures", "checks")
            for record in (self.document or {}).get(section, [])
            if record.get("model") == model and record.get("property") == prop
        ]
        figures = json.dumps(records, default=str)
        return (
            f"{model} on {prop}: {outcome.outcome} {outcome.failure or ''}\n{outcome.text[-limit:]}\n"
            f"recorded: {figures[:limit]}"
        )


def run_pytest(args: list[str], workdir: Path, timeout: float = 900, env: dict[str, str] | None = None) -> Run:
    """``python -m pytest ARGS`` in ``workdir`` (outside the repo, as a user would run it), with
    ``env`` added to the environment."""
    xml = workdir / "results.xml"
    results_file = workdir / "spectest-results.json"
    command = [sys.executable, "-m", "pytest", *args, f"--junitxml={xml}", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [*command, "--spec-results", str(results_file)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )
    results: dict[tuple[str, str], Outcome] = {}
    if xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            name, _, model = case.get("name", "").partition("[")
            outcome, text = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome, text = (
                        tag if tag != "failure" else "failed",
                        (node.get("message") or "") + (node.text or ""),
                    )
            results[(model.rstrip("]"), name)] = Outcome(outcome, text)
    document = json.loads(results_file.read_text()) if results_file.exists() else None
    for test in document["tests"] if document else []:
        if (test["model"], test["property"]) in results:
            outcome = results[(test["model"], test["property"])]
            outcome.failure = test.get("failure")
            if test["outcome"] == "error":  # a harness error (JUnit XML calls any failed call a failure)
                outcome.outcome = "error"
    return Run(proc.returncode, proc.stdout + proc.stderr, results, document)


def once_per_run(tmp_path_factory, name: str, compute: Callable[[Path], T]) -> T:
    """``compute(workdir)`` once for the whole test run, however many xdist workers ask for it.

    Every worker is a pytest session of its own, so a session fixture would run once per worker
    (and ``--dist loadgroup`` did not keep a module's tests on one worker here). The first worker
    to ask computes the run under a file lock in the run's shared temporary directory; the
    others wait for it and read it back (the xdist docs' recipe for session fixtures)."""
    from filelock import FileLock  # torch's own dependency

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, not older runs'
    cache = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if cache.exists():
            return pickle.loads(cache.read_bytes())
        workdir = shared / name
        workdir.mkdir(exist_ok=True)
        run = compute(workdir)
        cache.write_bytes(pickle.dumps(run))
        return run
