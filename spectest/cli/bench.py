"""``spectest bench``: measured speedups against the tokens-per-pass model.

Rounds of plain, reference and ``--model`` decoding at each point (see :mod:`spectest.speed.bench`),
timed on the own-time clock. JSON output (``--json``, schema ``spectest.bench/2``): ``config``
(the BenchConfig fields), ``verifier``, ``clock``, ``rounds``, ``costs`` (the pooled model:
cost_ratio c, verify_growth d, overhead o, rejection_overhead, plain_overhead, in target steps),
``points`` [{mix, acceptance, acceptance_measured, measured, predicted, ratio, pass_cost_ratio,
pass_cost, rounds, counts, model_probs, tokens_per_pass, tokens_per_pass_model}],
``break_even`` {predicted, measured, bracket} (null where there is none).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from spectest import options
from spectest.options import argument, positive_int

BENCH_SCHEMA = "spectest.bench/2"
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
        "speedup with E[L] (1 + o_plain) / (K c + 1 + d K + o(a)), every cost measured in the same rounds.",
    )
    bench.add_argument(
        "--spec-model",
        "--model",
        dest="model",
        default="reference",
        help="the implementation (a --spec-model value; default reference; --model is the old spelling)",
    )
    bench.add_argument(
        "--k",
        "--gamma",
        dest="k",
        type=argument(positive_int),
        default=4,
        help="draft tokens per pass K (--gamma is the old spelling)",
    )
    bench.add_argument("--vocab", type=argument(positive_int), default=32000)
    bench.add_argument("--target-mb", type=float, default=24.0, help="weights a target step reads (MB)")
    bench.add_argument("--draft-mb", type=float, default=0.25, help="weights a draft step reads (MB)")
    bench.add_argument("--target-hidden", type=argument(positive_int), default=128, help="per-position width")
    bench.add_argument("--draft-hidden", type=argument(positive_int), default=16)
    bench.add_argument("--layers", type=argument(positive_int), default=2)
    bench.add_argument("--tokens", type=argument(positive_int), default=16, help="plain steps per chunk")
    bench.add_argument("--passes", type=argument(positive_int), default=6, help="speculative passes per chunk")
    bench.add_argument("--rounds", type=argument(positive_int), default=10, help="interleaved rounds per point")
    bench.add_argument("--batch", type=argument(positive_int), default=1)
    bench.add_argument(
        "--spec-device",
        "--device",
        dest="device",
        default="cpu",
        help="cpu or cuda[:N] (timed with synchronisation; --device is the old spelling)",
    )
    bench.add_argument("--spec-seed", "--seed", dest="seed", type=argument(options.seed), default=0)
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

    from spectest.resolve import ModelSpecError, resolve_model
    from spectest.speed.bench import BenchConfig, break_even, point_record, sweep

    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--spec-device {args.device}: CUDA is not available on this machine")
    try:
        verifier = resolve_model(args.model)
    except ModelSpecError as exc:
        parser.error(str(exc))
    config = BenchConfig(
        vocab=args.vocab,
        k=args.k,
        target_mb=args.target_mb,
        draft_mb=args.draft_mb,
        target_hidden=args.target_hidden,
        draft_hidden=args.draft_hidden,
        layers=args.layers,
        batch=args.batch,
        tokens=args.tokens,
        passes=args.passes,
        seed=args.seed,
        device=args.device,
    )
    mixes = SWEEP_MIXES if args.sweep else (args.mixes or [0.05, 1.0])
    bench = sweep(
        verifier, config, mixes, rounds=args.rounds, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    costs = bench.pooled_costs()
    even = break_even(bench.points, config.k, costs)
    records = [point_record(p, config.k, costs) for p in bench.points]
    if args.json:
        document = {
            "schema": BENCH_SCHEMA,
            "config": asdict(config),
            "verifier": verifier.name,
            "clock": bench.clock.name,
            "rounds": args.rounds,
            "costs": asdict(costs),
            "points": records,
            "break_even": asdict(even),
        }
        print(json.dumps(document, indent=2))
        return 0
    print(
        f"verifier {verifier.name}, K={config.k}, V={config.vocab}, target {config.target_mb:g} MB, draft "
        f"{config.draft_mb:g} MB, batch {config.batch}, {args.rounds} rounds, {config.device}, timed on {bench.clock.name}"
    )
    print(
        f"costs (target steps): c={costs.cost_ratio:.3f} d={costs.verify_growth:.3f} o={costs.overhead:.3f} "
        f"o_reject={costs.rejection_overhead:+.3f} o_plain={costs.plain_overhead:.3f}"
    )
    print(
        f"{'mix':>5} {'a exact':>8} {'a meas':>7} {'L/pass':>7} {'E[L]':>6} {'speedup':>8} {'model':>7} {'ratio':>6} "
        f"{'pass model/meas':>15}"
    )
    for r in records:
        print(
            f"{r['mix']:5.2f} {r['acceptance']:8.3f} {r['acceptance_measured']:7.3f} {r['tokens_per_pass']:7.3f} "
            f"{r['tokens_per_pass_model']:6.3f} {r['measured']:7.3f}x {r['predicted']:6.3f}x {r['ratio']:6.3f} "
            f"{r['pass_cost_ratio']:15.3f}"
        )
    if even.predicted is None:
        print("break-even: the model says speculation never pays with these costs")
    else:
        measured = f"{even.measured:.3f}" if even.measured is not None else "not crossed in this sweep"
        print(f"break-even acceptance: predicted a* = {even.predicted:.3f}, measured crossing {measured}")
    return 0
