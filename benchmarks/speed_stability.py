"""Does the speed property hold up on a shared machine? Runs it alone, seed after seed, idle and
with CPU-bound processes beside it, on several correct models at once, and prints the tally (not a
timed test: run it, read it).

    python benchmarks/speed_stability.py [--runs 20] [--busy 4] [--model reference --model ...]
    python benchmarks/speed_stability.py --engine transformers-assisted [--engine ...] --runs 5 --busy 2

Default models: the reference, the exponential-race verifier (tests/verifiers/correct.py) and the
exact verifier that is slow everywhere (tests/verifiers/slow.py:full_residual_every_position, about
four times an efficient pass). For each run and model: the verdict (passed, failed, skipped, or a
harness error), its rounds, and the range of measured over own-model speedup across the sweep's
points, from the run's results file. The busy processes are pure-Python loops started and stopped
by this script. Exit code 0 only if no correct model failed and the harness never erred.
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
MODELS = (
    "reference",
    str(REPO / "tests" / "verifiers" / "correct.py") + ":exponential_race",
    str(REPO / "tests" / "verifiers" / "slow.py") + ":full_residual_every_position",
)


def one_run(models: list[str], seed: int, engines: bool = False) -> tuple[float, list[dict[str, object]]]:
    """One pytest run of the speed property on every model (or, with ``engines``, the end-to-end
    speed property on every engine); (wall seconds, one result per model)."""
    flag = "--spec-engine" if engines else "--spec-model"
    extra = ["--spec-e2e-speed", "-k", "test_engine_speedup_follows_its_model"] if engines else ["-k", "speed"]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *(a for m in models for a in (flag, m)),
                "--spec-seed",
                str(seed),
                *extra,
                "-q",
                "-n",
                "0",
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
        results_file = Path(tmp) / "results.json"
        document = json.loads(results_file.read_text()) if results_file.exists() else {"tests": [], "figures": []}
    results = []
    for test in document["tests"]:
        harness = (test.get("failure") or {}).get("kind") == "harness"
        mine = [f for f in document["figures"] if f["model"] == test["model"]]
        figure = next((f for f in mine if f.get("speed_points")), {})
        e2e = next((f["e2e_speed"] for f in mine if f.get("e2e_speed")), None)
        points = figure.get("speed_points", [])
        agreement = [round(p["agreement"], 3) for p in points]
        if e2e:  # end to end: measured over predicted speedup, round by round
            agreement = [round(m / p, 3) for m, p in zip(e2e["measured"], e2e["predicted"], strict=True)]
        results.append(
            {
                "model": test["model"],
                "outcome": "harness error" if harness else test["outcome"],
                "rounds": figure.get("rounds", e2e["rounds"] if e2e else 0),
                "poor_fits": figure.get("poor_fit_rounds", 0),
                "agreement": agreement,
                "efficiency": round(figure["speed_efficiency"]["pass_cost_ratio"], 3) if figure else None,
                "message": test["message"][-800:],
            }
        )
    if not results:
        results.append({"model": "?", "outcome": f"exit {proc.returncode}", "message": proc.stdout[-800:]})
    return seconds, results


def series(label: str, models: list[str], runs: int, first_seed: int, engines: bool = False) -> list[dict[str, object]]:
    everything = []
    for seed in range(first_seed, first_seed + runs):
        seconds, results = one_run(models, seed, engines)
        everything += results
        print(f"  {label} seed {seed}: {seconds:5.1f} s", flush=True)
        for r in results:
            print(
                f"    {r['model']}: {r['outcome']}, {r.get('rounds')} rounds ({r.get('poor_fits')} not judged), "
                f"measured/own model {r.get('agreement')}, x{r.get('efficiency')} of an efficient pass",
                flush=True,
            )
            if r["outcome"] != "passed":
                print("      " + str(r["message"]).replace("\n", "\n      "))
    return everything


def tally(label: str, results: list[dict[str, object]]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        mine = [r for r in results if r["model"] == model]
        outcomes = [r["outcome"] for r in mine]
        agreement = [x for r in mine for x in r.get("agreement", [])]  # type: ignore[union-attr]
        rounds = [int(r.get("rounds", 0)) for r in mine]  # type: ignore[arg-type]
        lines.append(
            f"{label}, {Path(str(model)).name}: {outcomes.count('passed')}/{len(mine)} passed, "
            f"{outcomes.count('failed')} failed, {outcomes.count('skipped')} skipped, "
            f"{outcomes.count('harness error')} harness errors; rounds {min(rounds)} to {max(rounds)} (median "
            f"{statistics.median(rounds):g}); measured/own-model speedup "
            + (f"{min(agreement):.3f} to {max(agreement):.3f}" if agreement else "-")
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=4, help="CPU-bound processes for the loaded series")
    parser.add_argument("--model", action="append", help="a --spec-model value (repeatable; default: three)")
    parser.add_argument(
        "--engine",
        action="append",
        help="a --spec-engine value: run the end-to-end speed property instead (repeatable)",
    )
    args = parser.parse_args()
    engines = bool(args.engine)
    models = args.engine or args.model or list(MODELS)
    print(f"idle: {args.runs} runs of the speed property on {len(models)} subjects", flush=True)
    idle = series("idle", models, args.runs, 1, engines)
    print(f"loaded: {args.runs} runs with {args.busy} CPU-bound processes beside it", flush=True)
    with busy_processes(args.busy):
        loaded = series("loaded", models, args.runs, 101, engines)
    for line in tally("idle", idle) + tally(f"loaded ({args.busy} busy processes)", loaded):
        print(line)
    return 0 if all(r["outcome"] == "passed" for r in idle + loaded) else 1


if __name__ == "__main__":
    raise SystemExit(main())
