"""Does the speed property hold up on a shared machine? Runs it alone, seed after seed, idle and
with CPU-bound processes beside it, and prints the tally (not a timed test: run it, read it).

    python benchmarks/speed_stability.py [--runs 20] [--busy 2] [--model reference]

For each run: the verdict, its wall time, the rounds it took, and the median model/measured pass
cost and measured/predicted speedup over the sweep's points (from the run's results file).
The busy processes are pure-Python loops started and stopped by this script.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def spin() -> None:
    while True:
        pass


def one_run(model: str, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--spec-model",
                model,
                "--spec-seed",
                str(seed),
                "-k",
                "speed",
                "-q",
                "-p",
                "no:cacheprovider",
                "--spec-report",
                tmp,
            ],
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        seconds = time.perf_counter() - started
        document = json.loads((Path(tmp) / "results.json").read_text())
    outcome = document["tests"][0]["outcome"] if document["tests"] else f"exit {proc.returncode}"
    points = [p for f in document["figures"] for p in f.get("speed_points", [])]
    return {
        "seed": seed,
        "outcome": outcome,
        "seconds": seconds,
        "rounds": max((p["rounds"] for p in points), default=0),
        "pass_cost_ratio": [round(p["pass_cost_ratio"], 3) for p in points],
        "speedup_ratio": [round(p["ratio"], 3) for p in points],
        "message": document["tests"][0]["message"][-600:] if document["tests"] else proc.stdout[-600:],
    }


def series(label: str, model: str, runs: int, first_seed: int) -> list[dict[str, object]]:
    results = []
    for seed in range(first_seed, first_seed + runs):
        result = one_run(model, seed)
        results.append(result)
        print(
            f"  {label} seed {seed}: {result['outcome']:7} {result['seconds']:5.1f} s, {result['rounds']} rounds, "
            f"pass model/measured {result['pass_cost_ratio']}, speedup measured/model {result['speedup_ratio']}",
            flush=True,
        )
        if result["outcome"] != "passed":
            print("    " + str(result["message"]).replace("\n", "\n    "))
    return results


def tally(label: str, results: list[dict[str, object]]) -> str:
    outcomes = [r["outcome"] for r in results]
    seconds = [float(r["seconds"]) for r in results]  # type: ignore[arg-type]
    ratios = [x for r in results for x in r["pass_cost_ratio"]]  # type: ignore[union-attr]
    return (
        f"{label}: {outcomes.count('passed')}/{len(results)} passed, {outcomes.count('failed')} failed, "
        f"{outcomes.count('skipped')} skipped; wall {min(seconds):.1f} to {max(seconds):.1f} s (median "
        f"{statistics.median(seconds):.1f}); pass model/measured {min(ratios):.3f} to {max(ratios):.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes for the loaded series")
    parser.add_argument("--model", default="reference")
    args = parser.parse_args()
    print(f"idle: {args.runs} runs of the speed property on {args.model}", flush=True)
    idle = series("idle", args.model, args.runs, 1)
    print(f"loaded: {args.runs} runs with {args.busy} CPU-bound processes beside it", flush=True)
    workers = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for worker in workers:
        worker.start()
    try:
        loaded = series("loaded", args.model, args.runs, 101)
    finally:
        for worker in workers:
            worker.terminate()
    print(tally("idle", idle))
    print(tally(f"loaded ({args.busy} busy processes)", loaded))
    return 0 if all(r["outcome"] == "passed" for r in idle + loaded) else 1


if __name__ == "__main__":
    raise SystemExit(main())
