"""The results file: one versioned JSON document per run, the single source of every report.

Schema ``spectest.results/1`` (validated by ``RESULTS_SCHEMA`` below, a JSON Schema):

* ``schema``: "spectest.results/1"
* ``environment``: package versions, torch and CUDA versions, device name, git commit (null when
  not in a git checkout), command line, seed, alpha, budget, tolerance, timestamp (UTC, ISO 8601),
  ``models`` [{name, source, capabilities, filter_order, sampling_params, unavailable, max_tv, dtypes,
  tie_break, draft_padding}], ``engines`` [{name, source, capabilities, filter_order, sampling_params,
  ``left_out`` {parameter: why (declared, or the server's own refusal)}, unavailable}]
  (``max_tv``: the declared lossy-mode limit per token, 1.0 for lossy without one, null for exact)
* ``tests``: one entry per (model, property): ``model``, ``property``, ``nodeid``, ``outcome``
  (passed, failed, skipped, error), ``duration_s``, ``message`` (failure text or skip reason, truncated),
  ``failure`` (null unless failed or errored: ``kind`` "rule" (an exact rule, named in ``rule``)
  or "statistical" (a distribution check, named in ``rule``): the implementation failed; or
  "harness": spectest's own code raised (the exception in ``rule``, the phase in ``stage``, the
  ``traceback``), outcome "error", and the implementation's verdict on that property is missing)
* ``harness_errors``: faults of the harness outside any test body: [{``stage`` (a property's
  timing record, summary, results file, report), ``error``, ``traceback``}] (the run's exit code is then 3)
* ``checks``: one entry per distribution check: ``model``, ``property``, ``check``, ``method``,
  ``passed``, ``statistic``, ``df``, ``p_value``, ``g_statistic``, ``log_e_value``, ``alpha``,
  ``n``, ``observed_tv``, ``tv_interval`` [low, high], ``min_detectable_tv``, ``tolerance``,
  ``planned_draws``, ``draws``, ``stopped_early``, ``worst_cells`` [[label, expected, observed]],
  ``seed``, ``duration_s``, ``context``, ``measured`` (null unless the check ran in lossy mode:
  {``limit``, ``tokens``, ``alpha``, ``mean_estimate``, ``mean_interval``, ``worst_interval``,
  ``worst_group``, ``groups``, ``passed``}, see spectest.statistics.tv)
* ``figures``: records that are reported, not judged: acceptance ``efficiency`` per case, the
  speed sweep (``speed_points``, ``break_even_predicted``, ``break_even_measured``) and, in lossy
  mode, each per-position case's ``tokens_per_call``, ``optimal_tokens_per_call`` and ``measured_tv``

The plugin writes it atomically (temporary file, then rename) once per run, on the pytest-xdist
controller only; every record reaches the controller inside the test reports.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spectest.session import SpecSession

SCHEMA = "spectest.results/1"
PACKAGES = ("spectest", "torch", "numpy", "scipy", "hypothesis", "pytest", "matplotlib", "cupy", "transformers")

_NUMBER_OR_NULL = {"type": ["number", "null"]}
RESULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "environment", "tests", "checks", "figures"],
    "properties": {
        "schema": {"const": SCHEMA},
        "environment": {
            "type": "object",
            "required": [
                "packages",
                "python",
                "device",
                "command",
                "seed",
                "alpha",
                "budget",
                "tolerance",
                "git_commit",
            ],
            "properties": {
                "packages": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
                "seed": {"type": "integer"},
                "alpha": {"type": "number"},
                "tolerance": {"type": "number"},
                "git_commit": {"type": ["string", "null"]},
                "command": {"type": "array", "items": {"type": "string"}},
                "models": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "source", "capabilities"],
                        "properties": {"capabilities": {"type": "array", "items": {"type": "string"}}},
                    },
                },
                "engines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "source", "capabilities", "sampling_params", "left_out"],
                        "properties": {
                            "capabilities": {"type": "array", "items": {"type": "string"}},
                            "sampling_params": {"type": "array", "items": {"type": "string"}},
                            "left_out": {"type": "object", "additionalProperties": {"type": "string"}},
                        },
                    },
                },
            },
        },
        "tests": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model", "property", "nodeid", "outcome", "duration_s", "message"],
                "properties": {
                    "outcome": {"enum": ["passed", "failed", "skipped", "error"]},
                    "failure": {
                        "type": ["object", "null"],
                        "required": ["kind", "rule"],
                        "properties": {
                            "kind": {"enum": ["rule", "statistical", "harness"]},
                            "rule": {"type": "string"},
                            "stage": {"type": "string"},
                            "traceback": {"type": "string"},
                        },
                    },
                },
            },
        },
        "checks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "model",
                    "property",
                    "check",
                    "passed",
                    "p_value",
                    "n",
                    "min_detectable_tv",
                    "tv_interval",
                ],
                "properties": {
                    "passed": {"type": "boolean"},
                    "p_value": {"type": "number"},
                    "n": {"type": "integer"},
                    "min_detectable_tv": {"type": "number"},
                    "log_e_value": _NUMBER_OR_NULL,
                    "tv_interval": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                },
            },
        },
        "figures": {"type": "array", "items": {"type": "object", "required": ["model", "property"]}},
        "harness_errors": {
            "type": "array",
            "items": {"type": "object", "required": ["stage", "error", "traceback"]},
        },
    },
}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def masked_command(argv: list[str]) -> list[str]:
    """The command line with secrets masked: the value of --spec-api-key, and a server URL's user,
    password and query (``openai[+dialect]:URL``, alone or as ``--spec-engine=...``)."""
    from spectest.urls import server_name

    def mask(value: str) -> str:
        scheme, _, rest = value.partition(":")
        if scheme.startswith("openai") and "://" in rest:
            declared = value.partition("#")[2]
            return server_name(value) + (f"#{declared}" if declared else "")
        return value

    out, hide_next = [], False
    for arg in argv:
        flag, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if hide_next:
            out.append("***")
        elif flag == "--spec-api-key":
            out.append(f"{flag}=***" if eq else arg)
        else:
            out.append(f"{flag}={mask(value)}" if eq else mask(arg))
        hide_next = flag == "--spec-api-key" and not eq and not hide_next
    return out


def environment(*, device: str, seed: int, alpha: float, budget: str, tolerance: float) -> dict[str, Any]:
    info: dict[str, Any] = {
        "packages": {name: _version(name) for name in PACKAGES},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device,
        "device_name": None,
        "cuda": None,
        "git_commit": _git_commit(),
        "command": masked_command(sys.argv),
        "seed": seed,
        "alpha": alpha,
        "budget": budget,
        "tolerance": tolerance,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    torch = sys.modules.get("torch")  # only describe torch if the run already imported it
    if torch is not None:
        info["cuda"] = torch.version.cuda
        if device.startswith("cuda") and torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(torch.device(device))
        else:
            info["device_name"] = platform.processor() or platform.machine()
    return info


def describe_model(model: Any) -> dict[str, Any]:
    """What the results file says about a model: its name, source and capabilities."""
    return {
        "name": model.name,
        "source": model.source,
        "capabilities": sorted(model.capabilities),
        "filter_order": list(model.filter_order),
        "sampling_params": list(model.sampling_params),
        "unavailable": model.unavailable,
        "max_tv": model.max_tv,  # declared lossy-mode limit per token (1.0: lossy, no limit); None: exact
        "dtypes": list(model.dtypes),  # probability dtypes the harness hands it
        "tie_break": model.tie_break,  # greedy rows' rule for exact ties
        "draft_padding": model.draft_padding,  # how short rows are marked (ragged-drafts models)
        "speed_gate": model.speed_gate,  # declared efficiency gate of the speed property (null: none)
    }


def describe_engine(engine: Any) -> dict[str, Any]:
    """What the results file says about an engine: its name, source, declarations, and the sampling parameters
    it does not take, each with why (declared, or the server's own refusal)."""
    return {
        "name": engine.name,
        "source": engine.source,
        "capabilities": sorted(engine.capabilities),
        "filter_order": list(engine.filter_order),
        "sampling_params": list(engine.sampling_params),
        "left_out": dict(engine.left_out),
        "unavailable": engine.unavailable,
    }


def document(
    env: dict[str, Any],
    tests: list[dict[str, Any]],
    records: list[dict[str, Any]],
    harness_errors: list[dict[str, str]] = (),
) -> dict[str, Any]:
    """The results document from the records the properties attached to their reports (each
    says its ``kind``: a distribution ``check``, or a ``figure`` that is reported, not judged)."""
    strip = lambda r: {k: v for k, v in r.items() if k != "kind"}  # noqa: E731
    checks = [strip(r) for r in records if r["kind"] == "check"]
    figures = [strip(r) for r in records if r["kind"] == "figure"]
    return {
        "schema": SCHEMA,
        "environment": env,
        "tests": tests,
        "checks": checks,
        "figures": figures,
        "harness_errors": list(harness_errors),
    }


def write_run(session: SpecSession) -> list[str]:
    """Write a finished run's results file where the options asked (``--spec-results FILE``,
    ``--spec-report DIR``), then render the report from it; the paths written."""
    if session.report_dir is None and session.results_path is None:
        return []
    env = environment(
        device=session.device,
        seed=session.seed,
        alpha=session.alpha,
        budget=session.budget.name,
        tolerance=session.tolerance,
    )
    env["models"] = [describe_model(m) for m in session.models]
    env["engines"] = [describe_engine(e) for e in session.engines]
    data = document(env, session.tests, session.records, session.stage_errors)
    written: list[str] = []
    targets = [Path(session.results_path)] if session.results_path is not None else []
    if session.report_dir is not None:
        targets.append(Path(session.report_dir) / "results.json")  # first: nothing renders before it exists
    for path in targets:
        write_atomically(path, data)
        written.append(str(path))
    if session.report_dir is not None:

        def render_report() -> list[str]:
            from spectest.reporting.report import render

            return list(map(str, render(finite(data), Path(session.report_dir))))

        rendered = session.guarded("report", render_report, None)
        if rendered is None:  # a rendering fault must not hide the results file: it records the fault
            data["harness_errors"] = list(session.stage_errors)
            for path in targets:
                write_atomically(path, data)
            written.append(f"(report rendering failed: {session.stage_errors[-1]['error']})")
        else:
            written += rendered
    return written


def finite(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become None, tuples lists, unknown objects strings."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that readers see either the old file or the complete new one."""
    data = finite(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.chmod(temporary, 0o644)  # mkstemp creates 0600; a results file is meant to be shared
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(data, stream, indent=1, allow_nan=False)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a spectest results file (schema {data.get('schema')!r}, expected {SCHEMA!r})")
    return data
