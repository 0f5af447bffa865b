"""Benchmark of the statistics (not a timed test): run it, read the ratios.

1. Throughput: emitted tokens per second through the whole check pipeline on the reference
   sampler (draw drafts, verify, count, e-process, final test), and the share of the time spent
   counting and testing rather than generating. Both are measured in the same run.
2. Detection: for every known-buggy verifier, the property that caught it and the emitted
   tokens it took (median over seeds), from real pytest runs of the suite.

    python benchmarks/bench_statistics.py [--tokens 10000000] [--seeds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from spectest import strategies as sst
from spectest.cases.tensors import RepeatedBatch, to_tensor
from spectest.implementations.reference import verify
from spectest.sampling import make_generator
from spectest.statistics.checks import DistributionCheck, token_id_orders

REPO = Path(__file__).resolve().parent.parent
BUGGY = REPO / "tests" / "verifiers" / "buggy.py"


def throughput(tokens: int) -> dict[str, float]:
    case = sst.ChainCase(batch=64, k=4, vocab=1000, kinds=(("dirichlet", "close"), ("peaky", "far")), seed=1)
    target_np, draft_np = sst.build_chain(case)
    b, k, v = case.batch, case.k, case.vocab
    groups = b * (k + 1)
    check = DistributionCheck(
        "throughput",
        target_np.reshape(groups, v),
        alpha=4e-6,
        tolerance=1e-4,
        min_draws=10,
        max_draws=10**9,
        views={"by probability": [None] * groups, "by token id": token_id_orders(groups, v)},
    )
    batch = RepeatedBatch(
        to_tensor(target_np, device="cpu", dtype="float32"), to_tensor(draft_np, device="cpu", dtype="float32")
    )
    draft_gen, verify_gen = make_generator(1), make_generator(2)
    slots = torch.arange(k + 1)
    generating = testing = 0.0
    emitted_total = 0
    while emitted_total < tokens:
        start = time.perf_counter()
        emitted = verify(*batch.draw(100, draft_gen), generator=verify_gen)
        middle = time.perf_counter()
        present = emitted != -1
        rows = torch.arange(b).repeat(100).unsqueeze(1)
        cell = (rows * (k + 1) + slots) * v + emitted.clamp_min(0)
        check.add(torch.bincount(cell[present], minlength=groups * v).view(groups, v).numpy(), 100)
        emitted_total += int(present.sum())
        generating += middle - start
        testing += time.perf_counter() - middle
    start = time.perf_counter()
    result = check.result()
    testing += time.perf_counter() - start
    return {
        "emitted_tokens": emitted_total,
        "generate_s": generating,
        "count_and_test_s": testing,
        "tokens_per_s_pipeline": emitted_total / (generating + testing),
        "testing_share": testing / (generating + testing),
        "final_p_value": result.p_value,
    }


def detections(seeds: int) -> dict[str, dict[str, object]]:
    sys.path.insert(0, str(BUGGY.parent))
    from buggy import BUGS

    found: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for seed in range(1, seeds + 1):
        with tempfile.TemporaryDirectory() as tmp:
            xml = Path(tmp) / "r.xml"
            args = [a for name in BUGS for a in ("--spec-model", f"{BUGGY}:{name}")]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    *args,
                    "--spec-no-shrink",
                    "--spec-seed",
                    str(seed),
                    "-q",
                    f"--junitxml={xml}",
                    "-p",
                    "no:cacheprovider",
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            for case in ET.parse(xml).getroot().iter("testcase"):
                name, _, model = case.get("name", "").partition("[")
                bug = model.rstrip("]").split(":")[-1]
                if case.find("failure") is None:
                    continue
                records = [
                    ast.literal_eval(p.get("value")) for p in case.iter("property") if p.get("name") == "spectest"
                ]
                failed = [r for r in records if r.get("passed") is False]
                tokens = int(failed[-1]["n"]) if failed else 0  # 0: caught by an exact rule, no sampling needed
                found[bug].append((seed, name, tokens))
    summary = {}
    for bug in BUGS:
        caught = found.get(bug, [])
        statistical = [t for _, _, t in caught if t > 0]
        summary[bug] = {
            "caught_in_runs": len({seed for seed, _, _ in caught}),
            "properties": sorted({n for _, n, _ in caught}),
            "median_tokens_to_detect": statistics.median(statistical) if statistical else 0,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    np.random.seed(0)
    rate = throughput(args.tokens)
    print(
        f"pipeline: {rate['emitted_tokens']:,} emitted tokens, {rate['tokens_per_s_pipeline']:,.0f} tokens/s end to end; "
        f"generating {rate['generate_s']:.1f} s, counting + testing {rate['count_and_test_s']:.1f} s "
        f"({rate['testing_share']:.0%} of the pipeline)"
    )
    found = detections(args.seeds)
    print(f"\n{'buggy verifier':42} {'caught':>7} {'median tokens to detect':>24}  failing properties")
    for bug, row in found.items():
        tokens = row["median_tokens_to_detect"] or "exact rule"
        caught = f"{row['caught_in_runs']}/{args.seeds}"
        print(f"{bug:42} {caught:>7} {tokens!s:>24}  {', '.join(row['properties']) or 'NOT CAUGHT'}")
    if args.json:
        args.json.write_text(json.dumps({"throughput": rate, "detections": found}, indent=2))


if __name__ == "__main__":
    main()
