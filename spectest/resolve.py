"""Turn a ``--spec-model`` string into a :class:`~spectest.protocol.Model`.

Accepted forms: a registered name (the ``spectest.models`` entry-point group, which spectest's
own implementations use exactly as third-party packages do), an object registered in this
process (:func:`registered`, how :func:`spectest.check_verifier` hands one over),
``package.module:attr``, or ``path/to/file.py:attr``. ``attr`` is a verify callable or an object
with a ``verify`` method. Every failure is a :class:`ModelSpecError` with a message meant for
the user, never a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from spectest.protocol import TREE_DRAFTING, Model, build_model
from spectest.tree_protocol import chain_view
from spectest.wheel_files import import_file

ENTRY_POINT_GROUP = "spectest.models"
IN_PROCESS: dict[str, Model] = {}  # name -> a model built from an object, for this process only
REQUIRED_PARAMETERS = ("draft_token_ids", "draft_probs", "target_probs")


class ModelSpecError(ValueError):
    """The user's --spec-model value cannot be turned into a verifier."""


def registered_models() -> dict[str, str]:
    """Every name registered through the entry-point group (spectest's own included)."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


@contextlib.contextmanager
def registered(name: str, obj: Any) -> Iterator[Model]:
    """``obj`` (a verify callable or an object with ``verify``) resolvable as ``name`` while inside."""
    model = build_model(name, name, obj, verify_callable(name, obj))
    IN_PROCESS[name] = model
    try:
        yield model
    finally:
        IN_PROCESS.pop(name, None)


def resolve_model(spec: str) -> Model:
    spec = spec.strip()
    if not spec:
        raise ModelSpecError("--spec-model got an empty value")
    if spec in IN_PROCESS:
        return IN_PROCESS[spec]
    obj, module = load_object(spec, registered_models(), option="--spec-model")
    verify = verify_callable(spec, obj)
    try:
        return build_model(display_name(spec), spec, obj, verify, module)
    except ValueError as exc:
        raise ModelSpecError(f"--spec-model {spec!r}: {exc}") from None


def load_object(spec: str, registry: dict[str, str], *, option: str) -> tuple[Any, Any]:
    """(object, its module) named by ``spec``: a name in ``registry`` (entry points), or
    ``package.module:attr``, or ``path/to/file.py:attr``; ``option`` names the flag in messages."""
    target = registry.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(registry)) or "none: is spectest installed? pip install -e ."
        raise ModelSpecError(
            f"{option} {spec!r} is not a registered name (known: {known}) and not of the form "
            "'package.module:attr' or 'path/to/file.py:attr'"
        )
    location, _, attr_path = target.rpartition(":")
    module = _load_module(spec, location, option)
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelSpecError(f"{option} {spec!r}: {location!r} has no attribute {attr_path!r}") from None
    return obj, module


def display_name(spec: str) -> str:
    """A readable test id: registered names as they are, file paths shortened to the file name."""
    location, sep, attr = spec.rpartition(":")
    if sep and location.endswith(".py"):
        return f"{Path(location).name}:{attr}"
    return spec


def _load_module(spec: str, location: str, option: str = "--spec-model") -> Any:
    try:
        if location.endswith(".py") or "/" in location or "\\" in location:
            path = Path(location).expanduser().resolve()
            if not path.is_file():
                raise ModelSpecError(f"{option} {spec!r}: no such file {str(path)!r}")
            return import_file(path, f"spectest_user_{abs(hash(str(path)))}_{path.stem}")
        return importlib.import_module(location)
    except ModelSpecError:
        raise
    except Exception as exc:
        raise ModelSpecError(f"{option} {spec!r}: importing {location!r} failed: {type(exc).__name__}: {exc}") from exc


def verify_callable(spec: str, obj: Any) -> Any:
    """The verify callable inside ``obj``, checked against the protocol's signature; for a tree
    model without one, the chain view of its ``verify_tree`` (a chain is a width-one tree)."""
    if not callable(getattr(obj, "verify", None)) and callable(getattr(obj, "verify_tree", None)):
        drafting = getattr(obj, "spectest_tree_drafting", None)
        if drafting not in TREE_DRAFTING:
            raise ModelSpecError(f"--spec-model {spec!r}: a verify_tree model must declare spectest_tree_drafting")
        return chain_view(obj.verify_tree, drafting, model=display_name(spec))
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
