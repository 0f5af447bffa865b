"""One run's configuration, read once from the options, and the decisions made from it.

Below both the pytest plugin and the property runner (neither imports the other's internals): the
plugin builds a :class:`SpecSession` from pytest's options, the runner reads it. It owns the
significance split (Bonferroni over the statistical checks each model's properties declare,
counted at collection), the implementation-time budget, and the replay command. Imports
nothing heavy: the plugin loads in every pytest run.
"""

from __future__ import annotations

import importlib.util
import random
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectest import options
from spectest.options import BUDGETS, DEFAULT_ALPHA, DEFAULT_RUN_SECONDS, DEFAULT_TIMEOUT_S, Budget

if TYPE_CHECKING:
    from spectest.protocol import Model

# An interpreted subject's default plan: this multiple of the budget's tolerance (see SpecSession.tolerance_for).
INTERPRETED_TOLERANCE_FACTOR = 1.8
MARKER = "spec_property"  # spec_property(examples, checks, explicit=0)
# Keys of what a property run leaves in pytest's report (user_properties), for the results file.
RECORD_KEY = "spectest"  # a record: {"kind": "check" | "figure", "model", "property", ...}
FAILURE_KEY = "spectest-failure"  # what caught a failing property: {"kind", "rule"}
MODEL_KEY = "spectest-model"  # the model's name, so nothing parses it back out of a node id
MESSAGE_LIMIT = 8000  # characters of a failure's text kept in the results file


def suite_dir() -> Path:
    """Where the installed property suite (``spectest.properties``) lives, found without importing it."""
    spec = importlib.util.find_spec("spectest.properties")
    assert spec is not None and spec.submodule_search_locations, "spectest.properties is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def examples_for(marker_kwargs: Mapping[str, Any], budget: Budget) -> int:
    """Hypothesis examples a property runs under ``budget`` (explicit examples included)."""
    explicit = int(marker_kwargs.get("explicit", 0))
    return explicit + max(1, round(int(marker_kwargs.get("examples", 10)) * budget.examples))


def missing_capabilities(marker_kwargs: Mapping[str, Any], capabilities: Iterable[str]) -> list[str]:
    """What a property ``needs`` (its marker's ``needs=``) that a model does not have."""
    have = set(capabilities)
    return [c for c in marker_kwargs.get("needs", ()) if c not in have]


def planned_checks(
    marker_kwargs: Mapping[str, Any], budget: Budget, capabilities: Iterable[str] | None = None, *, lossy: bool = False
) -> int:
    """Statistical conclusions a property will reach: its declared checks per example, times
    examples; none for a model (given by its ``capabilities``) that lacks what the property needs,
    and none for a model in lossy mode on a property that tests exactness only (``exact_only``)."""
    if capabilities is not None and missing_capabilities(marker_kwargs, capabilities):
        return 0
    if lossy and marker_kwargs.get("exact_only"):
        return 0
    return int(marker_kwargs.get("checks", 1)) * examples_for(marker_kwargs, budget)


class OptionError(ValueError):
    """An option's value is unusable; the message names the option."""


@dataclass
class SpecSession:
    """Everything the run was configured with, plus the significance split made at collection."""

    model_specs: list[str]
    device: str
    seed: int
    alpha: float
    budget: Budget
    tolerance: float
    timeout: float
    shrink: bool
    run_seconds: float = DEFAULT_RUN_SECONDS
    property_seconds: float | None = None
    engine_specs: list[str] = field(default_factory=list)  # --spec-engine: engines checked end to end
    target_dir: str | None = None  # --spec-target: a local checkpoint for engines that load one
    draft_dir: str | None = None
    api_key: str | None = None  # --spec-api-key: for a server engine; never printed
    concurrency: int = 16  # --spec-concurrency: requests a server engine keeps in flight
    reference_url: str | None = None  # --spec-reference-url: a server engine's twin without speculation
    max_tv: float | None = None  # --spec-max-tv: lossy mode for every model
    speed_gate: float | None = None  # --spec-speed-gate: the speed property gates on efficiency
    e2e_speed: bool = False  # --spec-e2e-speed: run the end-to-end speed property
    interpret: bool = False  # --spec-interpret: Triton kernels in Triton's interpreter on the CPU, batched
    tolerance_given: bool = False  # --spec-tolerance was set (else the budget's, or an interpreted subject's)
    run_seconds_given: bool = False  # --spec-run-seconds was set
    report_dir: str | None = None
    results_path: str | None = None
    models: list[Model] = field(default_factory=list)
    engines: list[Any] = field(default_factory=list)  # spectest.e2e.protocol.EngineModel, resolved from engine_specs
    # model name -> statistical checks its selected properties declare (before -k deselection)
    checks_per_model: dict[str, int] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    tests: list[dict[str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)  # the terminal summary, computed before the results file
    # Faults of the harness outside any test body (a timing record, summary, results file, report): {stage, error, traceback}
    stage_errors: list[dict[str, str]] = field(default_factory=list)

    @property
    def has_subject(self) -> bool:
        """Whether the run checks something (``--spec-model`` or ``--spec-engine``), not only a user's own tests."""
        return bool(self.model_specs or self.engine_specs)

    def guarded(self, stage: str, work: Callable[[], Any], fallback: Any) -> Any:
        """``work()``, or ``fallback`` when it raises: the fault is recorded as a harness error of
        ``stage`` (shown in the summary, kept in the results file, exit code 3), never a traceback
        that loses what was already written."""
        import traceback

        try:
            return work()
        except Exception as exc:
            self.stage_errors.append(
                {
                    "stage": stage,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "traceback": traceback.format_exc()[-MESSAGE_LIMIT:],
                }
            )
            return fallback

    def harness_errors(self) -> list[str]:
        """One line per harness error of the run: tests whose harness code raised, and stages."""
        lines = [
            f"in {t['nodeid']}: {t['failure']['rule']}"
            for t in self.tests
            if (t.get("failure") or {}).get("kind") == "harness"
        ]
        return lines + [f"while writing the {e['stage']}: {e['error']}" for e in self.stage_errors]

    @classmethod
    def from_options(cls, value: Callable[[str], Any], *, default_seed: int | None = None) -> SpecSession:
        """Read and validate every option once; ``value(name)`` gives an option's raw value or None."""

        def parse(name: str, parser: Callable[[str], Any], default: Any) -> Any:
            raw = value(name)
            if raw is None:
                return default
            try:
                return parser(raw)
            except ValueError as exc:
                raise OptionError(f"--{name.replace('_', '-')}: {exc}") from None

        budget = BUDGETS[str(value("spec_budget") or "default")]
        seed = default_seed if default_seed is not None else random.SystemRandom().randrange(2**32)
        return cls(
            model_specs=list(value("spec_model") or []),
            engine_specs=list(value("spec_engine") or []),
            target_dir=value("spec_target"),
            draft_dir=value("spec_draft"),
            api_key=value("spec_api_key"),
            concurrency=parse("spec_concurrency", options.positive_count, 16),
            reference_url=value("spec_reference_url"),
            device=check_device(str(value("spec_device") or "cpu")),
            seed=parse("spec_seed", options.seed, seed),
            alpha=parse("spec_alpha", options.probability, DEFAULT_ALPHA),
            budget=budget,
            tolerance=parse("spec_tolerance", options.tolerance, budget.tolerance),
            timeout=parse("spec_timeout", options.positive_seconds, DEFAULT_TIMEOUT_S),
            run_seconds=parse("spec_run_seconds", options.positive_seconds, DEFAULT_RUN_SECONDS),
            property_seconds=parse("spec_property_seconds", options.positive_seconds, None),
            max_tv=parse("spec_max_tv", options.unit_interval, None),
            speed_gate=parse("spec_speed_gate", options.speed_gate, None),
            shrink=not value("spec_no_shrink"),
            e2e_speed=bool(value("spec_e2e_speed")),
            interpret=bool(value("spec_interpret")),
            tolerance_given=value("spec_tolerance") is not None,
            run_seconds_given=value("spec_run_seconds") is not None,
            report_dir=value("spec_report"),
            results_path=value("spec_results"),
        )

    def alpha_per_check(self, model: str) -> float:
        """Bonferroni: the run's alpha shared equally by the model's statistical checks."""
        return self.alpha / max(1, self.checks_per_model.get(model, 1))

    def tolerance_for(self, model: Any) -> float:
        """The TV every distribution check on ``model`` is planned to detect: --spec-tolerance, else the budget's;
        for a subject that runs in Triton's interpreter, INTERPRETED_TOLERANCE_FACTOR times the budget's (its rows
        cost 0.3-1.5 ms each where a compiled kernel's cost microseconds: the default plan at TV 0.09, under a third
        of the rows, runs in minutes and leaves the median detectable TV under 0.1; --spec-tolerance 0.05 asks for the full one)."""
        if self.tolerance_given or not getattr(model, "interpreted", False):
            return self.tolerance
        return min(1.0, self.tolerance * INTERPRETED_TOLERANCE_FACTOR)

    def implementation_budget(self, model: Any, planned: int) -> float | None:
        """Time a property's distribution checks may spend in the implementation's calls: its
        share of --spec-run-seconds by planned checks (counted at collection, like alpha), capped
        by --spec-property-seconds; None for no limit. A subject in Triton's interpreter has none unless
        --spec-run-seconds is given: its plan is sized for it (:meth:`tolerance_for`), and every check runs to it."""
        name = getattr(model, "name", model)
        limits = []
        interpreted = getattr(model, "interpreted", False)
        if self.run_seconds and (self.run_seconds_given or not interpreted):
            limits.append(self.run_seconds * planned / max(1, self.checks_per_model.get(name, planned)))
        if self.property_seconds:
            limits.append(self.property_seconds)
        return min(limits) if limits else None

    def max_tv_for(self, model: Model) -> float | None:
        """Lossy-mode limit per emitted token for ``model``: --spec-max-tv, else its declaration; None: exact."""
        return self.max_tv if self.max_tv is not None else model.max_tv

    def speed_gate_for(self, model: Model) -> float | None:
        """The largest multiple of an efficient pass ``model``'s passes may cost: --spec-speed-gate,
        else its declaration (``spectest_speed_gate``); None: measured and reported, not gated."""
        return self.speed_gate if self.speed_gate is not None else model.speed_gate

    def replay_command(self, model: Model, test_name: str, *, flag: str = "--spec-model") -> str:
        """The command that replays ``test_name`` on ``model`` (``flag``: --spec-model, or --spec-engine)."""
        parts = ["pytest", flag, model.source, "--spec-seed", str(self.seed)]
        if self.device != "cpu":
            parts += ["--spec-device", self.device]
        if self.budget.name != "default":
            parts += ["--spec-budget", self.budget.name]
        if self.alpha != DEFAULT_ALPHA:
            parts += ["--spec-alpha", repr(self.alpha)]
        if self.tolerance != self.budget.tolerance:
            parts += ["--spec-tolerance", repr(self.tolerance)]
        if self.run_seconds != DEFAULT_RUN_SECONDS:
            parts += ["--spec-run-seconds", repr(self.run_seconds)]
        if self.property_seconds is not None:
            parts += ["--spec-property-seconds", repr(self.property_seconds)]
        if self.max_tv is not None:
            parts += ["--spec-max-tv", repr(self.max_tv)]
        if self.speed_gate is not None:
            parts += ["--spec-speed-gate", repr(self.speed_gate)]
        if self.e2e_speed:
            parts += ["--spec-e2e-speed"]
        if self.interpret:
            parts += ["--spec-interpret"]
        if flag == "--spec-engine" and self.target_dir:
            parts += ["--spec-target", self.target_dir] + (["--spec-draft", self.draft_dir] if self.draft_dir else [])
        if flag == "--spec-engine" and self.concurrency != 16:
            parts += ["--spec-concurrency", str(self.concurrency)]
        if flag == "--spec-engine" and self.reference_url:
            from spectest.urls import redact

            parts += ["--spec-reference-url", redact(self.reference_url)]
        parts += ["-k", test_name]
        return shlex.join(parts)

    def split_lines(self) -> list[str]:
        """The significance split, as the terminal summary and the docs state it."""
        return [
            f"{model}: false-failure budget alpha={self.alpha:g} split over {count} statistical checks "
            f"(Bonferroni, each at {self.alpha / count:.3g}); seed {self.seed}"
            if count
            else f"{model}: exact rules only, no statistical check; seed {self.seed}"
            for model, count in self.checks_per_model.items()
        ]


def check_device(device: str) -> str:
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise OptionError(f"--spec-device {device!r}: expected cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise OptionError(f"--spec-device {device!r}: CUDA is not available on this machine")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise OptionError(f"--spec-device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return device
