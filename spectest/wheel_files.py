"""One file of an installed package, imported as a module of its own.

Several samplers spectest gates live in packages whose ``__init__`` pulls far more than the sampler needs (SGLang's
server, EAGLE's and Medusa's chat front ends with their pinned gradio, openai and protobuf), while the file holding
the sampler imports only torch, triton or transformers. Installing such a wheel with ``pip install --no-deps`` and
importing that one file by path runs the published code, unchanged, without the rest. Nothing of the package's own
``__init__`` runs, so the module must not use relative imports (the adapters check the names they call at load).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def package_file(package: str, *parts: str) -> Path | None:
    """The path of ``parts`` inside the installed ``package`` (found without importing it), or None."""
    found = importlib.util.find_spec(package)
    roots = list(found.submodule_search_locations or []) if found else []
    return next((path for root in roots if (path := Path(root).joinpath(*parts)).is_file()), None)


def import_file(path: Path, module_name: str) -> ModuleType:
    """The Python file at ``path`` imported as ``module_name``, once a process (registered before it runs, as an
    import would be; a failed import leaves nothing behind)."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_package_file(package: str, parts: tuple[str, ...], module_name: str, needs: tuple[str, ...]) -> ModuleType:
    """``package``'s file ``parts`` imported alone as ``module_name`` (once a process; a failed import leaves
    nothing behind). Raises ModuleNotFoundError naming what is missing when the file, or any of the names
    ``needs``, is not there: an installed version that moved or renamed the sampler."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = package_file(package, *parts)
    if path is None:
        raise ModuleNotFoundError(f"this {package} has no {'/'.join(parts)}")
    module = import_file(path, module_name)
    absent = [name for name in needs if not hasattr(module, name)]
    if absent:
        del sys.modules[module_name]
        raise ModuleNotFoundError(f"this {package}'s {'/'.join(parts)} has no {', '.join(absent)}")
    return module
