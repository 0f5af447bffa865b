"""pytest plugin: ``pytest --spec-model X`` runs the spectest property suite against X.

Options, hooks and fixtures only: the run's configuration lives in :mod:`spectest.session`, the
property runner in :mod:`spectest.suite.run`, the results file and summary in
:mod:`spectest.reporting`. Loaded in every pytest run through the ``pytest11`` entry point, so it
imports nothing heavy: torch and the user's implementation are imported only when
``--spec-model`` asks for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from spectest import options
from spectest.session import (
    FAILURE_KEY,
    MARKER,
    MODEL_KEY,
    RECORD_KEY,
    OptionError,
    SpecSession,
    planned_checks,
    suite_dir,
)

if TYPE_CHECKING:
    from spectest.protocol import Model

SESSION = pytest.StashKey[SpecSession]()
SPLIT_KEY = "spectest_checks_per_model"  # what an xdist worker hands the controller


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_pytest_options(parser)


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    if value in (None, [], False) and name != "spec_no_shrink":
        value = config.getini(name) or None
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(examples, checks, explicit=0, needs=()): a spectest property; 'checks' statistical "
        "conclusions per Hypothesis example share the run's significance budget; a model without the "
        "capabilities it 'needs' skips it, and its checks are not counted",
    )
    config.addinivalue_line(
        "markers", "spec_speed: the speed property (seconds on CPU; deselect with -m 'not spec_speed')"
    )
    worker_input = getattr(config, "workerinput", None)  # pytest-xdist worker: use the controller's seed
    try:
        session = SpecSession.from_options(
            lambda name: _option(config, name), default_seed=worker_input["spec_seed"] if worker_input else None
        )
        if session.model_specs:
            session.models = _resolve_all(session.model_specs)
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if session.model_specs and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(suite_dir())]  # no paths given: run the installed property suite
    config.stash[SESSION] = session
    config.pluginmanager.register(ResultCollector(session), "spectest-results")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: every worker uses the controller's seed, so a printed seed replays all."""
    node.workerinput["spec_seed"] = node.config.stash[SESSION].seed


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: the controller collects nothing; the workers hand it the significance split."""
    split = getattr(node, "workeroutput", {}).get(SPLIT_KEY)
    if split:
        node.config.stash[SESSION].checks_per_model.update(split)


def _resolve_all(specs: list[str]) -> list[Model]:
    from spectest.resolve import ModelSpecError, resolve_model

    try:
        return [resolve_model(spec) for spec in specs]
    except ModelSpecError as exc:
        raise OptionError(str(exc)) from None


def _session_models(config: pytest.Config) -> list[Model]:
    session = config.stash[SESSION]
    if not session.models:  # properties collected without --spec-model: check the reference
        try:
            session.models = _resolve_all(["reference"])
        except OptionError as exc:
            raise pytest.UsageError(str(exc)) from None
    return session.models


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(SESSION, None)
    if session is None or not session.model_specs:
        return []
    from spectest.protocol import DEFAULT_DTYPES

    described = []
    for model in session.models:
        caps = f" [{', '.join(sorted(model.capabilities))}]" if model.capabilities else ""
        skip = f" (unavailable: {model.unavailable})" if model.unavailable else ""
        limit = session.max_tv_for(model)
        lossy = (
            ""
            if limit is None
            else f" (lossy: TV measured, {'limit ' + format(limit, 'g') + ' per token' if limit < 1 else 'no limit'})"
        )
        dtypes = f" (dtypes {', '.join(model.dtypes)})" if model.dtypes != DEFAULT_DTYPES else ""
        ties = f" (greedy ties: {model.tie_break})" if model.tie_break != "lowest-id" else ""
        described.append(f"{model.name}{caps}{dtypes}{ties}{lossy}{skip}")
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
        model = callspec.params["spec_model"]
        counts[model.name] = counts.get(model.name, 0) + planned_checks(
            marker.kwargs, session.budget, model.capabilities
        )
    session.checks_per_model = counts


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and SESSION in session.config.stash:
        workeroutput[SPLIT_KEY] = session.config.stash[SESSION].checks_per_model


@pytest.fixture
def spec_device(request: pytest.FixtureRequest) -> Any:
    import torch

    return torch.device(request.config.stash[SESSION].device)


@pytest.fixture
def spec(request: pytest.FixtureRequest, spec_model: Model) -> Any:
    """The running property: Hypothesis settings, seeds, significance level and verdicts."""
    from spectest.suite.run import PropertyRun

    if spec_model.unavailable:
        pytest.skip(f"{spec_model.name} cannot run here: {spec_model.unavailable}")
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        raise RuntimeError(f"{request.node.nodeid} uses the 'spec' fixture but has no {MARKER} marker")
    return PropertyRun(request.config.stash[SESSION], spec_model, request.node, dict(marker.kwargs))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Put into the report itself which model ran and what caught a failing property (a rule, a
    distribution check, or a crash), so that both reach the results file (and the xdist
    controller) without parsing text; a rule's or check's failure shows its message, not the
    property's body."""
    run = getattr(item, "funcargs", {}).get("spec")
    if call.when == "call" and hasattr(run, "finish"):
        run.finish()  # before the report copies the item's records
    outcome = yield
    report = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    if item.get_closest_marker(MARKER) is None or callspec is None or "spec_model" not in callspec.params:
        return
    report.user_properties.append((MODEL_KEY, callspec.params["spec_model"].name))
    if call.excinfo is None or not report.failed:
        return
    exc = call.excinfo.value
    kind = getattr(exc, "kind", None)
    if kind in ("rule", "statistical"):
        report.user_properties.append((FAILURE_KEY, {"kind": kind, "rule": str(exc.rule)}))
        path, line, _ = item.location
        report.longrepr = f"{path}:{(line or 0) + 1}: {type(exc).__name__}\n{exc}"
    else:
        report.user_properties.append(
            (FAILURE_KEY, {"kind": "crash", "rule": f"{type(exc).__name__}: {str(exc)[:300]}"})
        )


class ResultCollector:
    """Gathers records and outcomes from test reports (on the xdist controller too: reports travel)."""

    def __init__(self, session: SpecSession) -> None:
        self.session = session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = dict.fromkeys((MODEL_KEY, FAILURE_KEY))
        for key, value in report.user_properties:
            if key == RECORD_KEY and report.when == "call":
                self.session.records.append(value)
            elif key in found:
                found[key] = value
        if found[MODEL_KEY] is None or not (report.when == "call" or report.outcome != "passed"):
            return
        self.session.tests.append(
            {
                "model": found[MODEL_KEY],
                "property": report.nodeid.rpartition("::")[2].partition("[")[0],
                "nodeid": report.nodeid,
                "outcome": "error" if report.when != "call" and report.failed else report.outcome,
                "duration_s": report.duration,
                "message": report.longreprtext[-8000:] if report.failed else "",
                "failure": found[FAILURE_KEY],
            }
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the results file (controller only) and render the reports from it."""
        if hasattr(session.config, "workerinput"):
            return
        from spectest.reporting.results import write_run

        written = write_run(self.session)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if written and reporter is not None:
            reporter.write_line(f"spectest: results written to {', '.join(written)}")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is None or not session.checks_per_model:
        return
    from spectest.reporting.summary import summary_lines

    terminalreporter.section("spectest")
    for line in summary_lines(session):
        terminalreporter.write_line(line)
