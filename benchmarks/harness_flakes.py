"""Does the harness's own test tier ever fail on a correct checkout? Runs README line 2 (``pytest``,
the repository's settings: two xdist workers, the slow tier deselected) again and again from a clean
state, idle and beside CPU-bound processes, and tallies every test that failed even once, with its
failure text (not a timed test: run it, read it).

    python benchmarks/harness_flakes.py [--runs 10] [--busy 2] [--json tally.json]
    python benchmarks/harness_flakes.py --runs 4 --busy 2 -- -m slow -k speed   # any pytest arguments

Runs alternate idle and loaded (``--busy`` pure-Python loops beside pytest, started and stopped by
this script), so drift over the hours a tally takes falls on both. Each run starts clean: a fresh
``--basetemp`` and no cache (``-p no:cacheprovider``); the repository's Hypothesis profile keeps no
example database. Exit code 0 only if every run passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

from busy import busy_processes

REPO = Path(__file__).resolve().parent.parent


@dataclass
class RunResult:
    index: int
    busy: int
    seconds: float
    returncode: int
    summary: str  # pytest's last line
    failures: dict[str, str] = field(default_factory=dict)  # test id -> failure text (failed or error)
    slowest: dict[str, float] = field(default_factory=dict)  # the ten longest tests -> seconds


def one_run(index: int, busy: int, pytest_args: list[str]) -> RunResult:
    """One full ``pytest`` run in the repository, beside ``busy`` CPU-bound processes."""
    with tempfile.TemporaryDirectory() as tmp, busy_processes(busy):
        xml = Path(tmp) / "junit.xml"
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--basetemp={Path(tmp) / 'base'}",
                f"--junitxml={xml}",
                *pytest_args,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        failures, durations = {}, {}
        if xml.exists():
            for case in ET.parse(xml).getroot().iter("testcase"):
                test_id = f"{case.get('classname')}::{case.get('name')}"
                durations[test_id] = float(case.get("time") or 0.0)
                for tag in ("failure", "error"):
                    node = case.find(tag)
                    if node is not None:
                        failures[test_id] = f"{tag}: {node.get('message') or ''}\n{node.text or ''}"
    lines = proc.stdout.strip().splitlines()
    summary = lines[-1] if lines else f"exit {proc.returncode}: {proc.stderr[-300:]}"
    if proc.returncode != 0 and not failures:  # collection errors, internal errors, crashes
        failures["<run>"] = proc.stdout[-3000:] + proc.stderr[-3000:]
    slowest = dict(sorted(durations.items(), key=lambda item: -item[1])[:10])
    return RunResult(index, busy, seconds, proc.returncode, summary, failures, slowest)


def tally(results: list[RunResult]) -> list[str]:
    """One block per test that failed at least once: idle and loaded counts, then each failure text."""
    idle = [r for r in results if not r.busy]
    loaded = [r for r in results if r.busy]
    lines = [
        f"{len(results)} runs ({len(idle)} idle, {len(loaded)} loaded): "
        f"{sum(r.returncode == 0 for r in results)} passed; wall time idle "
        + (f"{min(r.seconds for r in idle):.0f}-{max(r.seconds for r in idle):.0f} s" if idle else "-")
        + ", loaded "
        + (f"{min(r.seconds for r in loaded):.0f}-{max(r.seconds for r in loaded):.0f} s" if loaded else "-")
    ]
    flaky = sorted({test for r in results for test in r.failures})
    lines.append(f"tests that failed at least once: {len(flaky)}")
    for test in flaky:
        hit = [r for r in results if test in r.failures]
        lines.append(
            f"- {test}: {sum(not r.busy for r in hit)}/{len(idle)} idle runs, {sum(bool(r.busy) for r in hit)}/"
            f"{len(loaded)} loaded runs"
        )
        for r in hit:
            text = r.failures[test].strip()
            lines.append(f"  run {r.index} ({'busy ' + str(r.busy) if r.busy else 'idle'}): {text[-2500:]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="full pytest runs, half of them loaded")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside a loaded run")
    parser.add_argument("--json", type=Path, help="write every run's result here as well")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args()
    results: list[RunResult] = []
    for index in range(args.runs):
        busy = args.busy if index % 2 else 0
        result = one_run(index, busy, args.pytest_args)
        results.append(result)
        print(
            f"run {index} ({'busy ' + str(busy) if busy else 'idle'}): {result.seconds:.0f} s, {result.summary}"
            + (f"; failed: {', '.join(result.failures)}" if result.failures else ""),
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print("\n".join(tally(results)))
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
