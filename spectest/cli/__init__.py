"""The ``spectest`` command. One module per subcommand, each with ``add_parser(commands)`` and
``run(args, parser) -> exit code``; options shared with the pytest plugin come from
:mod:`spectest.options` and keep their ``--spec-*`` names everywhere."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spectest.cli import bench, check, e2e, models, profile, report, simulate

SUBCOMMANDS = {
    "check": check,
    "e2e": e2e,
    "models": models,
    "simulate": simulate,
    "bench": bench,
    "profile": profile,
    "report": report,
    "compare": report,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectest", description="Correctness and speed harness for speculative decoding."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(SUBCOMMANDS.values()):
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return SUBCOMMANDS[args.command].run(args, parser)


if __name__ == "__main__":
    sys.exit(main())
