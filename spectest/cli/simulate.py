"""``spectest simulate``: the analytic model of the acceptance chain from the command line.

Names: the acceptance rate is ``--acceptance`` (``--alpha`` still works: elsewhere alpha is the
significance level), the draft length is ``--k`` (``--gamma`` still works). JSON output
(``--json``) is stable; its schemas:

* ``spectest.simulate/2``: ``inputs`` {acceptance, k, cost_ratio, verify_overhead, pass_overhead,
  ops_ratio}, ``tokens_per_pass`` {mean, variance, distribution: {"1": P(L=1), ...}}, ``speedup``,
  ``operations_factor``, ``break_even_acceptance`` (null: never breaks even), ``optimal_k``
  {k, speedup} (k 0: no K beats plain decoding).
* ``spectest.breakeven/2``: ``verify_overhead``, ``pass_overhead``, ``cost_ratios`` [c...],
  ``rows`` [{k, break_even: [a* or null per cost ratio]}].
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from spectest.options import argument, non_negative, positive_int, unit_interval

SIMULATE_SCHEMA = "spectest.simulate/2"
BREAKEVEN_SCHEMA = "spectest.breakeven/2"
DEFAULT_COST_RATIOS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)


def add_parser(commands: Any) -> None:
    sim = commands.add_parser(
        "simulate",
        help="tokens per pass, speedup, break-even and optimal K from the analytic model",
        description="Analytic model of speculative decoding (Leviathan et al. 2023, extended with a verification "
        "cost that grows with K and a fixed overhead per pass).",
    )
    sim.add_argument(
        "--acceptance",
        "--alpha",
        dest="acceptance",
        type=argument(unit_interval),
        help="per-token acceptance rate a in [0, 1] (--alpha is the old spelling)",
    )
    sim.add_argument(
        "--k",
        "--gamma",
        dest="k",
        type=argument(positive_int),
        default=4,
        help="draft tokens per pass K (default 4; --gamma is the old spelling)",
    )
    sim.add_argument(
        "--cost-ratio", type=argument(non_negative), default=0.0, help="draft step cost / target step cost c"
    )
    sim.add_argument(
        "--verify-overhead",
        type=argument(non_negative),
        default=0.0,
        help="d: verifying K+1 tokens costs 1 + d*K target steps (default 0)",
    )
    sim.add_argument(
        "--pass-overhead", type=argument(non_negative), default=0.0, help="fixed cost per pass, in target steps"
    )
    sim.add_argument(
        "--ops-ratio", type=argument(non_negative), help="draft/target arithmetic per token (default: cost ratio)"
    )
    sim.add_argument("--breakeven-table", action="store_true", help="print a* for K 1..8 and a grid of cost ratios")
    sim.add_argument("--json", action="store_true", help="machine-readable output (schemas in the module docstring)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.simulators import (
        CostModel,
        break_even_acceptance,
        operations_factor,
        optimal_k,
        speedup,
        tokens_per_pass_iid,
    )

    if args.breakeven_table:
        rows = []
        for k in range(1, 9):
            cells = [
                break_even_acceptance(k, CostModel(c, args.verify_overhead, args.pass_overhead))
                for c in DEFAULT_COST_RATIOS
            ]
            rows.append({"k": k, "break_even": cells})
        table = {
            "schema": BREAKEVEN_SCHEMA,
            "verify_overhead": args.verify_overhead,
            "pass_overhead": args.pass_overhead,
            "cost_ratios": list(DEFAULT_COST_RATIOS),
            "rows": rows,
        }
        if args.json:
            print(json.dumps(table, indent=2))
        else:
            print("break-even acceptance a* (below it speculative decoding is slower than plain decoding)")
            print("    K | " + " ".join(f"c={c:<5g}" for c in DEFAULT_COST_RATIOS))
            for row in rows:
                print(
                    f"{row['k']:>5} | "
                    + " ".join(f"{a:<7.4f}" if a is not None else "never  " for a in row["break_even"])
                )
        return 0
    if args.acceptance is None:
        parser.error("simulate needs --acceptance (or --breakeven-table)")
    a, k = args.acceptance, args.k
    cost = CostModel(args.cost_ratio, args.verify_overhead, args.pass_overhead)
    dist = tokens_per_pass_iid(a, k)
    best_k, best_speedup = optimal_k(a, cost)
    result = {
        "schema": SIMULATE_SCHEMA,
        "inputs": {
            "acceptance": a,
            "k": k,
            "cost_ratio": args.cost_ratio,
            "verify_overhead": args.verify_overhead,
            "pass_overhead": args.pass_overhead,
            "ops_ratio": args.ops_ratio if args.ops_ratio is not None else args.cost_ratio,
        },
        "tokens_per_pass": {
            "mean": float(dist.mean),
            "variance": float(dist.variance),
            "distribution": {str(v): float(p) for v, p in zip(dist.values, dist.probs, strict=True)},
        },
        "speedup": speedup(a, k, cost),
        "operations_factor": operations_factor(a, k, args.ops_ratio if args.ops_ratio is not None else args.cost_ratio),
        "break_even_acceptance": break_even_acceptance(k, cost),
        "optimal_k": {"k": best_k, "speedup": best_speedup},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    inputs = result["inputs"]
    print(
        f"a={inputs['acceptance']:g} K={inputs['k']} cost ratio c={inputs['cost_ratio']:g} "
        f"verify overhead d={inputs['verify_overhead']:g} pass overhead={inputs['pass_overhead']:g}"
    )
    print(f"tokens per pass: E[L] = {dist.mean:.5f}, Var[L] = {dist.variance:.5f}")
    for value, prob in zip(dist.values, dist.probs, strict=True):
        print(f"  P(L = {value}) = {prob:.5f}")
    even = result["break_even_acceptance"]
    print(f"speedup: {result['speedup']:.4f}x   arithmetic operations: {result['operations_factor']:.4f}x")
    print(
        f"break-even acceptance a*: {even:.6f}"
        if even is not None
        else "break-even acceptance: never (drafting costs too much)"
    )
    print(f"optimal K: {best_k} ({best_speedup:.4f}x)" if best_k else "optimal K: 0 (no K beats plain decoding)")
    return 0
