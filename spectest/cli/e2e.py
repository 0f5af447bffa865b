"""``spectest e2e --engine X``: the end-to-end properties on an engine, like ``pytest --spec-engine X``."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from spectest import options


def add_parser(commands: Any) -> None:
    e2e = commands.add_parser(
        "e2e",
        help="check an engine's generation loop end to end, speculative decoding on (same as pytest --spec-engine X)",
    )
    e2e.add_argument(
        "--engine",
        action="append",
        required=True,
        metavar="X",
        help="registered name (spectest.engines), module:attr or file.py:attr; repeat for several",
    )
    options.add_argparse_options(e2e)
    e2e.add_argument(
        "--speed",
        action="store_true",
        help="run only the speed property (--spec-e2e-speed): measured against predicted speedup, break-even, optimal K",
    )
    e2e.add_argument("--pytest-args", default="", help="extra pytest arguments, as one quoted string")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import pytest

    pytest_args = [a for engine in args.engine for a in ("--spec-engine", engine)]
    pytest_args += options.to_pytest_args(args) + shlex.split(args.pytest_args)
    if args.speed:
        pytest_args += ["--spec-e2e-speed", "-k", "test_engine_speedup_follows_its_model"]
    return int(pytest.main(pytest_args))
