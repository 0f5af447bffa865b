"""``spectest simulate``: the analytic model of the acceptance chain from the command line.

Names: the acceptance rate is ``--acceptance`` (``--alpha`` still works: elsewhere alpha is the
significance level), the draft length is ``--k`` (``--gamma`` still works). JSON output
(``--json``) is stable; its schemas:

* ``spectest.simulate/2``: ``inputs`` {acceptance, k, cost_ratio, verify_overhead, pass_overhead,
  ops_ratio}, ``tokens_per_pass`` {mean, variance, distribution: {"1": P(L=1), ...}}, ``speedup``,
  ``operations_factor``, ``break_even_acceptance`` (null: never breaks even), ``optimal_k``
  {k, speedup} (k 0: no K beats plain decoding).
* ``spectest.simulate-tree/1`` (``--tree``): ``inputs`` {rank_acceptance, budget, max_depth,
  cost_ratio, verify_overhead, pass_overhead}, ``tree`` {parents, nodes, depth, tokens_per_pass,
  speedup} (the fastest tree within the budget), ``chain`` {k, tokens_per_pass, speedup} (the
  fastest chain within it), ``tree_over_chain``, ``optimal_for_budget`` {parents, tokens_per_pass}
  (the most tokens per pass with the whole budget), ``shape`` (only with ``--shape``) {parents,
  tokens_per_pass, distribution, speedup}.
* ``spectest.simulate-block/1`` (``--block``): ``inputs`` {k, vocab, target_kind, draft_kind,
  seed}, ``token_wise`` and ``block`` {mean, variance, distribution} for the same random (p, q)
  pair per position, ``gain`` (block mean / token-wise mean).
* ``spectest.breakeven/2``: ``verify_overhead``, ``pass_overhead``, ``cost_ratios`` [c...],
  ``rows`` [{k, break_even: [a* or null per cost ratio]}].
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from spectest.options import argument, non_negative, positive_int, unit_interval

SIMULATE_SCHEMA = "spectest.simulate/2"
TREE_SCHEMA = "spectest.simulate-tree/1"
BLOCK_SCHEMA = "spectest.simulate-block/1"
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
    tree = sim.add_argument_group("draft trees (--tree), under positional acceptance (Sequoia)")
    tree.add_argument("--tree", action="store_true", help="the optimal draft tree for a node budget, against the chain")
    tree.add_argument(
        "--rank-acceptance",
        type=argument(rank_acceptance),
        help="a_1,a_2,...: P(the child of sibling rank r is the accepted one); sums to at most 1 "
        "(default: --acceptance for a width-one tree)",
    )
    tree.add_argument(
        "--budget", type=argument(positive_int), default=16, help="drafted nodes per pass, at most (default 16)"
    )
    tree.add_argument("--max-depth", type=argument(positive_int), help="levels of the tree, at most (default: budget)")
    tree.add_argument(
        "--shape",
        type=argument(tree_shape),
        help="also evaluate this tree: the parent of each drafted node 1, 2, ... (the root is 0), e.g. 0,0,1",
    )
    block = sim.add_argument_group("block verification (--block): against token-wise, on the same random pair")
    block.add_argument("--block", action="store_true", help="tokens per pass of block vs token-wise verification")
    block.add_argument("--vocab", type=argument(positive_int), default=8, help="vocabulary size V (default 8)")
    block.add_argument(
        "--pair", default="dirichlet,far", help="target kind,draft kind of the toy pair (default dirichlet,far)"
    )
    block.add_argument("--seed", type=int, default=0, help="seed of the toy pair (default 0)")
    sim.add_argument("--breakeven-table", action="store_true", help="print a* for K 1..8 and a grid of cost ratios")
    sim.add_argument("--json", action="store_true", help="machine-readable output (schemas in the module docstring)")


def rank_acceptance(text: str) -> list[float]:
    values = [unit_interval(part) for part in text.split(",")]
    if sum(values) > 1 + 1e-12:
        raise ValueError(f"rank acceptances are disjoint events: they must sum to at most 1, got {text}")
    return values


def tree_shape(text: str) -> list[int]:
    from spectest.simulators.tree import tree_depths

    parents = [-1] + [int(part) for part in text.split(",")]
    tree_depths(parents)  # raises ValueError naming the bad node
    return parents


def run_tree(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.simulators import CostModel
    from spectest.simulators.tree import optimal_tree, plan_tree, positional_tree_pass, tree_depths, tree_speedup

    if args.rank_acceptance is None and args.acceptance is None:
        parser.error("simulate --tree needs --rank-acceptance (or --acceptance for a width-one tree)")
    rates = args.rank_acceptance if args.rank_acceptance is not None else [args.acceptance]
    cost = CostModel(args.cost_ratio, args.verify_overhead, args.pass_overhead)
    plan = plan_tree(args.budget, rates, cost, max_depth=args.max_depth)
    whole = optimal_tree(args.budget, rates, max_depth=args.max_depth)
    result: dict[str, Any] = {
        "schema": TREE_SCHEMA,
        "inputs": {
            "rank_acceptance": rates,
            "budget": args.budget,
            "max_depth": args.max_depth,
            "cost_ratio": args.cost_ratio,
            "verify_overhead": args.verify_overhead,
            "pass_overhead": args.pass_overhead,
        },
        **plan.as_dict(),
        "optimal_for_budget": {"parents": whole.parents.tolist(), "tokens_per_pass": whole.tokens_per_pass},
    }
    if args.shape is not None:
        depth = int(tree_depths(args.shape).max())
        if any(args.shape.count(node) > len(rates) for node in set(args.shape) - {-1}):
            parser.error(f"--shape has a node with more children than --rank-acceptance has ranks ({len(rates)})")
        dist = positional_tree_pass(args.shape, rates)
        result["shape"] = {
            "parents": args.shape,
            "tokens_per_pass": float(dist.mean),
            "distribution": {str(v): float(p) for v, p in zip(dist.values, dist.probs, strict=True)},
            "speedup": tree_speedup(float(dist.mean), sum(p >= 0 for p in args.shape[1:]), depth, cost),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"rank acceptance {rates}, budget {args.budget} nodes, max depth {args.max_depth or args.budget}; "
        f"c={args.cost_ratio:g} d={args.verify_overhead:g} pass overhead={args.pass_overhead:g}"
    )
    tree, chain = result["tree"], result["chain"]
    print(
        f"fastest tree: {tree['nodes']} nodes, depth {tree['depth']}: {tree['tokens_per_pass']:.4f} tokens per pass, "
        f"{tree['speedup']:.4f}x\n  parents {tree['parents']}"
    )
    print(f"fastest chain: K={chain['k']}: {chain['tokens_per_pass']:.4f} tokens per pass, {chain['speedup']:.4f}x")
    print(f"tree over chain: {result['tree_over_chain']:.4f}x")
    print(
        f"most tokens per pass with all {args.budget} nodes: {whole.tokens_per_pass:.4f}\n  parents "
        f"{whole.parents.tolist()}"
    )
    if "shape" in result:
        shape = result["shape"]
        print(f"--shape: {shape['tokens_per_pass']:.4f} tokens per pass, {shape['speedup']:.4f}x")
    return 0


def run_block(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import numpy as np

    from spectest.cases.toy_models import DRAFT_KINDS, TARGET_KINDS, distribution_pairs
    from spectest.simulators.block import block_tokens_per_pass, token_wise_tokens_per_pass

    target_kind, _, draft_kind = args.pair.partition(",")
    if target_kind not in TARGET_KINDS or draft_kind not in DRAFT_KINDS:
        parser.error(f"--pair must be TARGET,DRAFT with TARGET in {TARGET_KINDS} and DRAFT in {DRAFT_KINDS}")
    p, q = distribution_pairs(np.random.default_rng(args.seed), args.k + 1, args.vocab, target_kind, draft_kind)
    try:
        block = block_tokens_per_pass(p, q[: args.k])
    except ValueError as exc:
        parser.error(str(exc))
    token_wise = token_wise_tokens_per_pass(p, q[: args.k])
    result = {
        "schema": BLOCK_SCHEMA,
        "inputs": {
            "k": args.k,
            "vocab": args.vocab,
            "target_kind": target_kind,
            "draft_kind": draft_kind,
            "seed": args.seed,
        },
        "token_wise": token_wise.as_dict(),
        "block": block.as_dict(),
        "gain": float(block.mean / token_wise.mean),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"K={args.k} V={args.vocab} pair {target_kind}/{draft_kind} seed {args.seed}")
    print(
        f"token-wise: E[L] = {float(token_wise.mean):.5f}   block: E[L] = {float(block.mean):.5f}   gain x{result['gain']:.4f}"
    )
    for value, tw, bl in zip(block.values, token_wise.probs, block.probs, strict=True):
        print(f"  P(L = {value}): token-wise {tw:.5f}   block {bl:.5f}")
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.tree:
        return run_tree(args, parser)
    if args.block:
        return run_block(args, parser)
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
