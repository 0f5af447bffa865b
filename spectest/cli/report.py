"""``spectest report`` and ``spectest compare``: render a saved results file, or set two side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    report = commands.add_parser("report", help="re-render a saved results.json to HTML, Markdown and plots")
    report.add_argument("results", help="a results.json written by pytest --spec-report DIR (or --spec-results)")
    report.add_argument("-o", "--output", required=True, help="directory for report.html and summary.md")
    compare = commands.add_parser("compare", help="put two results files side by side (Markdown)")
    compare.add_argument("first")
    compare.add_argument("second")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.reporting import report, results

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
