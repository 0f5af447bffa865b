"""``spectest models``: the registered implementation names and what they point at."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    commands.add_parser("models", help="list the registered implementation names")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.resolve import registered_models

    for name, target in sorted(registered_models().items()):
        print(f"{name}\t{target}")
    return 0
