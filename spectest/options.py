"""Option definitions shared by the pytest plugin and the ``spectest`` command line.

Pure data and parsing: importing this module costs nothing (the plugin loads in every pytest run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_ALPHA = 1e-4
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RUN_SECONDS = 300.0


@dataclass(frozen=True)
class Budget:
    """How much work a run spends: Hypothesis examples (a factor on each property's count), and
    the smallest total variation distance every distribution check must detect (power 0.99),
    from which sample sizes follow."""

    name: str
    examples: float
    tolerance: float


BUDGETS = {
    "quick": Budget("quick", examples=0.34, tolerance=0.1),
    "default": Budget("default", examples=1.0, tolerance=0.05),
    "thorough": Budget("thorough", examples=3.0, tolerance=0.025),
}


def probability(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise ValueError(f"must lie strictly between 0 and 1, got {text}")
    return value


def unit_interval(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must lie in [0, 1], got {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise ValueError(f"must be a finite number >= 0, got {text}")
    return value


def speed_gate(text: str) -> float:
    value = float(text)
    if not 1.0 <= value < float("inf"):
        raise ValueError(f"must be a multiple of an efficient pass's cost, a finite number >= 1, got {text}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {text}")
    return value


def argument(check: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from one of the validators above: same rule, argparse's error format."""

    def convert(text: str) -> T:
        try:
            return check(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__
    return convert


def tolerance(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"must be a total variation distance in (0, 1], got {text}")
    return value


def seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must be a non-negative integer, got {text}")
    return value


def positive_count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must be >= 0 seconds (0 disables), got {text}")
    return value


# (flag, ini name, help, extra argparse-style keywords). One table serves plugin and CLI.
OPTIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "--spec-model",
        "spec_model",
        "implementation to check: a registered name (e.g. 'reference'), 'package.module:attr' or "
        "'path/to/file.py:attr'; repeat for several (one parametrized run each)",
        {"action": "append", "default": None, "metavar": "X"},
    ),
    (
        "--spec-engine",
        "spec_engine",
        "engine to check end to end, speculative decoding on: a registered name (e.g. 'transformers-assisted'), "
        "'package.module:attr' or 'path/to/file.py:attr'; repeat for several",
        {"action": "append", "default": None, "metavar": "X"},
    ),
    (
        "--spec-target",
        "spec_target",
        "local checkpoint directory of the target model, for engines that load one (transformers-assisted) and "
        "to score a server's output ('openai:URL'; there also 'path/to/file.py:attr', an object with target_logits, "
        "or a vLLM server's prompt_logprobs: 'server', the server under test itself, or 'openai+vllm:URL')",
        {"default": None, "metavar": "DIR"},
    ),
    (
        "--spec-draft",
        "spec_draft",
        "local checkpoint directory of the draft model, with --spec-target",
        {"default": None, "metavar": "DIR"},
    ),
    (
        "--spec-api-key",
        "spec_api_key",
        "API key for an 'openai:URL' engine, sent as a bearer token and never printed (default: the "
        "SPECTEST_API_KEY environment variable)",
        {"default": None, "metavar": "KEY"},
    ),
    (
        "--spec-reference-url",
        "spec_reference_url",
        "a twin endpoint of the served target with speculative decoding off, for an 'openai:URL' engine: its "
        "output is compared with the engine's by a two-sample test (needs no --spec-target)",
        {"default": None, "metavar": "URL"},
    ),
    (
        "--spec-concurrency",
        "spec_concurrency",
        "requests an 'openai:URL' engine keeps in flight per call: the call's own and unscored crowd requests "
        "with mixed parameters beside them (default 16)",
        {"default": None, "metavar": "N"},
    ),
    (
        "--spec-device",
        "spec_device",
        "device for the checks: cpu, cuda or cuda:N (default cpu)",
        {"default": None, "metavar": "DEVICE"},
    ),
    (
        "--spec-seed",
        "spec_seed",
        "seed of the whole run; a printed seed replays a failure",
        {"default": None, "metavar": "SEED"},
    ),
    (
        "--spec-alpha",
        "spec_alpha",
        f"probability that the whole run fails a correct implementation (default {DEFAULT_ALPHA})",
        {"default": None, "metavar": "ALPHA"},
    ),
    (
        "--spec-budget",
        "spec_budget",
        "time/strength trade-off: quick, default or thorough (Hypothesis examples x0.34/x1/x3, "
        "tolerance 0.1/0.05/0.025)",
        {"default": None, "choices": sorted(BUDGETS)},
    ),
    (
        "--spec-tolerance",
        "spec_tolerance",
        "smallest total variation distance each distribution check must detect with power 0.99 "
        "(default: the budget's); sample sizes follow from it",
        {"default": None, "metavar": "TV"},
    ),
    (
        "--spec-max-tv",
        "spec_max_tv",
        "lossy mode for every model: measure the TV distance of each output-distribution check with a "
        "simultaneous confidence interval and fail only when its lower end exceeds TV per emitted token "
        "(exact rules still hold; default: exact, unless a model declares spectest_max_tv or spectest_lossy)",
        {"default": None, "metavar": "TV"},
    ),
    (
        "--spec-speed-gate",
        "spec_speed_gate",
        "fail the speed property when a pass costs more than RATIO times an efficient pass (the reference's "
        "verify cost in the same loop); by default that ratio is measured and reported, and the property only "
        "holds the measured speedup to the model with the implementation's own costs",
        {"default": None, "metavar": "RATIO"},
    ),
    (
        "--spec-report",
        "spec_report",
        "write results.json, report.html and summary.md (plus plots) into this directory",
        {"default": None, "metavar": "DIR"},
    ),
    (
        "--spec-results",
        "spec_results",
        "write only the results file (results.json, schema spectest.results/1) to this path",
        {"default": None, "metavar": "FILE"},
    ),
    (
        "--spec-timeout",
        "spec_timeout",
        f"seconds one verify call may take before it counts as a hang (default {DEFAULT_TIMEOUT_S:g}; 0: off)",
        {"default": None, "metavar": "SECONDS"},
    ),
    (
        "--spec-run-seconds",
        "spec_run_seconds",
        f"time the implementation's own calls may take in the run's distribution checks, per model (default "
        f"{DEFAULT_RUN_SECONDS:g}; 0: no limit), shared by the properties in proportion to their planned checks; "
        "a slower implementation gets fewer draws, and each check reports the larger effect it could still detect",
        {"default": None, "metavar": "SECONDS"},
    ),
    (
        "--spec-property-seconds",
        "spec_property_seconds",
        "at most this much of the implementation's own time per property (default: its share of --spec-run-seconds)",
        {"default": None, "metavar": "SECONDS"},
    ),
]


FLAGS = ("spec_no_shrink", "spec_e2e_speed", "spec_interpret")  # options that take no value
INTERPRET_HELP = (
    "run Triton kernels on the CPU in Triton's interpreter (sets TRITON_INTERPRET=1 before --spec-model's module "
    "imports triton), a launch's programs batched (spectest.gpu.interpreter; SPECTEST_INTERPRETER=plain runs them "
    "one by one); spectest's registered Triton models do this by themselves where there is no GPU"
)
SUBJECTS = ("--spec-model", "--spec-engine")  # what a run checks: commands take them as positional arguments


def add_pytest_options(parser: Any) -> None:
    group = parser.getgroup("spectest", "speculative decoding checks (spectest)")
    for flag, ini, help_text, extra in OPTIONS:
        group.addoption(flag, dest=ini, help=help_text, **extra)
        parser.addini(ini, help=help_text, type="linelist" if extra.get("action") == "append" else "string")
    group.addoption(
        "--spec-e2e-speed",
        dest="spec_e2e_speed",
        action="store_true",
        help="also run the end-to-end speed property on --spec-engine engines (timing: a quiet machine, minutes)",
    )
    group.addoption(
        "--spec-interpret",
        dest="spec_interpret",
        action="store_true",
        help=INTERPRET_HELP,
    )
    group.addoption(
        "--spec-no-shrink",
        dest="spec_no_shrink",
        action="store_true",
        help="report the first failing example without shrinking it (faster on broken implementations)",
    )


def add_argparse_options(parser: Any) -> None:
    for flag, ini, help_text, extra in OPTIONS:
        if flag not in SUBJECTS:
            parser.add_argument(flag, dest=ini, help=help_text, **extra)
    parser.add_argument("--spec-no-shrink", dest="spec_no_shrink", action="store_true")
    parser.add_argument("--spec-e2e-speed", dest="spec_e2e_speed", action="store_true")
    parser.add_argument("--spec-interpret", dest="spec_interpret", action="store_true", help=INTERPRET_HELP)


def to_pytest_args(namespace: Any) -> list[str]:
    """Turn CLI options back into pytest arguments (the CLI hands over to pytest)."""
    args: list[str] = []
    for flag, ini, _, _ in OPTIONS:
        value = getattr(namespace, ini, None)
        if value is not None and flag not in SUBJECTS:
            args += [flag, str(value)]
    for flag in FLAGS:
        if getattr(namespace, flag, False):
            args.append("--" + flag.replace("_", "-"))
    return args
