"""pytest plugin: ``pytest --spec-model X`` runs the spectest property suite against X.

Loaded in every pytest run through the ``pytest11`` entry point, so it imports nothing heavy:
torch and the user's implementation are imported only when ``--spec-model`` asks for them.
"""

from __future__ import annotations

import random
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spectest import options
from spectest.options import BUDGETS, DEFAULT_ALPHA, DEFAULT_RUN_SECONDS, DEFAULT_TIMEOUT_S, Budget

if TYPE_CHECKING:
    from spectest.protocol import Model

SUITE_DIR = Path(__file__).resolve().parent.parent / "properties"
MARKER = "spec_property"
RESULT_KEY = "spectest"
FAILURE_KEY = "spectest-failure"


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
    report_dir: str | None = None
    results_path: str | None = None
    models: list[Model] = field(default_factory=list)
    checks_per_model: dict[str, int] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    tests: list[dict[str, Any]] = field(default_factory=list)

    def alpha_per_check(self, model: str) -> float:
        """Bonferroni: the run's alpha shared equally by the model's statistical checks."""
        return self.alpha / max(1, self.checks_per_model.get(model, 1))

    def implementation_budget(self, model: str, planned_checks: int) -> float | None:
        """Own time a property's distribution checks may spend in the implementation's calls: its
        share of --spec-run-seconds by planned checks (counted at collection, like alpha), capped
        by --spec-property-seconds; None for no limit."""
        limits = []
        if self.run_seconds:
            limits.append(self.run_seconds * planned_checks / max(1, self.checks_per_model.get(model, planned_checks)))
        if self.property_seconds:
            limits.append(self.property_seconds)
        return min(limits) if limits else None

    def replay_command(self, model: Model, test_name: str) -> str:
        parts = ["pytest", "--spec-model", model.source, "--spec-seed", str(self.seed)]
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
        parts += ["-k", test_name]
        return shlex.join(parts)


SESSION = pytest.StashKey[SpecSession]()


def examples_for(marker: pytest.Mark, budget: Budget) -> int:
    """Hypothesis examples a property runs under ``budget`` (explicit examples included)."""
    explicit = int(marker.kwargs.get("explicit", 0))
    return explicit + max(1, round(int(marker.kwargs.get("examples", 10)) * budget.examples))


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_pytest_options(parser)


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value in (None, []):
        value = config.getini(name) or None
    return value


def _parse(config: pytest.Config, name: str, parser: Any, default: Any) -> Any:
    raw = _option(config, name)
    if raw is None:
        return default
    try:
        return parser(raw)
    except ValueError as exc:
        raise pytest.UsageError(f"--{name.replace('_', '-')}: {exc}") from None


def _check_device(device: str) -> str:
    if device == "cpu":
        return device
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise pytest.UsageError(f"--spec-device {device!r}: expected cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError(f"--spec-device {device!r}: CUDA is not available on this machine")
    index = int(device[5:]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise pytest.UsageError(f"--spec-device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return device


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(examples, checks, explicit=0): a spectest property; 'checks' statistical "
        "assertions per Hypothesis example share the run's significance budget",
    )
    config.addinivalue_line(
        "markers", "spec_speed: a wall-clock speed property (about a minute on CPU; deselect with -m 'not spec_speed')"
    )
    specs = list(_option(config, "spec_model") or [])
    budget = BUDGETS[str(_option(config, "spec_budget") or "default")]
    worker_input = getattr(config, "workerinput", None)  # pytest-xdist worker: use the controller's seed
    default_seed = worker_input["spec_seed"] if worker_input else random.SystemRandom().randrange(2**32)
    session = SpecSession(
        model_specs=specs,
        device=_check_device(str(_option(config, "spec_device") or "cpu")),
        seed=_parse(config, "spec_seed", options.seed, default_seed),
        alpha=_parse(config, "spec_alpha", options.probability, DEFAULT_ALPHA),
        budget=budget,
        tolerance=_parse(config, "spec_tolerance", options.tolerance, budget.tolerance),
        timeout=_parse(config, "spec_timeout", options.positive_seconds, DEFAULT_TIMEOUT_S),
        run_seconds=_parse(config, "spec_run_seconds", options.positive_seconds, DEFAULT_RUN_SECONDS),
        property_seconds=_parse(config, "spec_property_seconds", options.positive_seconds, None),
        shrink=not config.getoption("spec_no_shrink"),
        report_dir=_option(config, "spec_report"),
        results_path=_option(config, "spec_results"),
    )
    if specs:
        session.models = _resolve_all(specs)
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            config.args = [str(SUITE_DIR)]  # no paths given: run the installed property suite
    config.stash[SESSION] = session
    config.pluginmanager.register(ResultCollector(session), "spectest-results")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker uses the controller's seed, so a printed seed replays all."""
    node.workerinput["spec_seed"] = node.config.stash[SESSION].seed


def _resolve_all(specs: list[str]) -> list[Model]:
    from spectest.resolve import ModelSpecError, resolve_model

    try:
        return [resolve_model(spec) for spec in specs]
    except ModelSpecError as exc:
        raise pytest.UsageError(str(exc)) from None


def _session_models(config: pytest.Config) -> list[Model]:
    session = config.stash[SESSION]
    if not session.models:  # properties collected without --spec-model: check the reference
        session.models = _resolve_all(["reference"])
    return session.models


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    if session is None or not session.model_specs:
        return []
    described = []
    for model in session.models:
        caps = f" [{', '.join(sorted(model.capabilities))}]" if model.capabilities else ""
        skip = f" (unavailable: {model.unavailable})" if model.unavailable else ""
        described.append(f"{model.name}{caps}{skip}")
    return [
        f"spectest: models: {', '.join(described)}",
        f"spectest: device: {session.device}, seed: {session.seed} (replay with --spec-seed {session.seed}), "
        f"alpha: {session.alpha:g}, budget: {session.budget.name}, tolerance: TV {session.tolerance:g}",
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "spec_model" in metafunc.fixturenames:
        models = _session_models(metafunc.config)
        metafunc.parametrize("spec_model", models, ids=[m.name for m in models], scope="session")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Split the significance budget over every statistical check collected for each model.

    Runs before ``-k``/``-m`` deselection, so a replay of one test uses the same per-check level.
    """
    session = config.stash[SESSION]
    counts: dict[str, int] = {}
    for item in items:
        marker = item.get_closest_marker(MARKER)
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None or "spec_model" not in callspec.params:
            continue
        name = callspec.params["spec_model"].name
        per_example = int(marker.kwargs.get("checks", 1))
        counts[name] = counts.get(name, 0) + per_example * examples_for(marker, session.budget)
    session.checks_per_model = counts


@pytest.fixture
def spec_device(request: pytest.FixtureRequest) -> Any:
    import torch

    return torch.device(request.config.stash[SESSION].device)


@pytest.fixture
def spec(request: pytest.FixtureRequest, spec_model: Model) -> Any:
    """The running property: Hypothesis settings, seeds, significance level and verdicts."""
    from spectest.runner import PropertyRun

    if spec_model.unavailable:
        pytest.skip(f"{spec_model.name} cannot run here: {spec_model.unavailable}")
    return PropertyRun(request.config.stash[SESSION], spec_model, request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Say what caught a failing property (a rule, a distribution check, or a crash), in the report
    itself, so that it reaches the results file (and the xdist controller) without parsing text."""
    run = getattr(item, "funcargs", {}).get("spec")
    if call.when == "call" and hasattr(run, "finish"):
        run.finish()  # before the report copies the item's records
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed or item.get_closest_marker(MARKER) is None:
        return
    exc = call.excinfo.value
    kind = getattr(exc, "kind", None)
    failure = (
        {"kind": kind, "rule": str(exc.rule)}
        if kind in ("rule", "statistical")
        else {"kind": "crash", "rule": f"{type(exc).__name__}: {str(exc)[:300]}"}
    )
    report.user_properties.append((FAILURE_KEY, failure))


class ResultCollector:
    """Gathers check records from test reports (on the xdist controller too: reports travel)."""

    def __init__(self, session: SpecSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.session.results += [value for key, value in report.user_properties if key == RESULT_KEY]
        if MARKER not in report.keywords or not (report.when == "call" or report.outcome != "passed"):
            return
        name, _, model = report.nodeid.rpartition("::")[2].partition("[")
        self.session.tests.append(
            {
                "model": model[:-1] if model.endswith("]") else model,
                "property": name,
                "nodeid": report.nodeid,
                "outcome": "error" if report.when != "call" and report.failed else report.outcome,
                "duration_s": report.duration,
                "message": report.longreprtext[-8000:] if report.failed else "",
                "failure": next((value for key, value in report.user_properties if key == FAILURE_KEY), None),
            }
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the results file (controller only) and render the reports from it."""
        run = self.session
        if (run.report_dir is None and run.results_path is None) or hasattr(session.config, "workerinput"):
            return
        from spectest import results

        env = results.environment(
            device=run.device, seed=run.seed, alpha=run.alpha, budget=run.budget.name, tolerance=run.tolerance
        )
        env["models"] = [results.describe_model(m) for m in run.models]
        document = results.document(env, run.tests, run.results)
        written: list[str] = []
        if run.results_path is not None:
            results.write_atomically(Path(run.results_path), document)
            written.append(str(run.results_path))
        if run.report_dir is not None:
            directory = Path(run.report_dir)
            results.write_atomically(directory / "results.json", document)  # first: nothing renders before it
            written.append(str(directory / "results.json"))
            try:
                from spectest.report import render

                written += map(str, render(results.finite(document), directory))
            except Exception as exc:  # a rendering problem must not hide the results file
                written.append(f"(report rendering failed: {type(exc).__name__}: {exc})")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"spectest: results written to {', '.join(written)}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is None:
        return
    # Under xdist the controller collects nothing: the split travels in the records instead.
    split = session.checks_per_model or {
        r["model"]: r["checks_for_model"] for r in session.results if "checks_for_model" in r
    }
    if not split:
        return
    write = terminalreporter.write_line
    terminalreporter.section("spectest")
    for model, count in split.items():
        write(
            f"{model}: false-failure budget alpha={session.alpha:g} split over {count} statistical checks "
            f"(Bonferroni, each at {session.alpha / count:.3g}); seed {session.seed}"
        )
    for model in split:
        efficiency = [r["efficiency"] for r in session.results if r.get("model") == model and "efficiency" in r]
        if efficiency:
            write(
                f"{model}: acceptance efficiency vs standard rejection sampling: median {statistics.median(efficiency):.3f} "
                f"(min {min(efficiency):.3f}, max {max(efficiency):.3f}) over {len(efficiency)} cases"
            )
    statistical = [r for r in session.results if "p_value" in r and r["df"] > 0]
    if statistical:
        failed = [r for r in statistical if not r["passed"]]
        detectable = statistics.median(r["min_detectable_tv"] for r in statistical)
        samples = sum(int(r["n"]) for r in statistical)
        early = sum(bool(r.get("stopped_early")) for r in statistical)
        write(
            f"{len(statistical)} distribution checks on {samples} emitted tokens, {len(failed)} failed "
            f"({early} stopped early); median minimum detectable TV {detectable:.3f} at power 0.99"
        )
        limited = [r for r in statistical if r.get("time_limited")]
        if limited:
            models = sorted({r["model"] for r in limited})
            write(
                f"{len(limited)} checks ran below plan on {', '.join(models)}: the implementation's own time in its "
                f"calls reached its budget (--spec-run-seconds {session.run_seconds:g} per model, shared by "
                f"planned checks); they drew {sum(r['draws'] for r in limited)} of "
                f"{sum(r['planned_draws'] for r in limited)} planned draws, and can detect a TV of "
                f"{statistics.median(r['min_detectable_tv'] for r in limited):.3f} (median) instead of "
                f"{session.tolerance:g}"
            )
    timings = [r["timing"] for r in session.results if "timing" in r]
    if timings:
        total = {key: sum(t[key] for t in timings) for key in ("inputs_s", "calls_s", "statistics_s", "total_s")}
        write(
            f"time in the properties ({total['total_s']:.1f} s of CPU): implementation calls "
            f"{total['calls_s']:.1f} s, generating inputs {total['inputs_s']:.1f} s, statistics "
            f"{total['statistics_s']:.1f} s"
        )
