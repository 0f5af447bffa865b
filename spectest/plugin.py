"""pytest plugin: ``pytest --spec-model X`` runs the spectest property suite against X.

Options, hooks and fixtures only: the run's configuration lives in :mod:`spectest.session`, the
property runner in :mod:`spectest.suite.run`, the results file and summary in
:mod:`spectest.reporting`. Loaded in every pytest run through the ``pytest11`` entry point, so it
imports nothing heavy: torch and the user's implementation are imported only when
``--spec-model`` asks for them.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from spectest import options
from spectest.session import (
    FAILURE_KEY,
    MARKER,
    MESSAGE_LIMIT,
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
    if value in (None, [], False) and name not in options.FLAGS:
        value = config.getini(name) or None
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(examples, checks, explicit=0, needs=(), cost=1): a spectest property; 'checks' statistical "
        "conclusions per Hypothesis example share the run's significance budget; a model without the "
        "capabilities it 'needs' skips it, and its checks are not counted; the costliest properties start first",
    )
    config.addinivalue_line(
        "markers", "spec_speed: the speed property (seconds on CPU; deselect with -m 'not spec_speed')"
    )
    config.addinivalue_line(
        "markers", "spec_e2e_speed: the end-to-end speed property (minutes; runs with --spec-e2e-speed only)"
    )
    worker_input = getattr(config, "workerinput", None)  # pytest-xdist worker: use the controller's seed
    try:
        session = SpecSession.from_options(
            lambda name: _option(config, name), default_seed=worker_input["spec_seed"] if worker_input else None
        )
        if session.has_subject:
            idle_threads_sleep(config)  # before anything imports torch: the models' modules may
            libraries_keep_their_asserts(config)  # before anything imports Hypothesis
        if session.interpret:
            interpret_triton()  # before --spec-model's module is imported: it may import triton
        if session.model_specs:
            session.models = _resolve_all(session.model_specs)
            if session.interpret:
                session.models = [dataclasses.replace(model, interpreted=True) for model in session.models]
        if session.engine_specs:
            session.engines = _resolve_engines(session)
        elif session.target_dir or session.draft_dir:
            raise OptionError("--spec-target/--spec-draft apply to --spec-engine, and no engine was given")
    except OptionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if session.has_subject and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(suite_dir())]  # no paths given: run the installed property suite
    if session.has_subject and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1  # see heaviest_first
    config.stash[SESSION] = session
    config.pluginmanager.register(ResultCollector(session), "spectest-results")
    if worker_input and session.has_subject:
        end_without_collecting()


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


def idle_threads_sleep(config: pytest.Config) -> None:
    """Make OpenMP's idle threads sleep, not spin (``OMP_WAIT_POLICY=PASSIVE``, unless the user set a policy): read
    once, when torch's OpenMP runtime loads, so it is set before anything imports torch, and inherited by
    pytest-xdist's workers and by engines in processes of their own; taken back when the run ends (a run inside
    the user's own process, ``pytest.main`` in a script, leaves the environment as it found it).

    A check's time budget is the implementation's CPU time, which no other process can spend. But torch's helper
    threads spin while they wait for each other, and on a busy machine one waits for another that the kernel has
    descheduled: beside two busy processes, ``-n 0`` (two threads) booked 65 s of CPU to the reference's calls
    instead of 11 s, and 9 of 17 checks stopped at their budget with a detectable TV of 0.26 instead of 0.05.
    Sleeping threads book only work: 7.5 s, no check below plan, and the same wall time when the machine is idle."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        config.add_cleanup(lambda: os.environ.pop("OMP_WAIT_POLICY", None))


LIBRARIES = ("hypothesis", "spectest", "simulators")  # imported by every property; asserts only of invariants


def libraries_keep_their_asserts(config: pytest.Config) -> None:
    """Leave the asserts of :data:`LIBRARIES` as they are written, in a run with a subject: pytest rewrites the asserts
    of every package that ships a pytest plugin (so that a plugin's own asserts explain themselves), and Hypothesis
    and a regular (not editable) install of spectest ship one. Their asserts state internal invariants, never a
    verdict (a property says what failed itself), yet each process parses, rewrites and compiles every module of
    theirs it imports: Hypothesis alone is 73 modules. Where Python may not write bytecode
    (``PYTHONDONTWRITEBYTECODE``, as on CI machines) pytest cannot cache the result, and every worker paid it at every
    start: about 1 s of a 3-4 s start on a 2-core machine. Test files, conftests and every other package are rewritten
    as before. Does nothing where pytest's assertion state is not where this version keeps it."""
    try:
        from _pytest.assertion.rewrite import assertstate_key
    except ImportError:  # a pytest that keeps it elsewhere: rewriting goes on as pytest decides
        return
    hook = getattr(config.stash.get(assertstate_key, None), "hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    if isinstance(marked, set):
        marked.difference_update(LIBRARIES)


def end_without_collecting() -> None:
    """Leave this process's objects out of the interpreter's last garbage collection (a pytest-xdist worker running
    a subject).

    The controller waits for each worker's process to end, and a process holding torch, scipy and Hypothesis spends
    about 0.5 s at exit in the interpreter's last garbage collection, over objects that die with the process anyway.
    Frozen objects are left out of it (``gc.freeze``). The freeze runs at exit, after pytest's own last collections
    (which report exceptions raised in ``__del__``), and only in workers: the process ends right after, while a run
    in the user's own process (``-n 0``, ``pytest.main`` in a script) may go on."""
    atexit.register(gc.freeze)


def interpret_triton() -> None:
    """``--spec-interpret``: Triton's interpreter for every kernel this run imports, programs batched."""
    from spectest.gpu.interpreter import InterpreterUnavailable, arrange_triton

    try:
        arrange_triton("--spec-interpret")
    except InterpreterUnavailable as exc:
        raise OptionError(str(exc)) from None


def _resolve_all(specs: list[str]) -> list[Model]:
    from spectest.resolve import ModelSpecError, resolve_model

    try:
        return [resolve_model(spec) for spec in specs]
    except ModelSpecError as exc:
        raise OptionError(str(exc)) from None


def _resolve_engines(session: SpecSession) -> list[Any]:
    from spectest.e2e.resolve import resolve_engine
    from spectest.resolve import ModelSpecError

    try:
        return [
            resolve_engine(
                spec,
                target=session.target_dir,
                draft=session.draft_dir,
                api_key=session.api_key,
                concurrency=session.concurrency,
                reference=session.reference_url,
            )
            for spec in session.engine_specs
        ]
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
    if session is None or not session.has_subject:
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
        runs = f" ({model.description})" if model.description and not model.unavailable else ""
        if model.interpreted and not model.description and not model.unavailable:
            runs = " (Triton kernels in Triton's interpreter)"
        if session.tolerance_for(model) != session.tolerance and not model.unavailable:
            runs += (
                f" (planned for TV {session.tolerance_for(model):g}: interpreted rows cost milliseconds; "
                f"--spec-tolerance {session.tolerance:g} for the budget's)"
            )
        described.append(f"{model.name}{caps}{dtypes}{ties}{lossy}{runs}{skip}")
    engines = [
        f"{e.name}{' [' + ', '.join(sorted(e.capabilities)) + ']' if e.capabilities else ''}"
        f"{''.join(f' ({name} left out: {why})' for name, why in e.left_out)}"
        f"{' (unavailable: ' + e.unavailable + ')' if e.unavailable else ''}"
        for e in session.engines
    ]
    return [
        *([f"spectest: models: {', '.join(described)}"] if described else []),
        *([f"spectest: engines: {', '.join(engines)}"] if engines else []),
        f"spectest: device: {session.device}, seed: {session.seed} (replay with --spec-seed {session.seed}), "
        f"alpha: {session.alpha:g}, budget: {session.budget.name}, tolerance: TV {session.tolerance:g}",
    ]


E2E_MODULE = "test_e2e.py"  # the suite's end-to-end properties; every other suite module checks verifiers


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """The installed suite runs the properties of what the run checks: its end-to-end module only
    with --spec-engine, its verifier modules only with --spec-model (or no subject at all)."""
    session = config.stash.get(SESSION, None)
    path = Path(str(collection_path))
    if session is None or path.suffix != ".py" or path.parent != suite_dir():
        return None
    if path.name == E2E_MODULE:
        return True if not session.engine_specs else None
    return True if session.engine_specs and not session.model_specs else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = metafunc.config.stash[SESSION]
    if "spec_model" in metafunc.fixturenames:
        # Engines alone: the verifier properties are not run (deselected at collection).
        models = [] if session.engine_specs and not session.model_specs else _session_models(metafunc.config)
        metafunc.parametrize("spec_model", models, ids=[m.name for m in models], scope="session")
    if "spec_engine" in metafunc.fixturenames:
        engines = session.engines
        metafunc.parametrize("spec_engine", engines, ids=[e.name for e in engines], scope="session")


SUBJECT_PARAMETERS = ("spec_model", "spec_engine")


def subject_of(item: pytest.Item) -> Any:
    """The model or engine a collected property runs on (None for anything else)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    found = (params[name] for name in SUBJECT_PARAMETERS if name in params)
    return next((subject for subject in found if hasattr(subject, "capabilities")), None)  # not pytest's NOTSET


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Split the significance budget over every statistical check collected for each model.

    Runs before ``-k``/``-m`` deselection, so a replay of one test uses the same per-check level.
    """
    session = config.stash[SESSION]
    counts: dict[str, int] = {}
    kept, unrun = [], []  # unrun: a property whose subjects were not asked for (its parameter set is empty)
    for item in items:
        marker = item.get_closest_marker(MARKER)
        subject = subject_of(item)
        if marker is not None and subject is None and set(SUBJECT_PARAMETERS) & set(item.fixturenames):
            unrun.append(item)
            continue
        if item.get_closest_marker("spec_e2e_speed") is not None and not session.e2e_speed:
            unrun.append(item)  # timing runs only when asked
            continue
        kept.append(item)
        if marker is not None and subject is not None:
            counts[subject.name] = counts.get(subject.name, 0) + planned_checks(
                marker.kwargs, session.budget, subject.capabilities, lossy=session.max_tv_for(subject) is not None
            )
    session.checks_per_model = counts
    if unrun:
        config.hook.pytest_deselected(items=unrun)
        items[:] = kept
    if session.has_subject:
        items[:] = heaviest_first(items)


def heaviest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The properties in the order of their declared ``cost`` (marker keyword: about the seconds the property takes
    on the reference at the default budget; default 1), heaviest first; ties keep their collection order, and tests
    that are not properties follow them in theirs.

    pytest-xdist hands its workers tests in collection order. With ``--spec-model`` or ``--spec-engine`` and no
    ``--maxschedchunk`` of the user's, the plugin sets it to 1: each worker then holds one test beyond the one it is
    running and gets the next as each ends, so the long properties start first and the short ones fill in around
    them, and the workers end together. pytest-xdist's own default sends a worker a quarter of what is left at
    once (three or four properties here), which left one worker running 2.4 s after the other in a 27 s main
    job; in file order the two longest could run back to back on one worker (5 s)."""

    def cost(item: pytest.Item) -> float:
        marker = item.get_closest_marker(MARKER)
        return float(marker.kwargs.get("cost", 1)) if marker is not None else 0.0

    return sorted(items, key=lambda item: -cost(item))


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and SESSION in session.config.stash:
        workeroutput[SPLIT_KEY] = session.config.stash[SESSION].checks_per_model


@pytest.fixture
def spec_device(request: pytest.FixtureRequest) -> Any:
    import torch

    return torch.device(request.config.stash[SESSION].device)


def _property_run(request: pytest.FixtureRequest, subject: Any, fixture: str, runner: Any) -> Any:
    """A property's run on ``subject`` (skipped, saying why, where the subject cannot run here)."""
    if subject.unavailable:
        pytest.skip(f"{subject.name} cannot run here: {subject.unavailable}")
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        raise RuntimeError(f"{request.node.nodeid} uses the '{fixture}' fixture but has no {MARKER} marker")
    return runner(request.config.stash[SESSION], subject, request.node, dict(marker.kwargs))


@pytest.fixture
def spec_e2e(request: pytest.FixtureRequest, spec_engine: Any) -> Any:
    """The running end-to-end property on an engine (see spectest.e2e.run)."""
    from spectest.e2e.run import EngineRun

    return _property_run(request, spec_engine, "spec_e2e", EngineRun)


@pytest.fixture
def spec(request: pytest.FixtureRequest, spec_model: Model) -> Any:
    """The running property: Hypothesis settings, seeds, significance level and verdicts."""
    from spectest.suite.run import PropertyRun

    return _property_run(request, spec_model, "spec", PropertyRun)


IMPLEMENTATION_FAILURES = ("rule", "statistical")  # what only the implementation can be failed by
HARNESS_ERROR_HELP = (
    "This is a fault in spectest's own code (input generation, statistics, fits or reporting), not a "
    "failure of the implementation under test: where it struck, the implementation's verdict is missing, not "
    "negative. Please report it to the spectest maintainers with this traceback, the results file (--spec-results) "
    "and the replay command."
)


def implementation_failure(exc: BaseException) -> BaseException | None:
    """The exception that fails the implementation (a broken rule or a rejecting distribution
    check), looking inside exception groups; None when the harness itself raised."""
    if getattr(exc, "kind", None) in IMPLEMENTATION_FAILURES:
        return exc
    inner_exceptions = getattr(exc, "exceptions", None)  # an exception group (Python 3.11+)
    if isinstance(inner_exceptions, (list, tuple)):
        for inner in inner_exceptions:
            found = implementation_failure(inner)
            if found is not None:
                return found
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Put into the report itself which model ran and what caught a failing property (a rule or
    a distribution check), so that both reach the results file (and the xdist controller)
    without parsing text; a rule's or check's failure shows its message, not the property's body.
    Anything else raised is the harness's own fault: a harness error, never the implementation's
    failure (``pytest_report_teststatus`` shows it as an error, the exit code is 3)."""
    funcargs = getattr(item, "funcargs", {})
    run = funcargs.get("spec", funcargs.get("spec_e2e"))
    if call.when == "call" and hasattr(run, "finish"):
        # Before the report copies the item's records. A fault here is the harness's (recorded as
        # such: exit code 3), never the property's verdict, and the records already made stand.
        run.session.guarded(f"timing record of {item.nodeid}", run.finish, None)
    outcome = yield
    report = outcome.get_result()
    subject = subject_of(item)
    if item.get_closest_marker(MARKER) is None or subject is None:
        return
    model = subject.name
    report.user_properties.append((MODEL_KEY, model))
    if call.excinfo is None or not report.failed:
        return
    exc = implementation_failure(call.excinfo.value)
    if exc is not None:
        report.user_properties.append((FAILURE_KEY, {"kind": exc.kind, "rule": str(exc.rule)}))
        path, line, _ = item.location
        report.longrepr = f"{path}:{(line or 0) + 1}: {type(exc).__name__}\n{exc}"
        return
    error = call.excinfo.value
    traceback = str(report.longrepr)
    report.user_properties.append(
        (
            FAILURE_KEY,
            {
                "kind": "harness",
                "rule": f"{type(error).__name__}: {str(error)[:300]}",
                "stage": call.when,
                "traceback": traceback[-MESSAGE_LIMIT:],
            },
        )
    )
    report.longrepr = f"spectest HARNESS ERROR while checking {model}. {HARNESS_ERROR_HELP}\n\n{traceback}"


def harness_error(report: pytest.TestReport | pytest.CollectReport) -> dict[str, Any] | None:
    # A collection report (a test file that does not import) carries no user properties, and no harness error.
    for key, value in getattr(report, "user_properties", ()):
        if key == FAILURE_KEY and value.get("kind") == "harness":
            return value
    return None


def pytest_report_teststatus(report: pytest.TestReport | pytest.CollectReport, config: pytest.Config) -> Any:
    """A harness error is reported as pytest reports errors ("E", counted as "error" in the
    summary line), never as the implementation's failure."""
    if report.failed and harness_error(report) is not None:
        return "error", "E", ("HARNESS ERROR", {"red": True})
    return None


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
        harness = (found[FAILURE_KEY] or {}).get("kind") == "harness"
        self.session.tests.append(
            {
                "model": found[MODEL_KEY],
                "property": report.nodeid.rpartition("::")[2].partition("[")[0],
                "nodeid": report.nodeid,
                "outcome": "error" if report.failed and (harness or report.when != "call") else report.outcome,
                "duration_s": report.duration,
                "message": report.longreprtext[-MESSAGE_LIMIT:] if report.failed or report.skipped else "",
                "failure": found[FAILURE_KEY],
            }
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Compute the summary, write the results file (controller only) and render the reports
        from it. A fault here is a harness error too: reported, the results file kept, exit code 3."""
        if hasattr(session.config, "workerinput"):
            return
        from spectest.reporting.results import write_run
        from spectest.reporting.summary import summary_lines

        spec_session = self.session
        if spec_session.checks_per_model:
            spec_session.summary = spec_session.guarded("summary", lambda: summary_lines(spec_session), [])
        written = spec_session.guarded("results file", lambda: write_run(spec_session), [])
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if written and reporter is not None:
            reporter.write_line(f"spectest: results written to {', '.join(written)}")
        if spec_session.harness_errors():
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is None or not (session.checks_per_model or session.harness_errors()):
        return
    terminalreporter.section("spectest")
    for line in session.summary:
        terminalreporter.write_line(line)
    for error in session.harness_errors():
        terminalreporter.write_line(f"spectest: HARNESS ERROR {error}", red=True, bold=True)
    if session.harness_errors():
        terminalreporter.write_line(f"spectest: {HARNESS_ERROR_HELP} (exit code 3)", red=True)
