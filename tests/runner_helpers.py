"""Run pytest with the spectest plugin in a fresh process and read back every test's outcome."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Outcome:
    outcome: str  # passed, failed, error, skipped
    text: str


@dataclass
class Run:
    returncode: int
    output: str
    results: dict[tuple[str, str], Outcome]  # (model id, test name) -> outcome


def run_pytest(args: list[str], workdir: Path, timeout: float = 900) -> Run:
    """``python -m pytest ARGS`` in ``workdir`` (outside the repo, as a user would run it)."""
    xml = workdir / "results.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args, f"--junitxml={xml}", "-p", "no:cacheprovider"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
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
    return Run(proc.returncode, proc.stdout + proc.stderr, results)
