"""The suite as a library call, like scikit-learn's ``check_estimator``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from spectest.plugin import SESSION, SUITE_DIR
from spectest.protocol import Model, build_model
from spectest.resolve import ModelSpecError, verify_callable


class _InjectModel:
    """Hands an already-built verifier object to the plugin instead of a --spec-model string."""

    def __init__(self, model: Model) -> None:
        self.model = model

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        session = config.stash[SESSION]
        session.model_specs = [self.model.name]
        session.models = [self.model]
        config.args = [str(SUITE_DIR)]


def check_verifier(
    verify: Callable[..., Any] | Any,
    *,
    name: str | None = None,
    device: str = "cpu",
    seed: int | None = None,
    budget: str = "default",
    pytest_args: Sequence[str] = (),
    raise_on_failure: bool = True,
) -> int:
    """Run the whole property suite against ``verify`` (a callable or an object with ``verify``).

    Returns pytest's exit code; raises AssertionError on failures unless ``raise_on_failure`` is
    false. Extra ``pytest_args`` (``-x``, ``-k ...``) pass through.
    """
    label = name or getattr(verify, "__name__", type(verify).__name__)
    try:
        callable_ = verify_callable(label, verify)
    except ModelSpecError as exc:
        raise TypeError(str(exc)) from None
    try:
        model = build_model(label, label, verify, callable_)
    except ValueError as exc:
        raise TypeError(str(exc)) from None
    args = ["--spec-device", device, "--spec-budget", budget, "-p", "no:cacheprovider", *pytest_args]
    if seed is not None:
        args += ["--spec-seed", str(seed)]
    code = int(pytest.main(args, plugins=[_InjectModel(model)]))
    if raise_on_failure and code != 0:
        raise AssertionError(f"spectest: {label} failed the property suite (pytest exit code {code})")
    return code
