"""Branches on values that differ between a group's programs, taken by every program at once under a predicate, as a
GPU's compiler lowers a divergent branch: the batched interpreter's answer to data-dependent control flow.

:mod:`spectest.gpu.interpreter` runs a launch's programs side by side. A Python ``if`` on a value the programs
disagree on cannot be taken one way; restarting the group once per value (its fallback) is exact but pays the
kernel's prefix again at every split, and a loop over vocabulary tiles that keeps a running maximum
(``if local_max > max_val: ...``, vLLM's recovered-token kernel) splits a group at every tile: at V = 131072, 548 ms a
row, slower than running the programs one by one. So the kernel's source is rewritten, before the interpreter's own
rewrite, so that such a branch runs both ways:

* ``if T: A else: B``: where the (active) programs agree on ``T``, as written. Where they disagree, ``A`` runs with
  only the programs where ``T`` holds enabled (their loads and stores masked by it), then ``B`` with the others, and
  every name either assigns takes, program by program, the value of the branch that program took.
* ``while T: A``: each pass runs ``A`` for the programs whose ``T`` still holds; a program whose ``T`` failed once is
  done (its names keep their values).
* ``A and B``, ``A or B``, ``not A``, ``A if T else B`` on disagreeing values: both sides, the second under the
  predicate, combined elementwise, as compiled Triton combines them.

A branch whose body can leave it (``return``, or a ``break`` or ``continue`` of a loop outside it) is left as written:
the restart handles it. So does a merge the rewrite cannot make exactly (a name bound to values of different types or
shapes in the two branches, or to Python objects that differ): it raises :class:`Diverged`
and the group is rerun one part per value. What a disabled program computes inside a branch is thrown away and never
stored, so each program's values and stores are what it makes running alone.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


class Diverged(BaseException):  # a control-flow signal: no `except Exception` in kernel code catches it
    """The programs of a group took different values at a branch: ``values`` [programs], one per program
    (raised here and by :mod:`spectest.gpu.interpreter`, which reruns the group split)."""

    def __init__(self, values: np.ndarray) -> None:
        super().__init__("programs diverged")
        self.values = values


HELPERS = "_spectest_batch"  # the name the rewritten kernels call these helpers by (put in the kernel's globals)
_MISSING = object()


class Predicate:
    """The programs enabled in the branch being run: a bool array [programs] (None: all of them)."""

    def __init__(self) -> None:
        self.stack: list[np.ndarray] = []

    @property
    def active(self) -> np.ndarray | None:
        return self.stack[-1] if self.stack else None

    def reset(self) -> None:
        self.stack.clear()

    @contextlib.contextmanager
    def under(self, enabled: np.ndarray) -> Iterator[None]:
        current = self.active
        self.stack.append(enabled if current is None else np.logical_and(current, enabled))
        try:
            yield
        finally:
            self.stack.pop()


PREDICATE = Predicate()


def active_values(values: np.ndarray) -> np.ndarray:
    """``values`` [programs] (or [1]) at the enabled programs only."""
    active = PREDICATE.active
    if active is None or values.size == 1:
        return values
    return values[np.broadcast_to(active, values.shape)]


# ----------------------------------------------------------------------------------------------------------------
# Runtime helpers the rewritten kernels call


def _is_tensor(value: Any) -> bool:
    if isinstance(value, Conflicted):
        return False
    return hasattr(value, "handle") and hasattr(value, "type") and hasattr(value.handle, "data")


def _truths(value: Any) -> np.ndarray:
    """Each program's truth of a tensor (a block of more than one element is true, as the interpreter has it)."""
    data = value.handle.data
    numel = data.size // data.shape[-1]
    if value.type.is_block() and numel != 1:
        return np.ones((1,), dtype=bool)
    return data.reshape(-1).astype(bool)


def decides(value: Any) -> bool:
    """Whether Python can take this branch as written: not a tensor, or one the enabled programs agree on."""
    if not _is_tensor(value):
        return True
    enabled = active_values(_truths(value))
    return enabled.size == 0 or bool(enabled.all()) or not bool(enabled.any())


def under(condition: Any, negate: bool = False) -> contextlib.AbstractContextManager[None]:
    truths = condition if isinstance(condition, np.ndarray) else _truths(condition)
    return PREDICATE.under(~truths if negate else truths)


def bound(scope: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: scope[name] for name in names if name in scope}


def select(condition: Any, taken: dict[str, Any], other: dict[str, Any], name: str) -> Any:
    """``name``'s value program by program: from ``taken`` where ``condition`` holds, else from ``other``."""
    a, b = taken.get(name, _MISSING), other.get(name, _MISSING)
    if a is _MISSING:
        return b
    if b is _MISSING or a is b:
        return a
    truths = condition if isinstance(condition, np.ndarray) else _truths(condition)
    # Where the enabled programs all took one side, its value serves them all (a disabled program's is thrown away):
    # a name a loop pass assigns, merged where every program was still looping, is no conflict to split over.
    enabled = active_values(truths)
    if enabled.size and enabled.all():
        return a
    if enabled.size and not enabled.any():
        return b
    if isinstance(a, Conflicted) or isinstance(b, Conflicted):
        return Conflicted(truths)
    if _is_tensor(a) and _is_tensor(b):
        if a.handle.dtype == b.handle.dtype and a.type == b.type:
            return _where(truths, a, b)
    elif not _is_tensor(a) and not _is_tensor(b) and _same(a, b):
        return a
    return Conflicted(truths)


class Conflicted:
    """A name the two sides of a divergent branch bound to values no one value can hold (a block of another shape or
    type, Python objects that differ): harmless while nothing reads it (a tile's mask that the next loop assigns
    again), and :class:`Diverged` the moment anything does, so the group reruns split."""

    def __init__(self, truths: np.ndarray) -> None:
        object.__setattr__(self, "_truths", truths)

    def _diverge(self, *args: Any, **kwargs: Any) -> Any:
        raise Diverged(object.__getattribute__(self, "_truths"))

    def __getattr__(self, name: str) -> Any:
        return self._diverge()

    __repr__ = __str__ = __format__ = __bool__ = __index__ = __int__ = __float__ = __len__ = __iter__ = _diverge
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _diverge
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __and__ = __rand__ = __or__ = __ror__ = _diverge
    __xor__ = __rxor__ = __lshift__ = __rshift__ = __neg__ = __invert__ = __getitem__ = __call__ = _diverge
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = __pow__ = __rpow__ = __matmul__ = _diverge
    __hash__ = None  # type: ignore[assignment]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _where(truths: np.ndarray, a: Any, b: Any) -> Any:
    """``a`` where ``truths`` holds, else ``b``, made when first read: most names a branch assigns are dead after
    it (a tile's offsets, mask and values, assigned again before the next read), and a merge of a block costs a
    pass over programs x block elements."""
    from triton.runtime.interpreter import TensorHandle

    class Merged(TensorHandle):
        def __init__(self) -> None:  # the dataclass's fields, without its eager data
            self.dtype = a.handle.dtype
            self.attr = dict(a.handle.attr)
            self._data: np.ndarray | None = None

        @property
        def data(self) -> np.ndarray:
            if self._data is None:
                self._data = np.where(truths, a.handle.data, b.handle.data)
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = value

    return type(a)(Merged(), a.type)


def _logical(op: Callable[..., np.ndarray], *truths: np.ndarray) -> Any:
    from triton.runtime.interpreter import TensorHandle, tl

    return tl.core.tensor(TensorHandle(op(*truths), tl.int1), tl.int1)


def both(*parts: Callable[[], Any]) -> Any:
    """``A and B and ...``: as Python has it where the enabled programs agree, elementwise where they do not."""
    value = parts[0]()
    combined: np.ndarray | None = None
    for part in parts[1:]:
        if combined is None:
            if decides(value):
                if not _python_truth(value):
                    return value
                value = part()
                continue
            combined = _truths(value)
        with PREDICATE.under(combined):
            following = part()
        combined = np.logical_and(combined, _truths(following) if _is_tensor(following) else bool(following))
    return value if combined is None else _logical(np.asarray, combined)


def either(*parts: Callable[[], Any]) -> Any:
    """``A or B or ...``: as Python has it where the enabled programs agree, elementwise where they do not."""
    value = parts[0]()
    combined: np.ndarray | None = None
    for part in parts[1:]:
        if combined is None:
            if decides(value):
                if _python_truth(value):
                    return value
                value = part()
                continue
            combined = _truths(value)
        with PREDICATE.under(~combined):
            following = part()
        combined = np.logical_or(combined, _truths(following) if _is_tensor(following) else bool(following))
    return value if combined is None else _logical(np.asarray, combined)


def negation(value: Any) -> Any:
    """``not A``."""
    if decides(value):
        return not _python_truth(value)
    return _logical(np.logical_not, _truths(value))


def choose(condition: Any, taken: Callable[[], Any], other: Callable[[], Any]) -> Any:
    """``A if T else B``."""
    if decides(condition):
        return taken() if _python_truth(condition) else other()
    truths = _truths(condition)
    with PREDICATE.under(truths):
        a = taken()
    with PREDICATE.under(~truths):
        b = other()
    return select(truths, {"value": a}, {"value": b}, "value")


def _python_truth(value: Any) -> bool:
    if not _is_tensor(value):
        return bool(value)
    enabled = active_values(_truths(value))
    return bool(enabled[0]) if enabled.size else bool(_truths(value)[0])


def still(live: np.ndarray | None, condition: Any) -> np.ndarray:
    """A predicated loop's programs still looping: those whose condition held at every pass so far."""
    truths = _truths(condition) if _is_tensor(condition) else np.array([bool(condition)])
    return truths if live is None else np.logical_and(live, truths)


class Loop:
    """A ``range`` whose bounds differ between the enabled programs: pass ``k`` gives each program its own
    ``start + k * step`` and enables the programs whose own range has a ``k``-th value."""

    def __init__(self, bounds: list[np.ndarray]) -> None:
        start, stop, step = bounds
        self.start, self.step = start, step
        self.trips = np.maximum(0, -((start - stop) // step))  # ceil((stop - start) / step), per program
        self.passes = int(active_values(self.trips).max(initial=0))

    def value(self, k: int) -> Any:
        from triton.runtime.interpreter import TensorHandle, tl

        data = (self.start + k * self.step).astype(np.int32)
        return tl.core.tensor(TensorHandle(data, tl.int32), tl.int32)

    def live(self, k: int) -> np.ndarray:
        return self.trips > k


def loop(*args: Any) -> range | Loop:
    """``range(*args)`` where the enabled programs agree on its bounds (as the interpreter has it), else a
    :class:`Loop` over the programs' own ranges."""
    if not any(_is_tensor(arg) for arg in args):
        return range(*args)
    values = [arg.handle.data.reshape(-1).astype(np.int64) if _is_tensor(arg) else np.array([int(arg)]) for arg in args]
    if len(values) == 1:
        values = [np.zeros(1, dtype=np.int64), values[0]]
    if len(values) == 2:
        values.append(np.ones(1, dtype=np.int64))
    if all(np.unique(active_values(v)).size <= 1 for v in values):
        return range(*(int(active_values(v)[0]) if active_values(v).size else int(v[0]) for v in values))
    step = active_values(values[2])
    if np.unique(step).size != 1 or int(step[0]) <= 0:
        return range(*args)  # a step the programs disagree on, or not positive: the interpreter's own, which splits
    return Loop(values)


def finished(live: np.ndarray) -> bool:
    return not bool(active_values(live).any())


def all_live(live: np.ndarray) -> bool:
    return bool(active_values(live).all())


# ----------------------------------------------------------------------------------------------------------------
# The rewrite


def _leaves(statements: list[ast.stmt], *, in_loop: bool = False) -> bool:
    """Whether control can leave ``statements`` other than at their end: a return or yield anywhere (outside nested
    functions), a break or continue of a loop that encloses them."""
    for statement in statements:
        for node in _walk_same_function(statement):
            if isinstance(node, ast.Return | ast.Yield | ast.YieldFrom | ast.Global | ast.Nonlocal):
                return True
        if _escapes_loop(statement, in_loop):
            return True
    return False


def _walk_same_function(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield from _walk_same_function(child)


def _escapes_loop(node: ast.AST, in_loop: bool) -> bool:
    if isinstance(node, ast.Break | ast.Continue):
        return not in_loop
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
        return False
    if isinstance(node, ast.For | ast.While):
        return any(_escapes_loop(child, True) for child in node.body) or any(
            _escapes_loop(child, in_loop) for child in node.orelse
        )
    return any(_escapes_loop(child, in_loop) for child in ast.iter_child_nodes(node))


def _stored_names(statements: list[ast.stmt]) -> tuple[str, ...]:
    names: set[str] = set()
    for statement in statements:
        for node in _walk_same_function(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return tuple(sorted(name for name in names if not name.startswith("_spectest_")))


def _call(helper: str, *args: ast.expr) -> ast.Call:
    return ast.Call(
        func=ast.Attribute(value=ast.Name(id=HELPERS, ctx=ast.Load()), attr=helper, ctx=ast.Load()),
        args=list(args),
        keywords=[],
    )


def _thunk(expression: ast.expr) -> ast.Lambda:
    arguments = ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[], kw_defaults=[], defaults=[])
    return ast.Lambda(args=arguments, body=expression)


def _keep(name: str, value: ast.expr) -> ast.AnnAssign:
    """``name: object = value``: an annotated assignment, which the interpreter's own rewrite (of plain ones, into
    tensors) leaves alone."""
    return ast.AnnAssign(
        target=ast.Name(id=name, ctx=ast.Store()),
        annotation=ast.Name(id="object", ctx=ast.Load()),
        value=value,
        simple=1,
    )


def _load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def _locals() -> ast.Call:
    return ast.Call(func=_load("locals"), args=[], keywords=[])


class Predication(ast.NodeTransformer):
    """The rewrite the module docstring describes, of one ``@triton.jit`` function's source."""

    def __init__(self) -> None:
        self.counter = itertools.count()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        if getattr(self, "_inside", False):
            return node  # a nested function: left as written
        self._inside = True
        try:
            self.generic_visit(node)
        finally:
            self._inside = False
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        self.generic_visit(node)
        if any(isinstance(n, ast.NamedExpr) for value in node.values for n in ast.walk(value)):
            return node
        helper = "both" if isinstance(node.op, ast.And) else "either"
        return ast.copy_location(_call(helper, *(_thunk(value) for value in node.values)), node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(_call("negation", node.operand), node)
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)
        if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
            return node
        return ast.copy_location(_call("choose", node.test, _thunk(node.body), _thunk(node.orelse)), node)

    def _merge(self, condition: ast.expr, names: tuple[str, ...], taken: str, other: str) -> list[ast.stmt]:
        merged: list[ast.stmt] = []
        for name in names:
            present = ast.BoolOp(
                op=ast.Or(),
                values=[
                    ast.Compare(left=ast.Constant(name), ops=[ast.In()], comparators=[_load(taken)]),
                    ast.Compare(left=ast.Constant(name), ops=[ast.In()], comparators=[_load(other)]),
                ],
            )
            value = _call("select", condition, _load(taken), _load(other), ast.Constant(name))
            merged.append(ast.If(test=present, body=[_keep(name, value)], orelse=[]))
        return merged

    def visit_If(self, node: ast.If) -> ast.stmt | list[ast.stmt]:
        self.generic_visit(node)
        if _leaves(node.body) or _leaves(node.orelse):
            return node
        n = next(self.counter)
        test, saved, taken, other = (f"_spectest_{kind}{n}" for kind in ("test", "saved", "taken", "other"))
        names = _stored_names(node.body + node.orelse)
        names_tuple = ast.Tuple(elts=[ast.Constant(name) for name in names], ctx=ast.Load())
        restore = [
            ast.If(
                test=ast.Compare(left=ast.Constant(name), ops=[ast.In()], comparators=[_load(saved)]),
                body=[_keep(name, ast.Subscript(value=_load(saved), slice=ast.Constant(name), ctx=ast.Load()))],
                orelse=[],
            )
            for name in names
        ]
        divergent: list[ast.stmt] = [
            _keep(saved, _call("bound", _locals(), names_tuple)),
            ast.With(items=[ast.withitem(context_expr=_call("under", _load(test)))], body=node.body or [ast.Pass()]),
            _keep(taken, _call("bound", _locals(), names_tuple)),
            *restore,
            ast.With(
                items=[ast.withitem(context_expr=_call("under", _load(test), ast.Constant(True)))],
                body=node.orelse or [ast.Pass()],
            ),
            _keep(other, _call("bound", _locals(), names_tuple)),
            *self._merge(_load(test), names, taken, other),
        ]
        uniform = ast.If(test=_load(test), body=node.body, orelse=node.orelse)
        statements = [
            _keep(test, node.test),
            ast.If(test=_call("decides", _load(test)), body=[uniform], orelse=divergent),
        ]
        return [ast.copy_location(statement, node) for statement in statements]

    def visit_For(self, node: ast.For) -> ast.stmt | list[ast.stmt]:
        self.generic_visit(node)
        call = node.iter
        ranged = (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "range"
            and 1 <= len(call.args) <= 3
            and not call.keywords
        )
        if not ranged or node.orelse or not isinstance(node.target, ast.Name) or _leaves(node.body, in_loop=True):
            return node
        n = next(self.counter)
        bounds, k, live, saved, taken = (f"_spectest_{kind}{n}" for kind in ("range", "pass", "live", "saved", "taken"))
        target = node.target.id
        names = tuple(sorted({target, *_stored_names(node.body)}))
        names_tuple = ast.Tuple(elts=[ast.Constant(name) for name in names], ctx=ast.Load())
        uniform = ast.For(target=node.target, iter=_load(bounds), body=node.body, orelse=[])
        attribute = lambda name: ast.Attribute(value=_load(bounds), attr=name, ctx=ast.Load())  # noqa: E731
        per_pass = ast.For(
            target=ast.Name(id=k, ctx=ast.Store()),
            iter=ast.Call(func=_load("range"), args=[attribute("passes")], keywords=[]),
            body=[
                _keep(saved, _call("bound", _locals(), names_tuple)),
                _keep(live, ast.Call(func=attribute("live"), args=[_load(k)], keywords=[])),
                _keep(target, ast.Call(func=attribute("value"), args=[_load(k)], keywords=[])),
                ast.With(items=[ast.withitem(context_expr=_call("under", _load(live)))], body=node.body),
                _keep(taken, _call("bound", _locals(), names_tuple)),
                *self._merge(_load(live), names, taken, saved),
            ],
            orelse=[],
        )
        statements = [
            _keep(bounds, _call("loop", *call.args)),
            ast.If(
                test=ast.Call(func=_load("isinstance"), args=[_load(bounds), _load("range")], keywords=[]),
                body=[uniform],
                orelse=[per_pass],
            ),
        ]
        return [ast.copy_location(statement, node) for statement in statements]

    def visit_While(self, node: ast.While) -> ast.stmt | list[ast.stmt]:
        self.generic_visit(node)
        if node.orelse or _leaves(node.body):
            return node
        n = next(self.counter)
        live, saved, taken = (f"_spectest_{kind}{n}" for kind in ("live", "saved", "taken"))
        names = _stored_names(node.body)
        names_tuple = ast.Tuple(elts=[ast.Constant(name) for name in names], ctx=ast.Load())
        divergent: list[ast.stmt] = [
            _keep(saved, _call("bound", _locals(), names_tuple)),
            ast.With(items=[ast.withitem(context_expr=_call("under", _load(live)))], body=node.body),
            _keep(taken, _call("bound", _locals(), names_tuple)),
            *self._merge(_load(live), names, taken, saved),
        ]
        loop = ast.While(
            test=ast.Constant(True),
            body=[
                _keep(live, _call("still", _load(live), node.test)),
                ast.If(test=_call("finished", _load(live)), body=[ast.Break()], orelse=[]),
                ast.If(test=_call("all_live", _load(live)), body=node.body, orelse=divergent),
            ],
            orelse=[],
        )
        return [ast.copy_location(_keep(live, ast.Constant(None)), node), ast.copy_location(loop, node)]
