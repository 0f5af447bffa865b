"""How fast does the gate answer, and does a busy machine weaken its verdict? (Not a timed test:
run it, read the table.)

    python benchmarks/feedback_times.py [--only main,harness,transformers] [--busy 2]

For each command: wall time idle and with ``--busy`` CPU-bound processes beside it (started and
stopped by this script), how many distribution checks ran, how many below their planned draws,
and the median total variation they can detect (power 0.99). Run from the repository root: the
main job then uses the repository's pytest settings (two xdist workers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from busy import busy_processes

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def measure(label: str, args: list[str], busy: int) -> dict[str, object]:
    with busy_processes(busy):
        with tempfile.TemporaryDirectory() as tmp:
            results = Path(tmp) / "results.json"
            started = time.perf_counter()
            proc = subprocess.run(
                [*PYTEST, *args, "--spec-results", str(results)], cwd=REPO, capture_output=True, text=True
            )
            seconds = time.perf_counter() - started
            document = json.loads(results.read_text()) if results.exists() else {"checks": [], "tests": []}
    checks = [c for c in document["checks"] if c.get("df", 0) > 0]
    below = [c for c in checks if c.get("time_limited")]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else f"exit {proc.returncode}"
    return {
        "label": label,
        "busy": busy,
        "seconds": seconds,
        "outcome": summary,
        "checks": len(checks),
        "below_plan": len(below),
        "draws": f"{sum(c['draws'] or 0 for c in below)}/{sum(c['planned_draws'] or 0 for c in below)}"
        if below
        else "-",
        "median_mde": statistics.median(c["min_detectable_tv"] for c in checks) if checks else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="main,harness,transformers")
    parser.add_argument("--busy", type=int, default=2)
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    plan = []
    if "main" in wanted:
        for load in (0, args.busy):
            plan.append(("pytest --spec-model reference (2 workers)", ["--spec-model", "reference"], load))
            plan.append(("pytest --spec-model reference -n 0", ["--spec-model", "reference", "-n", "0"], load))
    if "harness" in wanted:
        plan.append(("pytest (the harness's tests)", [], 0))
    if "transformers" in wanted:
        plan.append(("pytest --spec-model transformers -n 0", ["--spec-model", "transformers", "-n", "0"], 0))
    print(
        "| command | busy processes | wall | result | distribution checks | below plan (draws) | median detectable TV |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, pytest_args, load in plan:
        row = measure(label, pytest_args, load)
        print(
            f"| `{row['label']}` | {row['busy']} | {row['seconds']:.0f} s | {row['outcome']} | {row['checks']} | "
            f"{row['below_plan']} ({row['draws']}) | {row['median_mde']:.3f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
