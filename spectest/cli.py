"""The ``spectest`` command: the same checks as the pytest plugin, from the command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spectest import bench_cli, options, profile_cli, simulate_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectest", description="Correctness and speed harness for speculative decoding."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check", help="run the property suite against an implementation (same as pytest --spec-model X)"
    )
    check.add_argument("models", nargs="+", metavar="MODEL", help="registered name, module:attr or file.py:attr")
    options.add_argparse_options(check)
    check.add_argument("--pytest-args", default="", help="extra pytest arguments, as one quoted string")
    commands.add_parser("models", help="list the registered implementation names")
    simulate_cli.add_parser(commands)
    bench_cli.add_parser(commands)
    profile_cli.add_parser(commands)
    report = commands.add_parser("report", help="re-render a saved results.json to HTML, Markdown and plots")
    report.add_argument("results", help="a results.json written by pytest --spec-report DIR")
    report.add_argument("-o", "--output", required=True, help="directory for report.html and summary.md")
    compare = commands.add_parser("compare", help="put two results files side by side (Markdown)")
    compare.add_argument("first")
    compare.add_argument("second")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "simulate":
        return simulate_cli.run(args, parser)
    if args.command == "bench":
        return bench_cli.run(args, parser)
    if args.command == "profile":
        return profile_cli.run(args, parser)
    if args.command in ("report", "compare"):
        from pathlib import Path

        from spectest import report, results

        try:
            if args.command == "report":
                for path in report.render(results.load(Path(args.results)), Path(args.output)):
                    print(path)
            else:
                names = (Path(args.first).name, Path(args.second).name)
                print(report.compare(results.load(Path(args.first)), results.load(Path(args.second)), names), end="")
        except (OSError, ValueError) as exc:
            parser.error(str(exc))
        return 0
    if args.command == "models":
        from spectest.resolve import registered_models

        for name, target in sorted(registered_models().items()):
            print(f"{name}\t{target}")
        return 0
    import shlex

    import pytest

    pytest_args = [a for model in args.models for a in ("--spec-model", model)]
    pytest_args += options.to_pytest_args(args) + shlex.split(args.pytest_args)
    return int(pytest.main(pytest_args))


if __name__ == "__main__":
    sys.exit(main())
