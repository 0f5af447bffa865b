"""Turn a ``--spec-engine`` string into an :class:`~spectest.e2e.protocol.EngineModel`.

Resolved like ``--spec-model``: a name registered in the ``spectest.engines`` entry-point group
(spectest's own adapters are registered there exactly as a third party's would be),
``package.module:attr`` or ``path/to/file.py:attr``. Every failure is a
:class:`~spectest.resolve.ModelSpecError` with a message meant for the user.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from spectest.e2e.protocol import EngineModel, build_engine
from spectest.resolve import ModelSpecError, display_name, load_object
from spectest.urls import is_server_spec, server_name

ENTRY_POINT_GROUP = "spectest.engines"
OPTION = "--spec-engine"


def registered_engines() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def resolve_engine(
    spec: str,
    *,
    target: str | None = None,
    draft: str | None = None,
    api_key: str | None = None,
    concurrency: int = 16,
    reference: str | None = None,
) -> EngineModel:
    """The engine ``spec`` names; ``target``/``draft``: local checkpoints for adapters that load
    models (``--spec-target``, ``--spec-draft``), handed to the object's ``with_checkpoints``. A
    server URL (``openai[+dialect]:URL``) becomes a ``ServerEngine`` scored with them, and compared
    with ``reference`` (``--spec-reference-url``), its twin without speculation, if given."""
    spec = spec.strip()
    if not spec:
        raise ModelSpecError(f"{OPTION} got an empty value")
    if is_server_spec(spec):
        from spectest.e2e.engines.openai_server import ServerEngine

        try:
            server = ServerEngine(
                spec, target=target, draft=draft, api_key=api_key, concurrency=concurrency, reference=reference
            )
            return build_engine(server.name, server.name, server)
        except (ValueError, OSError, ModelSpecError) as exc:
            raise ModelSpecError(f"{OPTION} {server_name(spec)!r}: {exc}") from None
    if reference is not None:
        raise ModelSpecError(f"--spec-reference-url applies to server engines (openai:URL), not to {spec!r}")
    obj, module = load_object(spec, registered_engines(), option=OPTION)
    if target is not None or draft is not None:
        obj = _with_checkpoints(spec, obj, target, draft)
    try:
        return build_engine(display_name(spec), spec, obj, module)
    except ValueError as exc:
        raise ModelSpecError(f"{OPTION} {spec!r}: {exc}") from None


def _with_checkpoints(spec: str, obj: Any, target: str | None, draft: str | None) -> Any:
    loader = getattr(obj, "with_checkpoints", None)
    if not callable(loader):
        raise ModelSpecError(
            f"--spec-target/--spec-draft: {OPTION} {spec!r} does not load checkpoints (no with_checkpoints method)"
        )
    try:
        return loader(target=target, draft=draft)
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"--spec-target/--spec-draft for {spec!r}: {exc}") from None
