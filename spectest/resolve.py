"""Turn a ``--spec-model`` string into a :class:`~spectest.protocol.Model`.

Accepted forms: a registered name (built-ins, plus the ``spectest.models`` entry-point group
that third-party packages use), ``package.module:attr``, or ``path/to/file.py:attr``. ``attr``
is a verify callable or an object with a ``verify`` method. Every failure is a
:class:`ModelSpecError` with a message meant for the user, never a traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from spectest.protocol import Model, build_model

ENTRY_POINT_GROUP = "spectest.models"
BUILTIN_MODELS = {
    "reference": "spectest.reference:REFERENCE",
    # Engines' samplers (optional packages; they skip, saying why, where the package or GPU is missing).
    "transformers": "spectest.extra.engines:TRANSFORMERS",
    "flashinfer": "spectest.extra.engines:FLASHINFER",
    "vllm": "spectest.extra.engines:VLLM",
    # The fused Triton kernel (CUDA, or Triton's CPU interpreter with TRITON_INTERPRET=1).
    "reference-triton": "spectest.extra.triton_reference:TRITON_REFERENCE",
}
REQUIRED_PARAMETERS = ("draft_token_ids", "draft_probs", "target_probs")


class ModelSpecError(ValueError):
    """The user's --spec-model value cannot be turned into a verifier."""


def registered_models() -> dict[str, str]:
    """Built-in names plus every name registered through the entry-point group."""
    names = dict(BUILTIN_MODELS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


def resolve_model(spec: str) -> Model:
    spec = spec.strip()
    if not spec:
        raise ModelSpecError("--spec-model got an empty value")
    registry = registered_models()
    target = registry.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(registry))
        raise ModelSpecError(
            f"--spec-model {spec!r} is not a registered name (known: {known}) and not of the form "
            "'package.module:attr' or 'path/to/file.py:attr'"
        )
    location, _, attr_path = target.rpartition(":")
    module = _load_module(spec, location)
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelSpecError(f"--spec-model {spec!r}: {location!r} has no attribute {attr_path!r}") from None
    verify = verify_callable(spec, obj)
    try:
        return build_model(display_name(spec), spec, obj, verify, module)
    except ValueError as exc:
        raise ModelSpecError(f"--spec-model {spec!r}: {exc}") from None


def display_name(spec: str) -> str:
    """A readable test id: registered names as they are, file paths shortened to the file name."""
    location, sep, attr = spec.rpartition(":")
    if sep and location.endswith(".py"):
        return f"{Path(location).name}:{attr}"
    return spec


def _load_module(spec: str, location: str) -> Any:
    try:
        if location.endswith(".py") or "/" in location or "\\" in location:
            path = Path(location).expanduser().resolve()
            if not path.is_file():
                raise ModelSpecError(f"--spec-model {spec!r}: no such file {str(path)!r}")
            module_name = f"spectest_user_{abs(hash(str(path)))}_{path.stem}"
            if module_name in sys.modules:
                return sys.modules[module_name]
            file_spec = importlib.util.spec_from_file_location(module_name, path)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[module_name] = module
            try:
                file_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
            return module
        return importlib.import_module(location)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(
            f"--spec-model {spec!r}: importing {location!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def verify_callable(spec: str, obj: Any) -> Any:
    """The verify callable inside ``obj``, checked against the protocol's signature."""
    verify = obj if inspect.isfunction(obj) or inspect.isbuiltin(obj) else getattr(obj, "verify", obj)
    if not callable(verify):
        raise ModelSpecError(
            f"--spec-model {spec!r} is a {type(obj).__name__}, neither a verify callable nor an object "
            "with a verify method"
        )
    try:
        signature = inspect.signature(verify)
    except (TypeError, ValueError):
        return verify  # builtins and some extension callables have no signature: trust them
    try:
        signature.bind(*REQUIRED_PARAMETERS, generator=None)
    except TypeError as exc:
        raise ModelSpecError(
            f"--spec-model {spec!r}: {getattr(verify, '__qualname__', verify)!r}{signature} cannot be called as "
            f"verify(draft_token_ids, draft_probs, target_probs, generator=gen): {exc}"
        ) from None
    return verify
