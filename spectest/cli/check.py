"""``spectest check X``: the property suite against an implementation, like ``pytest --spec-model X``."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from spectest import options


def add_parser(commands: Any) -> None:
    check = commands.add_parser(
        "check", help="run the property suite against an implementation (same as pytest --spec-model X)"
    )
    check.add_argument("models", nargs="+", metavar="MODEL", help="registered name, module:attr or file.py:attr")
    options.add_argparse_options(check)
    check.add_argument("--pytest-args", default="", help="extra pytest arguments, as one quoted string")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import pytest

    pytest_args = [a for model in args.models for a in ("--spec-model", model)]
    pytest_args += options.to_pytest_args(args) + shlex.split(args.pytest_args)
    return int(pytest.main(pytest_args))
