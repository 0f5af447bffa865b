"""The suite as a library call, like scikit-learn's ``check_estimator``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spectest.resolve import ModelSpecError, registered


def check_verifier(
    verify: Callable[..., Any] | Any,
    *,
    name: str | None = None,
    device: str = "cpu",
    seed: int | None = None,
    budget: str = "default",
    max_tv: float | None = None,
    speed_gate: float | None = None,
    pytest_args: Sequence[str] = (),
    raise_on_failure: bool = True,
) -> int:
    """Run the whole property suite against ``verify`` (a callable or an object with ``verify``).

    Returns pytest's exit code; raises AssertionError on failures unless ``raise_on_failure`` is
    false. ``max_tv``: lossy mode (``--spec-max-tv``): output checks measure TV and fail only above
    it per token. ``speed_gate`` (``--spec-speed-gate``): the speed property also fails a pass costing
    more than that multiple of an efficient one. Extra ``pytest_args`` (``-x``, ``-k ...``) pass through. The object is registered under
    ``name`` for this process and the run resolves it like any ``--spec-model`` name.
    """
    import importlib.util

    import pytest

    label = name or getattr(verify, "__name__", type(verify).__name__)
    try:
        with registered(label, verify):
            args = ["--spec-model", label, "--spec-device", device, "--spec-budget", budget, "-p", "no:cacheprovider"]
            args += ["--spec-seed", str(seed)] if seed is not None else []
            args += ["--spec-max-tv", repr(float(max_tv))] if max_tv is not None else []
            args += ["--spec-speed-gate", repr(float(speed_gate))] if speed_gate is not None else []
            # The object lives in this process: no xdist workers, whatever the configuration says.
            args += ["-n", "0"] if importlib.util.find_spec("xdist") else []
            code = int(pytest.main([*args, *pytest_args]))
    except (ModelSpecError, ValueError) as exc:
        raise TypeError(str(exc)) from None
    if raise_on_failure and code != 0:
        raise AssertionError(f"spectest: {label} failed the property suite (pytest exit code {code})")
    return code
