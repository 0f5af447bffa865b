"""``spectest bench``: measured wall-clock speedups against the tokens-per-pass model.

JSON output (``--json``, schema ``spectest.bench/1``): ``config`` (the BenchConfig fields),
``verifier``, ``points`` [{mix, acceptance_exact, acceptance_measured, tokens_per_pass,
tokens_per_pass_model, speedup_measured, speedup_predicted, ratio, costs {target_forward, draft_forward,
verify_forward, plain_overhead, pass_overhead (seconds, raw), then in target-forward units cost_ratio c,
verify_growth d, overhead o, plain_overhead o_plain, pass_cost}, tokens_per_pass_counts}],
``break_even`` {predicted, measured, bracket} (null where there is none).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from spectest.options import argument, positive_int

BENCH_SCHEMA = "spectest.bench/1"
SWEEP_MIXES = (0.0, 0.2, 0.4, 0.55, 0.7, 0.85, 1.0)


def _mixes(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"need comma-separated values in [0, 1], got {text!r}")
    return values


def add_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "bench",
        help="measure plain vs speculative decoding against the model's predicted speedup and break-even",
        description="Decode with costed Markov models (exact outputs, real tensor work) and compare the measured "
        "speedup with E[L] / (K c + 1 + d K + o), every cost measured in the same run.",
    )
    bench.add_argument("--model", default="reference", help="verifier: a --spec-model value (default reference)")
    bench.add_argument("--gamma", type=argument(positive_int), default=4, help="draft tokens per pass K")
    bench.add_argument("--vocab", type=argument(positive_int), default=64)
    bench.add_argument("--target-hidden", type=argument(positive_int), default=1024)
    bench.add_argument("--draft-hidden", type=argument(positive_int), default=64)
    bench.add_argument("--layers", type=argument(positive_int), default=6)
    bench.add_argument("--tokens", type=argument(positive_int), default=300, help="tokens to generate per row and run")
    bench.add_argument("--batch", type=argument(positive_int), default=1)
    bench.add_argument("--device", default="cpu", help="cpu or cuda[:N] (times with synchronisation)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument(
        "--mixes",
        type=_mixes,
        help="draft mixed toward uniform by these amounts (default: a predictable pair and a random draft)",
    )
    bench.add_argument(
        "--sweep", action="store_true", help=f"sweep the mix over {SWEEP_MIXES} and locate the break-even"
    )
    bench.add_argument("--json", action="store_true", help="machine-readable output (schema in the module docstring)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import torch

    from spectest.bench import BenchConfig, break_even, sweep
    from spectest.resolve import ModelSpecError, resolve_model

    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    try:
        verifier = resolve_model(args.model)
    except ModelSpecError as exc:
        parser.error(str(exc))
    config = BenchConfig(
        vocab=args.vocab, target_hidden=args.target_hidden, draft_hidden=args.draft_hidden, layers=args.layers,
        k=args.gamma, batch=args.batch, tokens=args.tokens, seed=args.seed, device=args.device,
    )  # fmt: skip
    mixes = SWEEP_MIXES if args.sweep else (args.mixes or [0.05, 1.0])
    points = sweep(verifier, config, mixes, progress=lambda line: print(line, file=sys.stderr, flush=True))
    even = break_even(points, config.k)
    if args.json:
        document = {
            "schema": BENCH_SCHEMA,
            "config": asdict(config),
            "verifier": verifier.name,
            "points": [asdict(p) | {"ratio": p.ratio} for p in points],
            "break_even": asdict(even),
        }
        print(json.dumps(document, indent=2))
        return 0
    print(
        f"verifier {verifier.name}, K={config.k}, V={config.vocab}, target H={config.target_hidden} x{config.layers} layers, "
        f"draft H={config.draft_hidden}, {config.tokens} tokens x batch {config.batch}, {config.device}"
    )
    print(
        f"{'mix':>5} {'a exact':>8} {'a meas':>7} {'L/pass':>7} {'E[L]':>6} {'c':>6} {'d':>7} {'o':>6} {'o_plain':>7} "
        f"{'speedup':>8} {'model':>7} {'ratio':>6}"
    )
    for p in points:
        c = p.costs
        print(
            f"{p.mix:5.2f} {p.acceptance_exact:8.3f} {p.acceptance_measured:7.3f} {p.tokens_per_pass:7.3f} "
            f"{p.tokens_per_pass_model:6.3f} {c['cost_ratio']:6.3f} {c['verify_growth']:7.4f} {c['overhead']:6.3f} "
            f"{c['plain_overhead']:7.3f} "
            f"{p.speedup_measured:7.3f}x {p.speedup_predicted:6.3f}x {p.ratio:6.3f}"
        )
    if even.predicted is None:
        print("break-even: the model says speculation never pays with these costs")
    else:
        measured = f"{even.measured:.3f}" if even.measured is not None else "not crossed in this sweep"
        print(f"break-even acceptance: predicted a* = {even.predicted:.3f}, measured crossing {measured}")
    return 0
