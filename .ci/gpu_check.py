"""The GPU check's plan and run (started by .ci/gpu-check, which finds the Python and installs the repository).

Subjects come from the entry points (``spectest.models`` and ``spectest.engines``), each skipped with its own
reason when it cannot run here. Phase 1 runs side by side, each step under its own timeout: the suite on CUDA
for every available model and every available engine's suite, the known-broken kernels (each must fail the
per-position property, read from the results file), the kernels' own tests on CUDA, compute-sanitizer's
memcheck and racecheck on every shipped kernel for a few shapes, and the compile gate. Phase 2 runs alone on a
quiet GPU: the bandwidth benchmark (FlashInfer as the peer where it runs) and a default-budget run of the Triton
kernel as a user starts it, timed, with where its CPU went (both failures tolerated). Everything lands in one archive,
``$OUT/gpu-check.tgz``, and a short summary goes to stdout (per subject its counts, per broken kernel its
verdict, per kernel its compile, sanitizer and bandwidth figures).

    python .ci/gpu_check.py --out DIR [--plan]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE_S, ENGINE_S, BROKEN_S, TESTS_S, SANITIZER_S, GATE_S, BENCH_S = 210, 210, 180, 200, 150, 200, 100
DEFAULT_RUN_S = 120  # issue 48's target for it: 15 s on an H200
DEFAULT_RUN_MODEL = "reference-triton"
KERNELS = {"reference-triton": "spectest.gpu.triton", "reference-cupy": "spectest.gpu.cupy"}
CATCHING_PROPERTY = "test_every_row_and_position_is_exact"  # fails each broken kernel (tests/test_triton.py)
SANITIZER_SHAPES = [("3", "4", "1025", "float32", "contiguous"), ("2", "3", "32000", "bfloat16", "padded")]
SANITIZER_SHAPES += [("2", "16", "4099", "float64", "contiguous")]
BENCH_MODELS = ("reference", "reference-compiled", "reference-triton", "reference-cupy", "flashinfer")
BENCH_SHAPES = ["--batch", "1,64,512", "--k", "4,8", "--vocab", "32000,128256", "--dtype", "float32,bfloat16"]


@dataclass
class Subject:
    name: str
    group: str  # "model" or "engine"
    unavailable: str | None


@dataclass
class Step:
    name: str
    kind: str  # suite, engine, broken, tests, sanitizer, gate, bench, timed
    command: list[str]
    timeout: int
    phase: int = 1  # 1: side by side; 2: alone, after phase 1
    subject: str = ""
    env: dict[str, str] = field(default_factory=dict)
    results: str = ""  # the results file it writes, relative to the work folder
    skipped: str | None = None  # why it cannot run here (it is listed, not run)


def subjects() -> list[Subject]:
    """Every registered model and engine, with why it cannot run here (None: it can)."""
    from spectest.e2e.resolve import resolve_engine
    from spectest.resolve import resolve_model

    found = []
    for group, resolve in (("model", resolve_model), ("engine", resolve_engine)):
        for point in sorted(entry_points(group=f"spectest.{group}s"), key=lambda p: p.name):
            try:
                reason = resolve(point.name).unavailable
            except Exception as exc:  # an adapter that cannot even load is reported, not fatal to the check
                reason = f"could not load: {type(exc).__name__}: {exc}"
            found.append(Subject(point.name, group, reason))
    return found


def plan(python: str, everything: list[Subject]) -> list[Step]:
    runnable = [s for s in everything if s.unavailable is None]
    pytest = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs"]
    steps = []
    for subject in runnable:
        results = f"suite/{subject.name}.json"
        if subject.group == "model":
            command = [*pytest, "-n", "0", "--spec-model", subject.name, "--spec-device", "cuda"]
            command += ["--spec-budget", "quick", "--spec-run-seconds", "30", "-m", "not spec_speed"]
            steps.append(
                Step(f"suite {subject.name}", "suite", command, SUITE_S, subject=subject.name, results=results)
            )
        else:
            command = [*pytest, "-n", "2", "--spec-engine", subject.name, "--spec-budget", "quick"]
            steps.append(
                Step(f"engine {subject.name}", "engine", command, ENGINE_S, subject=subject.name, results=results)
            )
    broken = [f"{KERNELS[s.name]}:{bug}" for s in runnable if s.name in KERNELS for bug in broken_names(s.name)]
    if broken:
        command = [*pytest, "-n", "0", *[a for spec in broken for a in ("--spec-model", spec)], "--spec-device", "cuda"]
        command += ["--spec-budget", "quick", "-k", CATCHING_PROPERTY]
        steps.append(Step("broken kernels", "broken", command, BROKEN_S, results="broken.json"))
    steps.append(
        Step("kernel tests", "tests", [*pytest, "-n", "0", "tests/test_triton.py", "tests/test_cupy.py"], TESTS_S)
    )
    sanitizer = shutil.which("compute-sanitizer")
    no_sanitizer = None if sanitizer else "compute-sanitizer is not on the PATH"
    for kernel in (s.name for s in runnable if s.name in KERNELS):
        for batch, k, vocab, dtype, layout in SANITIZER_SHAPES:
            for tool in ("memcheck", "racecheck"):
                launch = [python, "-m", "spectest.gpu.launch_once", kernel, batch, k, vocab, dtype, "--layout", layout]
                command = [
                    sanitizer or "compute-sanitizer",
                    "--tool",
                    tool,
                    "--error-exitcode",
                    "99",
                    "--print-limit",
                    "10",
                    *launch,
                ]
                name = f"{tool} {kernel} B={batch} K={k} V={vocab} {dtype} {layout}"
                env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # every tensor its own allocation: a read past it shows
                steps.append(
                    Step(name, "sanitizer", command, SANITIZER_S, subject=kernel, env=env, skipped=no_sanitizer)
                )
    gate = [python, "-m", "spectest.gpu.compile_gate", "--full", "--jobs", "8", "--json", "compile-gate.json"]
    steps.append(Step("compile gate", "gate", gate, GATE_S, results="compile-gate.json"))
    models = [name for name in BENCH_MODELS if any(s.name == name for s in runnable)]
    bench = [python, str(REPO / "benchmarks" / "bench_verifier.py"), "--device", "cuda", "--models", ",".join(models)]
    bench += [*BENCH_SHAPES, "--max-gb", "20", "--json", "bench.json"]
    if any(s.name == "flashinfer" for s in runnable):
        bench += ["--peer", "flashinfer"]
    steps.append(Step("bandwidth benchmark", "bench", bench, BENCH_S, phase=2, results="bench.json"))
    if any(s.name == DEFAULT_RUN_MODEL for s in runnable):
        command = [*pytest, "--spec-model", DEFAULT_RUN_MODEL, "--spec-device", "cuda"]
        name = f"default run {DEFAULT_RUN_MODEL}"
        steps.append(Step(name, "timed", command, DEFAULT_RUN_S, phase=2, results="default-run.json"))
    return steps


def broken_names(kernel: str) -> list[str]:
    import importlib

    return sorted(importlib.import_module(KERNELS[kernel]).BROKEN)


def command_of(step: Step, work: Path) -> list[str]:
    """The step's command with its results file in ``work`` (pytest steps get --spec-results)."""
    if step.kind in ("suite", "engine", "broken", "timed"):
        return [*step.command, "--spec-results", str(work / step.results)]
    return step.command


def log_path(work: Path, step: Step) -> Path:
    return work / "logs" / (step.name.replace(" ", "_").replace("/", "_").replace(":", "_") + ".log")


def run_steps(steps: list[Step], work: Path) -> dict[str, dict]:
    """Phase 1 side by side, then phase 2 one by one; each step's output in work/logs/, its exit and time."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "suite").mkdir(exist_ok=True)
    outcomes: dict[str, dict] = {}
    for phase in (1, 2):
        running = []
        for step in (s for s in steps if s.phase == phase and s.skipped is None):
            entry = start(step, work)
            if phase == 2:
                finish(entry, outcomes)  # alone on the device
            else:
                running.append(entry)
        for entry in running:
            finish(entry, outcomes)
    return outcomes


def start(step: Step, work: Path) -> tuple:
    log = open(log_path(work, step), "w")
    command = ["timeout", "--kill-after=10", str(step.timeout), *command_of(step, work)]
    if step.kind in ("engine", "gate"):  # CPU-only steps yield to the ones that feed the GPU
        command = ["nice", "-n", "10", *command]
    cwd = work if step.kind in ("gate", "bench") else REPO
    child = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **step.env})
    return step, child, log, time.monotonic()


def finish(entry: tuple, outcomes: dict[str, dict]) -> None:
    step, child, log, started = entry
    code = child.wait()
    log.close()
    outcomes[step.name] = {
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "timed_out": code in (124, 137),
    }


def suite_counts(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    counts: dict[str, int] = {}
    for test in json.loads(path.read_text())["tests"]:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    return counts


def broken_verdicts(path: Path, specs: list[str]) -> dict[str, str]:
    """Each broken kernel: caught (failed by a rule or a statistical check) or what happened instead."""
    from spectest.resolve import display_name

    tests = json.loads(path.read_text())["tests"] if path.exists() else []
    verdicts = {}
    for spec in specs:
        mine = [t for t in tests if t["model"] == display_name(spec) and t["property"] == CATCHING_PROPERTY]
        caught = [t for t in mine if t["outcome"] == "failed" and (t.get("failure") or {}).get("kind") != "harness"]
        if caught:
            failure = caught[0].get("failure") or {}
            verdicts[spec] = f"caught ({failure.get('kind')}: {failure.get('rule')})"
        else:
            verdicts[spec] = "NOT CAUGHT: " + (", ".join(t["outcome"] for t in mine) or "no verdict recorded")
    return verdicts


def sanitizer_line(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line.strip() for line in text.splitlines() if "SUMMARY" in line]
    return lines[-1].removeprefix("========= ") if lines else "no sanitizer summary"


def bandwidth_line(bench: list[dict], kernel: str) -> str:
    """A kernel's benchmark rows in a line: its median multiple of the floor (and of the floor at the run's best copy
    bandwidth), and against FlashInfer where it ran as the peer: the median ratio and at how many shapes it is faster."""
    ratios = [row[f"{kernel}_x_floor"] for row in bench if f"{kernel}_x_floor" in row]
    if not ratios:
        return "not measured"
    line = f"median {statistics.median(ratios):.1f}x the floor over {len(ratios)} shapes"
    best = [row[f"{kernel}_x_best_floor"] for row in bench if f"{kernel}_x_best_floor" in row]
    if best:
        line += f" ({statistics.median(best):.1f}x at the run's best copy)"
    peer = [row[f"{kernel}_x_flashinfer"] for row in bench if f"{kernel}_x_flashinfer" in row]
    if peer:
        faster = sum(ratio < 1 for ratio in peer)
        line += f"; {statistics.median(peer):.2f}x FlashInfer's time (median), faster at {faster} of {len(peer)} shapes"
    return line


def default_run_line(path: Path, outcome: dict) -> str:
    """The timed default run in a line: its wall time against the 15 s target, its outcomes, and its CPU in the
    properties (the kernel's calls, generating inputs, statistics), as the run's own summary splits it."""
    if not outcome:
        return "not run"
    line = f"{outcome['seconds']:.1f} s wall (target 15 s), exit {outcome['exit']}"
    if outcome.get("timed_out"):
        return line + " (timed out)"
    if not path.exists():
        return line + ", no results"
    document = json.loads(path.read_text())
    counts: dict[str, int] = {}
    for test in document["tests"]:
        counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
    line += ", " + " ".join(f"{key} {value}" for key, value in sorted(counts.items()))
    timings = [figure["timing"] for figure in document.get("figures", []) if "timing" in figure]
    if timings:
        total = {
            key: sum(t.get(key, 0.0) for t in timings) for key in ("total_s", "calls_s", "inputs_s", "statistics_s")
        }
        line += (
            f"; CPU in the properties {total['total_s']:.1f} s: the kernel's calls {total['calls_s']:.1f} s, "
            f"generating inputs {total['inputs_s']:.1f} s, statistics {total['statistics_s']:.1f} s"
        )
    return line


@dataclass
class Verdict:
    """What the summary found: what broke, and what did not finish (a timeout is no pass, and no failure)."""

    failed: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)

    def judge(self, name: str, outcome: dict, broke: bool) -> None:
        if outcome.get("timed_out"):
            self.incomplete.append(name)
        elif broke:
            self.failed.append(name)

    @property
    def headline(self) -> str:
        if self.failed:
            return "FAILED: " + ", ".join(self.failed)
        return "incomplete (timed out): " + ", ".join(self.incomplete) if self.incomplete else "all held"


def summarise(
    everything: list[Subject], steps: list[Step], outcomes: dict[str, dict], work: Path
) -> tuple[str, Verdict]:
    """The stdout summary, and the verdict: every subject without failures, every broken kernel caught, every
    kernel compiled and sanitizer-clean, the kernels' tests passing (the benchmark's failure is tolerated)."""
    verdict = Verdict()
    lines = ["subjects:"]
    by_subject = {s.subject: s for s in steps if s.kind in ("suite", "engine")}
    for subject in everything:
        if subject.unavailable is not None:
            lines.append(f"  {subject.name:34} {subject.group:6}  skipped: {subject.unavailable}")
            continue
        step = by_subject[subject.name]
        counts = suite_counts(work / step.results)
        outcome = outcomes.get(step.name, {})
        status = " ".join(f"{key} {value}" for key, value in sorted(counts.items())) or "no results"
        if outcome.get("timed_out"):
            status += f" (timed out after {step.timeout} s)"
        verdict.judge(subject.name, outcome, bool(counts.get("failed") or counts.get("error") or not counts))
        lines.append(f"  {subject.name:34} {subject.group:6}  {status}  ({outcome.get('seconds', '?')} s)")
    broken = next((s for s in steps if s.kind == "broken"), None)
    if broken is not None:
        specs = [broken.command[i + 1] for i, a in enumerate(broken.command) if a == "--spec-model"]
        lines.append("broken kernels (each must fail the per-position property):")
        for spec, caught in broken_verdicts(work / broken.results, specs).items():
            verdict.judge(spec, outcomes.get(broken.name, {}), not caught.startswith("caught"))
            lines.append(f"  {spec:52} {caught}")
    lines.append("kernels:")
    gate_file, bench_file = work / "compile-gate.json", work / "bench.json"
    gate = json.loads(gate_file.read_text())["results"] if gate_file.exists() else []
    bench = json.loads(bench_file.read_text())["rows"] if bench_file.exists() else []
    gate_step = next((s for s in steps if s.kind == "gate"), None)
    if gate_step is not None and outcomes.get(gate_step.name, {}).get("timed_out"):
        verdict.incomplete.append("compile gate")
    for kernel, compiler in (("reference-triton", "triton"), ("reference-cupy", "nvrtc")):
        mine = [r for r in gate if r["label"].startswith(compiler)]
        skipped = [r for r in mine if r["status"] == "skipped"]
        compiled = f"compile {sum(r['status'] == 'ok' for r in mine)}/{len(mine)} ok"
        compiled += f" ({len(skipped)} skipped: {skipped[0]['message'][:80]})" if skipped else ""
        failed = [r for r in mine if r["status"] == "failed"]
        if failed:
            verdict.failed.append(f"{kernel} compile")
        checks = [s for s in steps if s.kind == "sanitizer" and s.subject == kernel and s.skipped is None]
        for step in checks:
            verdict.judge(step.name, outcomes.get(step.name, {}), outcomes.get(step.name, {}).get("exit") != 0)
        clean = [s for s in checks if outcomes.get(s.name, {}).get("exit") == 0]
        speed = bandwidth_line(bench, kernel)
        lines.append(f"  {kernel}: {compiled}; sanitizers {len(clean)}/{len(checks)} clean; bandwidth {speed}")
        lines += [f"    failed to compile: {r['label']}" for r in failed[:5]]
        lines += [f"    {step.name}: {sanitizer_line(log_path(work, step))}" for step in checks]
    timed = next((s for s in steps if s.kind == "timed"), None)
    if timed is not None:
        lines.append(f"{timed.name}: {default_run_line(work / timed.results, outcomes.get(timed.name, {}))}")
    tests = next((s for s in steps if s.kind == "tests"), None)
    if tests is not None:
        verdict.judge("kernel tests", outcomes.get(tests.name, {}), outcomes.get(tests.name, {}).get("exit") != 0)
    lines.append("steps:")
    for step in steps:
        outcome = outcomes.get(step.name, {})
        flag = " TIMED OUT" if outcome.get("timed_out") else ""
        done = f"exit {outcome.get('exit')} in {outcome.get('seconds')} s{flag}"
        lines.append(f"  {step.name:60} {'skipped: ' + step.skipped if step.skipped else done}")
    return "\n".join(lines), verdict


def print_plan(everything: list[Subject], steps: list[Step], gpu: bool) -> None:
    if not gpu:
        print("gpu-check --plan: no CUDA GPU here, so this is the plan only (on a GPU machine: bash .ci/gpu-check)")
    print("subjects (entry points spectest.models and spectest.engines):")
    for subject in everything:
        print(
            f"  {subject.name:34} {subject.group:6}  {'run' if subject.unavailable is None else 'skip: ' + subject.unavailable}"
        )
    print("steps (phase 1 side by side, phase 2 alone; each under its timeout):")
    for step in steps:
        skipped = f" SKIPPED: {step.skipped}" if step.skipped else ""
        print(f"  [{step.phase}] {step.name} ({step.timeout} s){skipped}: {shlex.join(step.command)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", action="store_true", help="print the subjects and steps, run nothing")
    args = parser.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    everything = subjects()
    steps = plan(sys.executable, everything)
    if args.plan:
        print_plan(everything, steps, gpu)
        return 0
    if not gpu:
        print("gpu-check: no CUDA GPU visible to this Python")
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder) / "gpu-check"
        work.mkdir()
        device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
        (work / "plan.txt").write_text("\n".join(f"{s.name}: {shlex.join(s.command)}" for s in steps))
        outcomes = run_steps(steps, work)
        text, verdict = summarise(everything, steps, outcomes, work)
        header = f"gpu-check on {device}: {time.monotonic() - started:.0f} s, {verdict.headline}"
        (work / "summary.txt").write_text(header + "\n" + text + "\n")
        (work / "outcomes.json").write_text(json.dumps(outcomes, indent=1))
        with tarfile.open(out / "gpu-check.tgz", "w:gz") as archive:
            archive.add(work, arcname="gpu-check")
    print(header)
    print(text)
    print(f"archive: {out / 'gpu-check.tgz'}")
    return 1 if verdict.failed else 4 if verdict.incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
