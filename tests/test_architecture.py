"""The package's shape: imports run one way, every module imports on its own, one top-level name.

Every import counts: at the top of a module, inside a function (a lazy import is still a dependency), and under
``if TYPE_CHECKING`` (an annotation that names a class is a dependency on its module). The house is read at every
depth: modules, and at each folder the rooms it holds (a subfolder counts as one room); no two rooms at any depth
may depend on each other, so every folder's rooms stand on floors and no arrow runs back up.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import spectest

REPO = Path(__file__).resolve().parent.parent
MAPPED = ("spectest.properties", "spectest.simulators")  # installed inside spectest from top-level folders


def modules() -> dict[str, Path]:
    """Every module of the installed package (the mapped properties and simulators included)."""
    found = {"spectest": Path(spectest.__file__)}
    # The mapped folders (properties/, simulators/) live outside spectest/: an editable install's finder knows
    # them, the folder walk does not.
    roots = [(spectest.__path__, "spectest.")]
    for mapped in MAPPED:
        spec = importlib.util.find_spec(mapped)
        assert spec is not None and spec.origin and spec.submodule_search_locations, f"{mapped} is not installed"
        found[mapped] = Path(spec.origin)
        roots.append((spec.submodule_search_locations, mapped + "."))
    for path, prefix in roots:
        for info in pkgutil.walk_packages(path, prefix):
            spec = info.module_finder.find_spec(info.name.rpartition(".")[2])  # type: ignore[union-attr]
            if spec is not None and spec.origin and not info.name.endswith("__main__"):
                found[info.name] = Path(spec.origin)
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """spectest modules that ``name`` imports anywhere in its source: at the top, inside functions, under
    ``if TYPE_CHECKING``. ``from package import module`` counts as importing the module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets.add(base)
            targets |= {f"{base}.{alias.name}" for alias in node.names}
    return {t for t in targets if t in known and t != name}


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its nodes in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def rooms(graph: dict[str, set[str]], folder: str) -> dict[str, set[str]]:
    """The arrows between the rooms of ``folder`` (a package): each module under it belongs to the room it lies
    in, a direct child module or subfolder; an arrow joins two rooms when a module of one imports one of the other.
    The folder's own ``__init__`` is no room (it only documents or re-exports)."""

    def room(module: str) -> str | None:
        if not module.startswith(folder + "."):
            return None
        return folder + "." + module[len(folder) + 1 :].split(".")[0]

    arrows: dict[str, set[str]] = {}
    for source, targets in graph.items():
        start = room(source)
        if start is None:
            continue
        arrows.setdefault(start, set())
        for target in targets:
            end = room(target)
            if end is not None and end != start:
                arrows[start].add(end)
    return arrows


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle, read at every depth: between modules, and between the rooms of each folder."""
    problems = []
    if (cycle := find_cycle(graph)) is not None:
        problems.append("modules: " + " -> ".join(cycle))
    folders = sorted({name.rpartition(".")[0] for name in graph if "." in name})
    for folder in folders:
        if (cycle := find_cycle(rooms(graph, folder))) is not None:
            problems.append(f"rooms of {folder}: " + " -> ".join(cycle))
    return problems


def test_imports_run_one_way_at_every_depth():
    """No cycle among spectest's modules, nor among the rooms of any of its folders, reading every import."""
    graph = import_graph(modules())
    assert back_arrows(graph) == []
    assert "spectest.plugin" not in {t for deps in graph.values() for t in deps}, "the library imports the plugin"


def test_a_planted_function_level_back_import_is_found(tmp_path):
    """A copy of the package with one lazy import from a low floor to a high one (inside a function, where the
    old top-level-only reading looked away) fails the check, naming both rooms."""
    found = modules()
    copied = {}
    for name, path in found.items():
        copy = tmp_path / (name.replace(".", "/") + ("/__init__.py" if path.name == "__init__.py" else ".py"))
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
        copied[name] = copy
    assert back_arrows(import_graph(copied)) == []
    options = copied["spectest.options"]
    options.write_text(options.read_text() + "\n\ndef _planted():\n    from spectest.plugin import main  # noqa\n")
    problems = back_arrows(import_graph(copied))
    assert any("spectest.options" in p and "spectest.plugin" in p for p in problems), problems
    planted = copied["spectest.sampling"]
    planted.write_text(
        planted.read_text() + "\nif TYPE_CHECKING:\n    from spectest.e2e.protocol import EngineModel  # noqa\n"
    )
    problems = back_arrows(import_graph(copied))
    assert any(p.startswith("rooms of spectest:") and "spectest.e2e" in p for p in problems), problems


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
    assert "spectest/gpu/cuda/chain.cu" in names, "reference-cupy compiles its CUDA source on first use"


def floors(arrows: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 for a room that imports no other, else one above the highest room it imports."""
    memo: dict[str, int] = {}

    def floor(room: str) -> int:
        if room not in memo:
            memo[room] = 1 + max((floor(other) for other in arrows.get(room, ())), default=0)
        return memo[room]

    return {room: floor(room) for room in arrows}


def test_the_architecture_page_draws_the_floors_the_imports_give():
    """docs/explanation/architecture.md's floor table is the house as the imports build it: every room of
    spectest/ on its floor, none missing, none extra."""
    graph = import_graph(modules())
    computed = {room.removeprefix("spectest."): floor for room, floor in floors(rooms(graph, "spectest")).items()}
    page = (REPO / "docs" / "explanation" / "architecture.md").read_text()
    section = page.split("## The floors", 1)[1]
    table = section[section.index("| floor |") :].split("\n\n", 1)[0]
    drawn = {}
    for line in table.splitlines()[2:]:
        floor, names = (cell.strip() for cell in line.strip("|").split("|"))
        for name in names.split(","):
            drawn[name.strip().strip("`").rstrip("/")] = int(floor)
    assert drawn == computed, {room: (drawn.get(room), computed.get(room)) for room in drawn.keys() | computed.keys()}


def defined_names(path: Path) -> set[str] | None:
    """Names a module binds at its top level (in ``if``/``try``/``with`` blocks too); None when it has a
    module-level ``__getattr__`` (then any name may exist)."""
    names: set[str] = set()

    def bound(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                bound(element)
        elif isinstance(target, ast.Starred):
            bound(target.value)

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bound(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                bound(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text()).body)
    return None if "__getattr__" in names else names


def missing_names(path: Path, name: str | None, found: dict[str, Path]) -> list[str]:
    """Every name ``path`` reads from a spectest module that the module does not define: ``from M import x``
    and ``M.x`` on a name bound to module M, at any depth (a function's lazy import included). Such a read
    fails only when it runs, and the code that runs it may need an engine CI's main environment lacks."""
    tree = ast.parse(path.read_text())
    package = None if name is None else (name if path.name == "__init__.py" else name.rpartition(".")[0])
    cache: dict[str, set[str] | None] = {}

    def exists(module: str, attr: str) -> bool:
        if attr.startswith("__") or f"{module}.{attr}" in found:
            return True
        if module not in cache:
            cache[module] = defined_names(found[module])
        names = cache[module]
        return names is None or attr in names

    aliases: dict[str, str] = {}  # a local name bound to a spectest module (the whole file is one scope: close enough)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in found:
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "spectest"
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level and package is not None:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base not in found:
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                if f"{base}.{alias.name}" in found:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                elif not exists(base, alias.name):
                    problems.append(f"{path}:{node.lineno}: from {base} import {alias.name}")
    # A module's local name that is also bound to something else somewhere in the file (an assignment, an
    # argument) is left alone: which binding an attribute read sees would need scopes.
    rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    rebound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.value.id not in rebound
        ):
            module = aliases[node.value.id]
            if not exists(module, node.attr):
                problems.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr} ({module} has no {node.attr})")
    return problems


def checked_files(found: dict[str, Path]) -> dict[Path, str | None]:
    """The package's modules, and every Python file of the repository that uses them (tests, benchmarks,
    examples, CI scripts): much of it runs only in an engine's environment, never in README line 2."""
    files: dict[Path, str | None] = {path.resolve(): name for name, path in found.items()}
    for folder in ("tests", "benchmarks", "examples", ".ci"):
        for path in sorted((REPO / folder).rglob("*.py")):
            files.setdefault(path.resolve(), None)
    files.setdefault((REPO / "conftest.py").resolve(), None)
    return files


def test_every_name_read_from_a_spectest_module_exists():
    """A move that leaves a caller behind fails here, not in the one engine tier that runs the caller (stop 49: the
    OpenVINO adapter still read ``tiny_pair.request_seed`` after it moved to ``spectest.e2e.cases``; only CI's
    OpenVINO tier, half an hour in, ran that line)."""
    found = modules()
    problems = [p for path, name in checked_files(found).items() for p in missing_names(path, name, found)]
    assert problems == [], "\n".join(problems)


def test_a_name_left_behind_by_a_move_is_found(tmp_path):
    found = modules()
    caller = tmp_path / "caller.py"
    caller.write_text(
        "from spectest.e2e import tiny_pair\n"
        "from spectest.e2e.cases import request_seed\n\n\n"
        "def configs(params, row, seed):\n"
        "    from spectest.e2e.tiny_pair import request_seed as moved  # noqa\n\n"
        "    return tiny_pair.request_seed(params, row, seed), request_seed(params, row, seed), tiny_pair.VOCAB\n"
    )
    problems = missing_names(caller, None, found)
    assert len(problems) == 2, problems
    assert "from spectest.e2e.tiny_pair import request_seed" in problems[0]
    assert "tiny_pair.request_seed (spectest.e2e.tiny_pair has no request_seed)" in problems[1]
