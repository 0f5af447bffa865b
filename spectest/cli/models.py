"""``spectest models``: the registered implementation and engine names and what they point at."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    commands.add_parser(
        "models",
        help="list the registered names: models (for --spec-model) and engines (for --spec-engine)",
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from spectest.e2e.resolve import registered_engines
    from spectest.resolve import registered_models

    for kind, registered in (("model", registered_models()), ("engine", registered_engines())):
        for name, target in sorted(registered.items()):
            print(f"{kind}\t{name}\t{target}")
    return 0
