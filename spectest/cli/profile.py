"""``spectest profile``: predicted acceptance and speedup of a target/draft pair on the user's texts.

JSON output (``--json``), schema ``spectest.profile/2``: ``inputs`` {target, draft, k,
cost_ratio, cost_ratio_measured, temperature, top_k, top_p}, ``files`` and ``labels``: one
summary each (see ``spectest.profiler.acceptance.summarize``: mean_acceptance, acceptance_std,
acceptance_quantiles, window_acceptance_range, slot_acceptance, tokens_per_pass, speedup,
break_even_acceptance, margin, optimal_k, optimal_speedup, tokens_below_break_even, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spectest.options import argument, non_negative, positive_int, unit_interval

SCHEMA = "spectest.profile/2"


def add_parser(commands: Any) -> None:
    prof = commands.add_parser(
        "profile",
        help="acceptance along your own texts, and the speedup it predicts",
        description="Teacher-force a target and a draft model over texts; report the exact acceptance at every "
        "position and the tokens per pass, speedup, break-even and optimal K it implies.",
    )
    prof.add_argument("--target", required=True, help="ngram:N, hf:PATH or toy:KIND")
    prof.add_argument("--draft", required=True, help="ngram:N, hf:PATH, toy:KIND or uniform")
    prof.add_argument("--text", nargs="+", default=[], metavar="[LABEL=]FILE", help="texts to profile")
    prof.add_argument("--train", nargs="+", default=[], metavar="FILE", help="training text for ngram models")
    prof.add_argument("--generate", type=argument(positive_int), help="profile N tokens sampled from a toy target")
    prof.add_argument(
        "--k",
        "--gamma",
        dest="k",
        type=argument(positive_int),
        default=4,
        help="draft tokens per pass K (default 4; --gamma is the old spelling)",
    )
    prof.add_argument("--cost-ratio", type=argument(non_negative), help="draft/target cost c (default: measured)")
    prof.add_argument("--temperature", type=argument(non_negative), default=1.0, help="0 means greedy")
    prof.add_argument("--top-k", type=argument(positive_int), default=None)
    prof.add_argument("--top-p", type=argument(unit_interval), default=None)
    prof.add_argument("--min-p", type=argument(unit_interval), default=None)
    prof.add_argument("--max-tokens", type=argument(positive_int), default=20000, help="per text (default 20000)")
    prof.add_argument("--vocab", type=argument(positive_int), default=8, help="vocabulary of toy models")
    prof.add_argument("--seed", type=int, default=0, help="seed of toy models and generated texts")
    prof.add_argument("--json", metavar="PATH", help="write the figures as JSON ('-' for stdout)")
    prof.add_argument("--plot", metavar="PATH", help="plot acceptance along each text (needs matplotlib)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.profiler.acceptance import ProfileError

    try:
        document = profile(args)
    except (ProfileError, OSError) as exc:
        parser.error(str(exc))
    if args.json == "-":
        json.dump(document, sys.stdout, indent=1)
        print()
    else:
        print(table(document))
        if args.json:
            Path(args.json).write_text(json.dumps(document, indent=1))
    return 0


def _params(args: argparse.Namespace):
    from spectest.sampling_params import SamplingParams

    if args.temperature == 1.0 and args.top_k is None and args.top_p is None and args.min_p is None:
        return None
    return SamplingParams.build(
        1,
        temperature=args.temperature,
        top_k=args.top_k or 0,
        top_p=args.top_p if args.top_p is not None else 1.0,
        min_p=args.min_p or 0.0,
    )


def profile(args: argparse.Namespace) -> dict[str, Any]:
    from spectest.profiler.acceptance import (
        ProfileError,
        build_pair,
        check_vocabulary,
        measured_cost_ratio,
        profile_tokens,
    )
    from spectest.profiler.acceptance import summarize as summarize_profiles

    pair = build_pair(args.target, args.draft, train=[Path(p) for p in args.train], vocab=args.vocab, seed=args.seed)
    check_vocabulary(pair.target, pair.draft)
    params = _params(args)
    profiles = []
    if args.generate:
        if pair.generate is None:
            raise ProfileError("--generate samples from a toy target (toy:KIND)")
        tokens = pair.generate(args.generate, args.seed)
        profiles.append(
            profile_tokens(pair.target, pair.draft, tokens, name="generated", label="generated", params=params)
        )
    encode = pair.target.encode
    for item in args.text:
        label, sep, path = item.partition("=")
        path, label = (path, label) if sep else (item, Path(item).suffix.lstrip(".") or "text")
        if encode is None:
            raise ProfileError(f"{args.target} scores generated token ids, not files: use --generate")
        tokens = encode(Path(path).read_bytes())[: args.max_tokens]
        profiles.append(profile_tokens(pair.target, pair.draft, tokens, name=path, label=label, params=params))
    if not profiles:
        raise ProfileError("nothing to profile: give --text FILE ... (or --generate N for toy models)")
    measured = measured_cost_ratio(profiles)
    cost = args.cost_ratio if args.cost_ratio is not None else measured
    labels = sorted({p.label for p in profiles})
    document = {
        "schema": SCHEMA,
        "inputs": {
            "target": args.target,
            "draft": args.draft,
            "k": args.k,
            "cost_ratio": cost,
            "cost_ratio_measured": measured,
            "temperature": args.temperature,
            "top_k": args.top_k,
            "top_p": args.top_p,
            "min_p": args.min_p,
        },
        "files": [summarize_profiles([p], k=args.k, cost_ratio=cost, name=p.name) for p in profiles],
        "labels": [
            summarize_profiles([p for p in profiles if p.label == label], k=args.k, cost_ratio=cost, name=label)
            for label in labels
        ],
    }
    if args.plot:
        from spectest.reporting.plots import plot_profiles

        plot_profiles(profiles, document, Path(args.plot))
    return document


def table(document: dict[str, Any]) -> str:
    inputs = document["inputs"]
    be = document["files"][0]["break_even_acceptance"]
    lines = [
        f"target {inputs['target']}, draft {inputs['draft']}, K={inputs['k']}, cost ratio c={inputs['cost_ratio']:.3g}"
        f" (measured {inputs['cost_ratio_measured']:.3g}); break-even acceptance "
        + (f"{be:.3f}" if be is not None else "none (drafting costs more than it can save)"),
        f"{'text':<32} {'tokens':>7} {'accept':>7} {'std':>6} {'p10':>6} {'tok/pass':>8} {'speedup':>7} "
        f"{'margin':>7} {'opt K':>5} {'below':>6}",
    ]
    for section in ("files", "labels"):
        if section == "labels":
            lines.append("by label:")
        for row in document[section]:
            margin = f"{row['margin']:+.3f}" if row["margin"] is not None else "   n/a"
            lines.append(
                f"{Path(row['name']).name[:32]:<32} {row['tokens']:>7} {row['mean_acceptance']:>7.3f} "
                f"{row['acceptance_std']:>6.3f} {row['acceptance_quantiles']['0.1']:>6.3f} "
                f"{row['tokens_per_pass']:>8.3f} {row['speedup']:>7.3f} {margin:>7} {row['optimal_k']:>5} "
                f"{row['tokens_below_break_even'] / row['tokens']:>6.1%}"
            )
    return "\n".join(lines)
