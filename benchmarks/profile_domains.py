"""Which text is predictable? Acceptance and predicted speedup by domain, on text any fresh
machine has (run after the README's setup line):

* code: the Python standard library's modules;
* json: the JSON files installed in site-packages (schemas and data shipped by packages);
* prose: English documentation, the ``pydoc_data.topics`` strings of the standard library.

Each domain's files are split by sorted order into a training half and a held-out half. One
byte-level n-gram target (order 5) and draft (order 2) are trained on the union of the training
halves, and ``spectest profile`` runs on each domain's held-out half. Prints a Markdown table.

    python benchmarks/profile_domains.py [--gamma 4] [--cost-ratio 0.1] [--bytes 400000] [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import sysconfig
import tempfile
from pathlib import Path

from spectest.cli import main as spectest


def prose_texts() -> list[bytes]:
    topics = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
    tree = ast.parse(topics.read_text())
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    return [s.encode() for s in sorted(strings) if len(s) > 200]


def code_texts() -> list[bytes]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_bytes() for p in sorted(stdlib.glob("*.py"))]


def json_texts() -> list[bytes]:
    purelib = sysconfig.get_paths()["purelib"]
    return [Path(p).read_bytes() for p in sorted(glob.glob(f"{purelib}/**/*.json", recursive=True))]


def halves(texts: list[bytes], budget: int) -> tuple[bytes, bytes]:
    """Alternate files into training and held-out text, each capped at ``budget`` bytes."""
    train = b"\n".join(texts[0::2])[:budget]
    held = b"\n".join(texts[1::2])[:budget]
    return train, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--cost-ratio", type=float, default=0.1)
    parser.add_argument("--bytes", type=int, default=400_000, help="training bytes per domain")
    parser.add_argument("--tokens", type=int, default=20_000, help="held-out bytes profiled per domain")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    domains = {"code": code_texts(), "json": json_texts(), "prose": prose_texts()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train_files, texts = [], []
        for name, files in domains.items():
            train, held = halves(files, args.bytes)
            (root / f"{name}.train").write_bytes(train)
            (root / f"{name}.held").write_bytes(held)
            train_files.append(str(root / f"{name}.train"))
            texts.append(f"{name}={root / f'{name}.held'}")
        out = root / "profile.json"
        spectest(
            [
                "profile",
                "--target",
                "ngram:5",
                "--draft",
                "ngram:2",
                "--train",
                *train_files,
                "--text",
                *texts,
                "--gamma",
                str(args.gamma),
                "--cost-ratio",
                str(args.cost_ratio),
                "--max-tokens",
                str(args.tokens),
                "--json",
                str(out),
            ]
        )
        document = json.loads(out.read_text())
    print()
    print(
        f"| domain | tokens | mean acceptance | p10 / p50 / p90 | tokens per pass (K={args.gamma}) | "
        f"predicted speedup (c={args.cost_ratio:g}) | margin to break-even | optimal K | below break-even |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in document["labels"]:
        q = row["acceptance_quantiles"]
        print(
            f"| {row['name']} | {row['tokens']} | {row['mean_acceptance']:.3f} | {q['0.1']:.2f} / {q['0.5']:.2f} / "
            f"{q['0.9']:.2f} | {row['tokens_per_pass']:.2f} | {row['speedup']:.2f}x | {row['margin']:+.3f} | "
            f"{row['optimal_k']} ({row['optimal_speedup']:.2f}x) | "
            f"{row['tokens_below_break_even'] / row['tokens']:.1%} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
