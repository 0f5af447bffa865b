"""The package's shape: imports run one way, every module imports on its own, one top-level name."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import spectest

REPO = Path(__file__).resolve().parent.parent


def modules() -> dict[str, Path]:
    """Every module of the installed package (the mapped properties and simulators included)."""
    found = {"spectest": Path(spectest.__file__)}
    for info in pkgutil.walk_packages(spectest.__path__, "spectest."):
        spec = info.module_finder.find_spec(info.name.rpartition(".")[2])  # type: ignore[union-attr]
        if spec is not None and spec.origin and not info.name.endswith("__main__"):
            found[info.name] = Path(spec.origin)
    return found


def module_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """spectest modules imported when ``name`` is imported: top-level statements only (not inside
    functions, which import lazily, nor under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets.add(base)
            targets |= {f"{base}.{alias.name}" for alias in node.names}
    return {t for t in targets if t in known and t != name}


def test_imports_run_one_way():
    """No import cycles among spectest's modules (package __init__ files that only document count too)."""
    found = modules()
    graph = {name: module_level_imports(name, path, set(found)) for name, path in found.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert "spectest.plugin" not in {t for deps in graph.values() for t in deps}, "the library imports the plugin"


def test_every_module_imports_in_a_fresh_interpreter_and_the_plugin_stays_light():
    names = sorted(modules())
    script = (
        "import importlib, sys\n"
        "import spectest.plugin\n"
        "assert 'torch' not in sys.modules, 'the pytest plugin imported torch'\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_installing_puts_no_top_level_package_but_spectest(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("spectest-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"spectest", wheel.name.split("-py")[0] + ".dist-info"}
    assert "spectest/properties/test_exactness.py" in names and "spectest/simulators/chain.py" in names
