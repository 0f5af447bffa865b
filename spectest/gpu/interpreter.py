"""Triton's CPU interpreter with a launch's programs run side by side: the same kernels, the same numpy operations,
one Python pass per group of programs instead of one per program.

Triton's interpreter (``TRITON_INTERPRET=1``) runs a launch's programs one after another, every ``tl`` operation a
Python call into its builder on numpy arrays: about 100 us an operation, whatever the block size, so a sampler's
kernel costs 25-40 ms a row (vLLM's and SGLang's rejection kernels, docs/figures.md) where the property suite wants
10^5-10^6 rows. Here each value carries one more, trailing axis: the programs. A value every program shares (a
constant, an argument) keeps that axis at length 1 and numpy's broadcasting does the rest; ``tl.program_id`` is a
vector. Every operation is the interpreter's own (its builder's methods, its load and store), applied to all the
programs of a group at once, so each program computes exactly what it computes alone: the elementwise arithmetic is
the same numpy call on the same values, and a reduction or scan is taken along each program's own block, laid out as
the interpreter lays it out (so numpy sums it in the same order).

Control flow is where programs part: ``if``, ``while``, ``and``, a conditional expression or ``range`` on a value
that differs between the group's programs. Such a test raises :class:`Diverged` with each program's value; the group's
stores are undone (every store journals the bytes it overwrites) and the group is run again as one group per value,
from the start, so no program ever runs a path its own values did not choose. A group whose programs agree
everywhere runs once. A kernel reaches as many groups as it has distinct paths (a chain verifier: about one per
acceptance length and vocabulary tile), not one per program.

A vocabulary tile far wider than the vocabulary (vLLM's 8192 lanes over a few dozen tokens) is kept as its live lanes
and one row for the fill after them (:mod:`spectest.gpu.tails`), and a tile's addresses as a pointer a program plus
offsets the group shares, so a load computes the addresses of the lanes it enables only; for that, a group's
programs share their grid axes after the first (a group ends where they change) and a program id the group shares is
one value. Exact by construction, as the rest: every operation not taught the short form builds the block whole.

What the interpreter cannot see, this cannot either (races between programs, reads past an allocation that happen to
land in memory, timing, compile errors: :mod:`spectest.gpu.compile_gate` compiles the kernels for real); and programs
that write what other programs read, which a GPU does not order either, may see each other's writes in another
order here. Operations without a batched form here (atomics, ``tl.dot``, tensor descriptors, device prints,
reductions with a user-written combine function, histograms) make the launch fall back to the interpreter's own loop,
after undoing every store the batched attempt made: slower, never different (:data:`LAUNCHES` counts both).

:func:`install` puts this in place for every interpreted launch of the process (Triton must already run its
interpreter: ``TRITON_INTERPRET=1`` set before ``triton`` is first imported); :func:`installed` says whether it is.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spectest.gpu import tails
from spectest.gpu.predication import Diverged

# Elements of one block a group's arrays may hold at once (programs x block size): a group of programs is sized so
# that its largest block stays under this (about 32 MB of float64), so a kernel with 8192-wide tiles (vLLM's) runs
# in groups of 512 programs rather than all of a launch's thousands at once.
ELEMENTS_PER_GROUP = 1 << 22
FIRST_GROUP = 64  # programs in a launch's first group, before its blocks' size is known
LARGEST_GROUP = 4096
SHARED_ROW = 256  # programs along a grid's first axis from which a group keeps to one value of the others


class Unbatchable(BaseException):
    """An operation with no batched form here: the launch falls back to the interpreter's own loop."""

    def __init__(self, operation: str) -> None:
        super().__init__(operation)
        self.operation = operation


@dataclass
class Launches:
    """What the batched interpreter did in this process: launches, programs, groups run (restarts included), and the
    launches that fell back to the interpreter's loop, by the operation that made them."""

    launches: int = 0
    programs: int = 0
    groups: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        fallen = sum(self.fallbacks.values())
        line = (
            f"{self.launches} interpreted launches, {self.programs} programs in {self.groups} groups "
            f"({self.programs / max(1, self.groups):.0f} programs a group)"
        )
        if fallen:
            reasons = ", ".join(f"{op} ({n})" for op, n in sorted(self.fallbacks.items()))
            line += f"; {fallen} ran program by program: {reasons}"
        return line


LAUNCHES = Launches()
_STATE: dict[str, Any] = {"original": None, "transform": None}


def installed() -> bool:
    """Whether interpreted launches in this process run batched."""
    return _STATE["original"] is not None


MODES = ("batched", "plain")  # --spec-interpret's values: programs batched (this module), or one by one
MODE_VARIABLE = "SPECTEST_INTERPRETER"  # how the plugin hands the mode to pytest-xdist's workers and the adapters


def interpreter_active() -> bool:
    """Whether ``@triton.jit`` gives the interpreter's functions in this process: Triton reads
    ``TRITON_INTERPRET`` when a kernel is decorated, so a kernel module imported after it is set runs interpreted."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


class InterpreterUnavailable(ValueError):
    """Triton's interpreter cannot be turned on in this process any more; the message says what to set."""


def arrange_triton(who: str, mode: str | None = None) -> None:
    """Triton's interpreter for ``who``'s kernels on a machine without a GPU, batched unless ``mode`` (or
    ``SPECTEST_INTERPRETER``) is "plain": sets ``TRITON_INTERPRET=1`` for kernels imported from now on, and
    installs :func:`install`. Raises :class:`InterpreterUnavailable`, saying what to set, where it is too late:
    ``TRITON_INTERPRET`` set off, or Triton's language imported without it (its own ``@triton.jit`` helpers,
    ``tl.max`` and ``tl.sum`` among them, are then compiled functions that no interpreted kernel can call)."""
    import sys

    mode = mode or os.environ.get(MODE_VARIABLE) or "batched"
    if mode not in MODES:
        raise InterpreterUnavailable(f"{MODE_VARIABLE}={mode!r}: expected one of {', '.join(MODES)}")
    if os.environ.get("TRITON_INTERPRET") not in (None, "") and not interpreter_active():
        raise InterpreterUnavailable(
            f"{who} runs Triton kernels, which need Triton's interpreter on a machine without a GPU, and "
            f"TRITON_INTERPRET={os.environ['TRITON_INTERPRET']} turns it off: unset it or set TRITON_INTERPRET=1"
        )
    if "triton.language" in sys.modules and not interpreter_active():
        raise InterpreterUnavailable(
            f"{who} runs Triton kernels in Triton's interpreter on this machine (it has no GPU), and triton was "
            "imported before spectest could turn the interpreter on (by a conftest.py or a plugin): set "
            "TRITON_INTERPRET=1 in the environment"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ[MODE_VARIABLE] = mode
    provide_libdevice()
    if mode == "batched":
        install()
    else:
        uninstall()


# libdevice's elementwise math as numpy computes it, for the interpreter (which has none: Triton's
# ``triton.language.extra.libdevice`` holds stubs that only a compiler backend fills). Each is the same function
# to within an ulp or two (CUDA's libdevice promises 1-2 ulp for these), enough for kernels that, like vLLM Model
# Runner V2's residual, call log1p for accuracy near 0.
LIBDEVICE = {
    "log1p": np.log1p,
    "expm1": np.expm1,
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "log2": np.log2,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "floor": np.floor,
    "ceil": np.ceil,
    "abs": np.abs,
}


def _libdevice_function(ufunc: Callable[..., np.ndarray]) -> Callable[..., Any]:
    def function(*args: Any, _semantic: Any = None, **_: Any) -> Any:
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        first = next(arg for arg in args if isinstance(arg, tl.core.tensor))
        values = [arg.handle.data if isinstance(arg, tl.core.tensor) else arg for arg in args]
        data = np.asarray(ufunc(*values)).astype(first.handle.data.dtype, copy=False)
        return tl.core.tensor(TensorHandle(data, first.dtype.scalar), first.type)

    function.__name__ = ufunc.__name__
    function.spectest_libdevice = True  # type: ignore[attr-defined]
    return function


def provide_libdevice() -> None:
    """Give ``triton.language.extra.libdevice`` the functions of :data:`LIBDEVICE` for interpreted kernels
    (idempotent; only stubs are replaced)."""
    from triton.language.extra import libdevice

    for name, ufunc in LIBDEVICE.items():
        current = getattr(libdevice, name, None)
        if current is None or getattr(current, "spectest_libdevice", False):
            continue
        if current.__code__.co_code == _STUB.__code__.co_code:
            setattr(libdevice, name, _libdevice_function(ufunc))


def _STUB(arg0: Any) -> None:  # the shape of libdevice's stubs: a body of ``...``
    ...


def install() -> None:
    """Run every interpreted launch of this process batched (idempotent). Raises RuntimeError where the installed
    Triton's interpreter lacks what this builds on (it was written against triton 3.9)."""
    if installed():
        return
    from triton.runtime import interpreter

    needed = ("GridExecutor", "InterpreterBuilder", "ReduceOps", "ScanOps", "_patch_lang", "_implicit_cvt")
    absent = [name for name in needed if not hasattr(interpreter, name)]
    if absent or not hasattr(interpreter, "interpreter_builder"):
        raise RuntimeError(f"this Triton's interpreter lacks {absent or ['interpreter_builder']}")
    _STATE["original"] = interpreter.GridExecutor.__call__
    _STATE["transform"] = interpreter.FunctionRewriter._transform_ast
    interpreter.GridExecutor.__call__ = _batched_call
    interpreter.FunctionRewriter._transform_ast = _predicated_transform
    interpreter.InterpretedFunction.rewritten_fn.clear()  # kernels rewritten before get the predicated rewrite


def uninstall() -> None:
    """Back to the interpreter's own loop (tests use it to compare the two)."""
    if not installed():
        return
    from triton.runtime import interpreter

    interpreter.GridExecutor.__call__ = _STATE["original"]
    interpreter.FunctionRewriter._transform_ast = _STATE["transform"]
    interpreter.InterpretedFunction.rewritten_fn.clear()
    _STATE["original"] = None


@contextlib.contextmanager
def program_by_program() -> Iterator[None]:
    """Within this block, interpreted launches run the interpreter's own loop (for comparisons)."""
    was = installed()
    uninstall()
    try:
        yield
    finally:
        if was:
            install()


def _predicated_transform(self: Any, src: str) -> Any:
    """``FunctionRewriter._transform_ast``: the kernel's source with divergent branches predicated
    (:mod:`spectest.gpu.predication`), then the interpreter's own rewrite, as Triton 3.9 does it."""
    import ast

    from spectest.gpu import predication

    parsed = predication.Predication().visit(ast.parse(src))
    transformed = self.ast_transformer.visit(parsed)
    ast.fix_missing_locations(transformed)
    ast.increment_lineno(transformed, self.def_file_lineno - 1)
    self.fn.__globals__.setdefault(predication.HELPERS, predication)
    return transformed


def describe_kernels(distribution: str, name: str, module: Any, kernels: tuple[str, ...]) -> str:
    """A header's line on what runs: ``name``'s version, its kernels, and where they run (compiled, or in which
    Triton's interpreter and how)."""
    from importlib.metadata import PackageNotFoundError, version

    def version_of(package: str) -> str:
        for candidate in (package, f"{package}-cpu"):
            try:
                return version(candidate)
            except PackageNotFoundError:
                continue
        return "?"

    found = [kernel for kernel in kernels if hasattr(module, kernel)]
    where = "compiled"
    if any(type(getattr(module, kernel)).__name__ == "InterpretedFunction" for kernel in found):
        how = "programs batched" if installed() else "program by program"
        where = f"in Triton {version_of('triton')}'s interpreter, {how}"
    return f"{name} {version_of(distribution)}'s Triton kernels {', '.join(found)}, {where}"


# ----------------------------------------------------------------------------------------------------------------
# The launch


PATCHED_MARK = "_spectest_patched_languages"  # on triton.language during a batched launch: the modules it patched


def language_modules(fn: Any) -> frozenset[str]:
    """The language modules ``_patch_lang`` patches for ``fn``: triton.language and its core, where its globals see
    them."""
    import triton.language as tl

    return frozenset(
        value.__name__ for value in fn.__globals__.values() if inspect.ismodule(value) and value in (tl, tl.core)
    )


def _batched_call(self: Any, *args_dev: Any, **kwargs: Any) -> None:
    """``GridExecutor.__call__`` with the grid's programs run in groups (see the module docstring)."""
    from triton.runtime import interpreter

    argspec = inspect.getfullargspec(self.fn)
    kwargs = {k: v for k, v in kwargs.items() if k in argspec.args or k in argspec.kwonlyargs}
    args_hst, kwargs_hst = self._init_args_hst(args_dev, kwargs)
    for hook in self.pre_run_hooks:
        hook(*args_hst, **kwargs_hst)
    journal: list[Callable[[], None]] = []
    scope = interpreter._patch_lang(self.fn)
    scope.set_attr(interpreter.tl, PATCHED_MARK, language_modules(self.fn))  # what it patched, restored with it
    fallback: str | None = None
    try:
        args = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
        args = {name: arg if name in self.constexprs else interpreter._implicit_cvt(arg) for name, arg in args.items()}
        grid = self.grid(args) if callable(self.grid) else self.grid
        assert len(grid) <= 3, "grid must have at most 3 dimensions"
        grid = tuple(grid) + (1,) * (3 - len(grid))
        builder = _Batched(interpreter.interpreter_builder, journal, _Memory(_tensors(args_hst, kwargs_hst)))
        builder.patch(scope, grid)
        # Where each row of the grid's first axis is long (a row per token, a column per vocabulary tile), axis 0
        # varies fastest and a group ends where the others change, so that its programs share them: a tile's
        # offsets and mask are then one block for the group (spectest.gpu.tails). Short rows (a few requests, many
        # tiles) keep the stock order and mix: a group costs its operations' overhead whatever its size.
        ranges = [range(int(n)) for n in grid]
        shared = grid[0] >= SHARED_ROW and grid[1] * grid[2] > 1
        if shared:
            order = itertools.product(*reversed(ranges))
            programs = np.array(list(order), dtype=np.int64).reshape(-1, 3)[:, ::-1].copy()
            edges = np.arange(grid[0], len(programs) + 1, grid[0])
        else:
            programs = np.array(list(itertools.product(*ranges)), dtype=np.int64).reshape(-1, 3)
            edges = np.array([len(programs)])
        LAUNCHES.launches += 1
        LAUNCHES.programs += len(programs)
        try:
            start, size = 0, FIRST_GROUP
            while start < len(programs):
                end = min(start + size, int(edges[np.searchsorted(edges, start, side="right")]))
                _run_group(self.fn, args, builder, programs[start:end])
                start = end
                size = builder.group_size()
        except Unbatchable as stop:
            fallback = stop.operation
        except Exception as exc:
            if interpreter.triton.knobs.compilation.front_end_debugging:
                raise
            raise interpreter.InterpreterError(repr(exc)) from exc
    finally:
        scope.restore()
    if fallback is not None:
        _undo(journal)
        LAUNCHES.fallbacks[fallback] = LAUNCHES.fallbacks.get(fallback, 0) + 1
        _STATE["original"](self, *args_dev, **kwargs)
        return
    self._restore_args_dev(args_dev, args_hst, kwargs, kwargs_hst)


def _run_group(fn: Callable[..., Any], args: dict[str, Any], builder: _Batched, programs: np.ndarray) -> None:
    """Run ``programs`` [n, 3] as one group; where they diverge, undo the group's stores and run each part alone."""
    if len(programs) == 0:
        return
    from spectest.gpu.predication import PREDICATE

    mark = len(builder.journal)
    builder.programs = programs
    LAUNCHES.groups += 1
    PREDICATE.reset()
    try:
        with np.errstate(all="ignore"):  # a disabled program's arithmetic on values it would never make
            fn(**args)
    except Diverged as split:
        _split(fn, args, builder, programs, mark, split)
    except Exception as exc:
        # Inside a @triton.jit helper the interpreter wraps every exception: find a split or a fallback in the chain.
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, Diverged | Unbatchable):
            cause = cause.__cause__
        if cause is None:
            raise
        if isinstance(cause, Unbatchable):
            raise cause from None
        _split(fn, args, builder, programs, mark, cause)


def _split(
    fn: Callable[..., Any], args: dict[str, Any], builder: _Batched, programs: np.ndarray, mark: int, split: Diverged
) -> None:
    """Undo the group's stores and run it again, one group per value the programs took at the split."""
    _undo(builder.journal[mark:])
    del builder.journal[mark:]
    values = np.broadcast_to(split.values, (len(programs),))
    parts = np.unique(values)
    if len(parts) < 2:  # a split that separates nothing would repeat forever: run the launch program by program
        raise Unbatchable("a branch its programs agree on")
    for value in parts:
        _run_group(fn, args, builder, programs[values == value])


def _undo(journal: list[Callable[[], None]]) -> None:
    """Write back the bytes each journalled store overwrote, latest first."""
    for undo in reversed(journal):
        undo()


def _tensors(*values: Any) -> list[Any]:
    """The tensors among a launch's arguments (inside tuples and mappings too)."""
    found: list[Any] = []

    def visit(value: Any) -> None:
        if hasattr(value, "untyped_storage"):
            found.append(value)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    for value in values:
        visit(value)
    return found


class _Memory:
    """The launch's tensors as numpy views of their storages, so that a load or store reads or writes only the
    lanes its mask enables, by fancy indexing, instead of the interpreter's element-by-element C++ loop over every
    lane (a kernel with 8192-wide tiles on a 500-token vocabulary enables 6% of them). The same bytes at the same
    addresses: an address outside every argument's storage, or not aligned to its type, goes to the interpreter's
    own load and store, as does memory that is not the CPU's."""

    def __init__(self, tensors: list[Any]) -> None:
        regions: dict[int, tuple[int, np.ndarray]] = {}
        for tensor in tensors:
            if getattr(tensor, "device", None) is None or tensor.device.type != "cpu":
                continue
            storage = tensor.untyped_storage()
            start, size = storage.data_ptr(), storage.nbytes()
            if size and start not in regions:
                buffer = (ctypes.c_uint8 * size).from_address(start)
                regions[start] = (size, np.frombuffer(buffer, dtype=np.uint8))
        self.starts = np.array(sorted(regions), dtype=np.uint64)
        self.regions = [regions[int(start)] for start in self.starts]
        self.views: dict[tuple[int, str], np.ndarray] = {}

    def locate(
        self, ptrs: np.ndarray, mask: np.ndarray | None, dtype: np.dtype
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(the region's elements as ``dtype``, each enabled lane's index into them), or None where the enabled
        lanes do not all lie, aligned, in one argument's storage."""
        if not len(self.starts):
            return None
        active = ptrs.reshape(-1) if mask is None else ptrs[mask]
        if active.size == 0:
            return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
        lowest = active.min()
        which = int(np.searchsorted(self.starts, lowest, side="right")) - 1
        if which < 0:
            return None
        start = int(self.starts[which])
        size, raw = self.regions[which]
        item = dtype.itemsize
        offsets = (active - np.uint64(start)).astype(np.int64)
        if int(offsets.max()) + item > size or start % item or (offsets % item).any():
            return None
        key = (start, dtype.str)
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = raw[: size - size % item].view(dtype)
        return view, offsets // item


# ----------------------------------------------------------------------------------------------------------------
# The builder: the interpreter's operations on values with a trailing program axis


def _programs(data: np.ndarray) -> int:
    return data.shape[-1]


def _common(*arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays broadcast to one shape, each its own contiguous copy (the interpreter's C++ load and store read
    flat buffers)."""
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    return [np.ascontiguousarray(np.broadcast_to(a, shape)) for a in arrays]


def _front(data: np.ndarray) -> np.ndarray:
    """The program axis first and each program's block contiguous, as the interpreter holds one program's block."""
    return np.ascontiguousarray(np.moveaxis(data, -1, 0))


def _back(data: np.ndarray) -> np.ndarray:
    return np.moveaxis(data, 0, -1)


class _Batched:
    """The batched forms of the interpreter builder's shape-aware operations, patched onto the interpreter's builder
    (and the ``tl`` functions the interpreter patches) for one launch. The builder's elementwise operations need no
    change: numpy broadcasts the trailing program axis."""

    def __init__(self, builder: Any, journal: list[Callable[[], None]], memory: _Memory) -> None:
        self.builder = builder
        self.journal = journal
        self.memory = memory
        self.programs = np.zeros((1, 3), dtype=np.int64)
        self.widest = 1  # the largest block (elements of one program's value) this launch has made

    def group_size(self) -> int:
        return int(min(LARGEST_GROUP, max(1, ELEMENTS_PER_GROUP // self.widest)))

    def _seen(self, data: np.ndarray) -> np.ndarray:
        self.widest = max(self.widest, data.size // max(1, _programs(data)))
        return data

    def patch(self, scope: Any, grid: tuple[int, ...]) -> None:
        from triton.runtime import interpreter as it

        b = self.builder
        b.set_grid_dim(*grid)
        handle = it.TensorHandle
        get_np_dtype = it._get_np_dtype
        tl = it.tl

        def program_id(axis: int) -> Any:
            # An axis the group's programs share (a grid's axis of one, or a group cut within one row of it) is one
            # value for all of them, as a constant is: what derives from it alone (a tile's offsets, its mask) stays
            # one block for the group instead of one a program.
            ids = self.programs[:, axis]
            if len(ids) > 1 and (ids == ids[0]).all():
                ids = ids[:1]
            return handle(ids.astype(np.int32), tl.int32)

        def make_range(ret_ty: Any, start: int, stop: int) -> Any:
            return handle(self._seen(np.arange(start, stop, dtype=np.int32)[:, None]), tl.int32)

        def splat(ret_ty: Any, arg: Any) -> Any:
            shape = tuple(ret_ty.shape)
            value = arg.data[0] if isinstance(arg.dtype, tl.block_type) else arg.data
            value = np.asarray(value, dtype=get_np_dtype(arg.dtype))
            # A read-only view: no operation writes into a value, and a filled block costs a pass per splat.
            return handle(self._seen(np.broadcast_to(value, (*shape, _programs(value)))), arg.dtype.scalar)

        def unsplat(arg: Any) -> Any:
            return handle(
                np.array(arg.data.reshape(-1, _programs(arg.data))[0], dtype=get_np_dtype(arg.dtype)), arg.dtype.scalar
            )

        def broadcast(arg: Any, shape: list[int]) -> Any:
            return handle(self._seen(np.broadcast_to(arg.data, (*tuple(shape), _programs(arg.data)))), arg.dtype.scalar)

        def expand_dims(arg: Any, axis: int) -> Any:
            return handle(np.expand_dims(arg.data, axis if axis >= 0 else axis + arg.data.ndim), arg.dtype.scalar)

        def reshape(arg: Any, shape: list[int], allow_reorder: bool) -> Any:
            return handle(arg.data.reshape((*tuple(shape), _programs(arg.data))), arg.dtype.scalar)

        def trans(arg: Any, perm: list[int]) -> Any:
            return handle(np.transpose(arg.data, [*perm, arg.data.ndim - 1]), arg.dtype.scalar)

        def cat(lhs: Any, rhs: Any) -> Any:
            left, right = _common_programs(lhs.data, rhs.data)
            return handle(np.concatenate([left, right]), lhs.dtype.scalar)

        def join(lhs: Any, rhs: Any) -> Any:
            left, right = _common(lhs.data, rhs.data)
            return handle(np.stack([left, right], axis=-2), lhs.dtype.scalar)

        def split(val: Any) -> Any:
            return (handle(val.data[..., 0, :], val.dtype.scalar), handle(val.data[..., 1, :], val.dtype.scalar))

        def gather(src: Any, indices: Any, axis: int) -> Any:
            source, index = _common_programs(src.data, indices.data)
            return handle(np.take_along_axis(source, index, axis=axis), src.dtype.scalar)

        def masked_load(ptrs: Any, mask: Any, other: Any, cache_policy: Any, is_volatile: bool) -> Any:
            dtype_tt = ptrs.get_element_ty()
            dtype_np = np.dtype(get_np_dtype(dtype_tt))
            other_data = np.zeros((1,), dtype=dtype_np) if other is None else other.data
            mask_data = _enabled(mask.data)
            shape = np.broadcast_shapes(tails.shape_of(ptrs), mask_data.shape, other_data.shape)
            if mask_data.shape[-1] == 1 and len(shape) > 1:
                # A mask every program shares (a tile's edge): gather the enabled lanes only.
                lanes = np.flatnonzero(np.broadcast_to(mask_data[..., 0], shape[:-1]))
                if tails.is_factored(ptrs) and len(shape) == 2:
                    addresses = ptrs.rows(lanes, shape[-1])
                else:
                    addresses = np.broadcast_to(ptrs.data, shape).reshape(-1, shape[-1])[lanes]
                found = self.memory.locate(addresses, None, dtype_np)
                if found is not None:
                    view, index = found
                    live = int(lanes[-1]) + 1 if lanes.size else 0
                    fill = tails.load_fill(other_data, shape, live)
                    if fill is not None:
                        # Every enabled lane lies before `live`: the lanes from it on hold the fill, kept as one row.
                        self.widest = max(self.widest, shape[0])  # a group's size, as if built whole
                        return tails.loaded(fill, shape, live, lanes, view[index].reshape(addresses.shape), dtype_tt)
                    out = np.empty(shape, dtype=dtype_np)
                    out[...] = other_data
                    out.reshape(-1, shape[-1])[lanes] = view[index].reshape(addresses.shape)
                    return handle(self._seen(out), dtype_tt)
            enabled = np.broadcast_to(mask_data, shape)
            if len(shape) == 2 and tails.is_factored(ptrs):
                # A mask of each program's own over a shared tile (a vocabulary's edge and one token each): the same
                # tail where no program enables a lane from `live` on.
                rows = np.flatnonzero(enabled.any(axis=1))
                live = int(rows[-1]) + 1 if rows.size else 0
                fill = tails.load_fill(other_data, shape, live)
                if fill is not None:
                    found = self.memory.locate(ptrs.rows(np.arange(live), shape[-1]), enabled[:live], dtype_np)
                    if found is not None:
                        view, index = found
                        self.widest = max(self.widest, shape[0])  # a group's size, as if built whole
                        return tails.loaded(fill, shape, live, enabled[:live], view[index], dtype_tt)
            addresses = np.broadcast_to(ptrs.data, shape)
            found = self.memory.locate(addresses, enabled, dtype_np)
            if found is None:
                p, m, o = _common(ptrs.data, mask_data, other_data)
                return handle(self._seen(it._interpreter.load(p, m, o, dtype_np)), dtype_tt)
            view, index = found
            out = np.empty(shape, dtype=dtype_np)
            out[...] = other_data
            out[enabled] = view[index]
            return handle(self._seen(out), dtype_tt)

        def addptr(ptr: Any, offset: Any) -> Any:
            # The interpreter's ptr + width * uint64(offset), in one buffer where the offset spans the result.
            width = np.uint64(max(1, ptr.get_element_ty().primitive_bitwidth // 8))
            base, offsets = ptr.data, offset.data
            if base.ndim == 2 and base.strides[0] == 0:
                base = base[0]  # a pointer a program, broadcast across the tile
            if offsets.ndim == 2 and offsets.shape[-1] > 1 and offsets.strides[-1] == 0:
                offsets = offsets[:, :1]  # a tile every program shares, broadcast across the programs
            if base.ndim == 1 and offsets.ndim == 2 and offsets.shape[-1] == 1:
                # A pointer a program plus a tile's offsets every program shares: kept apart until read, so that a
                # load that enables a few lanes computes those lanes' addresses only.
                return tails.factored(base, offsets, width, ptr.dtype)
            shape = np.broadcast_shapes(ptr.data.shape, offset.data.shape)
            if offset.data.shape != shape:
                return handle(ptr.data + width * offset.data.astype(np.uint64), ptr.dtype)
            out = offset.data.astype(np.uint64)
            out *= width
            out += ptr.data
            return handle(out, ptr.dtype)

        def load(ptr: Any, cache_policy: Any, is_volatile: bool) -> Any:
            mask = handle(np.ones((1,), dtype=bool), tl.int1)
            return masked_load(ptr, mask, None, cache_policy, is_volatile)

        def masked_store(ptrs: Any, value: Any, mask: Any, cache_policy: Any) -> Any:
            mask_data = _enabled(mask.data)
            shape = np.broadcast_shapes(ptrs.data.shape, value.data.shape, mask_data.shape)
            enabled = np.broadcast_to(mask_data, shape)
            found = self.memory.locate(np.broadcast_to(ptrs.data, shape), enabled, value.data.dtype)
            if found is None:
                p, v, m = _common(ptrs.data, value.data, mask_data)
                old = it._interpreter.load(p, m, np.zeros_like(v), v.dtype)
                self.journal.append(lambda: it._interpreter.store(p, old, m))
                return it._interpreter.store(p, v, m)
            view, index = found
            old = view[index]
            self.journal.append(lambda: view.__setitem__(index, old))
            view[index] = np.broadcast_to(value.data, shape)[enabled]
            return None

        def store(ptr: Any, val: Any, cache_policy: Any) -> Any:
            return masked_store(ptr, val, handle(np.ones((1,), dtype=bool), tl.int1), cache_policy)

        def assertion(condition: Any, message: str) -> None:
            assert bool(np.logical_or(condition.data, ~_enabled(np.ones((1,), dtype=bool))).all()), f"{message}"

        def unbatchable(operation: str) -> Callable[..., Any]:
            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise Unbatchable(operation)

            return refuse

        replacements: dict[str, Callable[..., Any]] = {
            "create_get_program_id": program_id,
            "create_make_range": make_range,
            "create_splat": splat,
            "create_unsplat": unsplat,
            "create_broadcast": broadcast,
            "create_expand_dims": expand_dims,
            "create_reshape": reshape,
            "create_trans": trans,
            "create_cat": cat,
            "create_join": join,
            "create_split": split,
            "create_gather": gather,
            "create_masked_load": masked_load,
            "create_load": load,
            "create_masked_store": masked_store,
            "create_store": store,
            "create_addptr": addptr,
            "create_assert": assertion,
        }
        for name in (
            "create_dot",
            "create_dot_scaled",
            "create_histogram",
            "create_atomic_cas",
            "create_atomic_rmw",
            "create_atomic_load",
            "create_atomic_store",
            "create_atomic_poll",
            "create_print",
            "create_make_tensor_descriptor",
            "create_descriptor_load",
            "create_descriptor_store",
            "create_descriptor_gather",
            "create_descriptor_scatter",
            "create_extern_elementwise",
            "create_inline_asm",
            "create_map_elementwise",
        ):
            replacements[name] = unbatchable(name.removeprefix("create_"))
        for name, operands in ELEMENTWISE.items():
            replacements[name] = _lifted(getattr(b, name), operands)
        for name, method in replacements.items():
            scope.set_attr(b, name, method)
        reduce, scan = _reduction(it), _scan(it)

        def override_language() -> None:
            tensor = tl.core.tensor
            scope.set_attr(tensor, "__bool__", _truth)
            scope.set_attr(tensor, "__index__", _index)
            scope.set_attr(tensor, "T", property(_transposed))
            for module in (tl, tl.core):
                scope.set_attr(module, "reduce", reduce)
                scope.set_attr(module, "associative_scan", scan)

        stock_patch = it._patch_lang

        def patch_lang(fn: Any) -> Any:
            # Every call of a @triton.jit helper patches the language again, with the interpreter's one-program
            # forms: put the batched ones back over them (into the launch's scope, which restores them all). A
            # helper that sees only language modules this launch has patched already is skipped: the stock patch
            # would wrap nothing new (its wrappers are no builtins) and set the same attributes again, and it walks
            # every module member with inspect each time (a third of vLLM V2's time, 7 ms a helper call).
            langs = language_modules(fn)
            done = getattr(tl, PATCHED_MARK, frozenset())
            if langs <= done:
                return it._LangPatchScope()
            patched = stock_patch(fn)
            override_language()
            scope.set_attr(tl, PATCHED_MARK, done | langs)
            return patched

        override_language()
        scope.set_attr(it, "_patch_lang", patch_lang)


# The builder's elementwise operations that take a tailed block (spectest.gpu.tails) as it is: name, operands.
ELEMENTWISE = {
    "binary_op": 2,
    "unary_op": 1,
    "ternary_op": 3,
    "cast_impl": 1,
    "create_fp_to_fp": 1,
    "create_bitcast": 1,
    "create_fabs": 1,
    "create_fma": 3,
}


def _lifted(operation: Callable[..., Any], operands: int) -> Callable[..., Any]:
    """``operation`` on tailed blocks' live lanes and tail apart (:func:`spectest.gpu.tails.elementwise`), on whole
    blocks otherwise."""

    def run(*args: Any) -> Any:
        handles, rest = args[:operands], args[operands:]
        if any(tails.is_tailed(h) for h in handles):
            result = tails.elementwise(lambda *parts: operation(*parts, *rest), handles)
            if result is not None:
                return result
        return operation(*args)

    return run


def _common_programs(*arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays with their program axes at one length (their blocks as they are)."""
    n = max(_programs(a) for a in arrays)
    return [a if _programs(a) == n else np.broadcast_to(a, (*a.shape[:-1], n)) for a in arrays]


def _enabled(mask: np.ndarray) -> np.ndarray:
    """A load's or store's mask as booleans (as the interpreter's C++ reads it: an int1 value may hold 0 and 1 of a
    wider numpy type), with the programs a predicated branch disables switched off."""
    from spectest.gpu.predication import PREDICATE

    if mask.dtype != np.bool_:
        mask = mask.astype(bool)
    active = PREDICATE.active
    return mask if active is None else np.logical_and(mask, active)


def _branch_values(value: Any) -> np.ndarray:
    """Each program's truth of a value Python branches on, as the interpreter decides it for one program: a scalar
    (or a block of one element) by its value, any larger block as true."""
    data = value.handle.data
    numel = data.size // _programs(data)
    if value.type.is_block() and numel != 1:
        return np.ones((1,), dtype=bool)
    return data.reshape(-1).astype(bool)


def _truth(self: Any) -> bool:
    """``bool`` of a value the programs branch on: the enabled programs' common truth, or :class:`Diverged`."""
    from spectest.gpu.predication import active_values

    values = _branch_values(self)
    enabled = active_values(values)
    if enabled.size > 1 and not (enabled.all() or not enabled.any()):
        raise Diverged(values)
    return bool((enabled if enabled.size else values)[0])


def _index(self: Any) -> int:
    """``int`` of a value the programs loop or index by: the enabled programs' common value, or :class:`Diverged`."""
    from spectest.gpu.predication import active_values

    values = self.handle.data.reshape(-1)
    enabled = active_values(values)
    if enabled.size > 1 and not (enabled == enabled[0]).all():
        raise Diverged(values)
    return int((enabled if enabled.size else values)[0])


def _transposed(self: Any) -> Any:
    from triton.runtime import interpreter as it

    data = self.handle.data
    order = [*range(data.ndim - 1)]
    order[-1], order[-2] = order[-2], order[-1]
    shape = list(self.type.shape)
    shape[-1], shape[-2] = shape[-2], shape[-1]
    return it.tl.core.tensor(
        it.TensorHandle(np.transpose(data, [*order, data.ndim - 1]), self.handle.dtype),
        it.tl.core.block_type(self.dtype, shape),
    )


def _reduction(it: Any) -> Callable[..., Any]:
    class BatchedReduce(it.ReduceOps):
        """The interpreter's reductions along each program's own block (the program axis moved first, each block
        contiguous as the interpreter holds it, so numpy sums it in the same order)."""

        def apply(self, input: Any) -> Any:
            first = input[0] if isinstance(input, tuple) else input
            if self.axis is not None and self.axis < 0:
                self.axis += len(first.shape)
            return super().apply(input)

        def to_tensor(self, ret: Any, dtype: Any) -> Any:
            return _as_tensor(it, ret, dtype)

        def generic_reduce(self, input: Any) -> Any:
            raise Unbatchable("reduce with a combine function of its own")

        def _axes(self, data: np.ndarray, contiguous: bool = True) -> tuple[np.ndarray, int | tuple[int, ...]]:
            front = _front(data) if contiguous else np.moveaxis(data, -1, 0)
            if self.axis is None:
                return front, tuple(range(1, front.ndim))
            return front, self.axis + 1

        def min_max(self, input: Any, val_reduce_op: Any, idx_reduce_op: Any = None) -> Any:
            input = input[0] if isinstance(input, tuple) else input
            data = tails.stacked(input.handle) if tails.is_tailed(input.handle) else input.handle.data
            front, axes = self._axes(data, contiguous=False)  # a maximum is the same in any order
            keep = self.keep_dims
            if not np.issubdtype(front.dtype, np.inexact) or not np.isnan(front).any():
                # Without a NaN, numpy's nan-ignoring reductions are its plain ones (which skip a masked copy).
                fast = {np.nanmax: np.max, np.nanmin: np.min, np.nanargmax: np.argmax, np.nanargmin: np.argmin}
                val_reduce_op = fast.get(val_reduce_op, val_reduce_op)
                idx_reduce_op = fast.get(idx_reduce_op, idx_reduce_op)
            val = idx = None
            if val_reduce_op:
                val = self.to_tensor(_back(val_reduce_op(front, axis=axes, keepdims=keep)), input.dtype)
            if idx_reduce_op:
                if isinstance(axes, tuple):
                    flat = front.reshape(front.shape[0], -1)
                    found = idx_reduce_op(flat, axis=1, keepdims=False)
                    if keep:
                        found = found.reshape((front.shape[0],) + (1,) * (front.ndim - 1))
                else:
                    found = idx_reduce_op(front, axis=axes, keepdims=keep)
                idx = self.to_tensor(_back(found), it.tl.int32)
            if val is not None and idx is not None:
                return val, idx
            return val if val is not None else idx

        def sum(self, input: Any) -> Any:
            """numpy's sum in the order the interpreter's own takes for one program's block."""
            if tails.is_tailed(input.handle):
                total = np.sum(tails.front(input.handle), axis=-1)
                return self.to_tensor(total[None, :] if self.keep_dims else total, input.dtype)
            data = input.handle.data
            programs, block = data.shape[-1], data.ndim - 1
            if block == 1:  # a row (the samplers' case): pairwise, as numpy sums a contiguous one
                total = np.sum(_front(data), axis=-1)
                return self.to_tensor(total[None, :] if self.keep_dims else total, input.dtype)
            # A 2-D block or more: numpy's order follows each view's strides (a transposed tile sums otherwise than
            # the tile), which a program's slice of the batched value keeps in proportion: one program at a time.
            axis = self.axis
            if axis is None:  # the interpreter flattens the block first
                data, axis = data.reshape(-1, programs), 0
            parts = [np.asarray(np.sum(data[..., p], axis=axis, keepdims=self.keep_dims)) for p in range(programs)]
            total = np.stack(parts, axis=-1)
            if self.axis is None and self.keep_dims:
                total = total.reshape((1,) * block + (programs,))
            return self.to_tensor(total, input.dtype)

    def reduce(input: Any, axis: Any, combine_fn: Any, keep_dims: bool = False, **kwargs: Any) -> Any:
        return BatchedReduce(axis, combine_fn, keep_dims).apply(input)

    return reduce


def _scan(it: Any) -> Callable[..., Any]:
    class BatchedScan(it.ScanOps):
        """The interpreter's scans (cumulative sum and product) along each program's own block."""

        def apply(self, input: Any) -> Any:
            first = input[0] if isinstance(input, tuple) else input
            if self.axis < 0:
                self.axis += len(first.shape)
            return super().apply(input)

        def apply_impl(self, input: Any) -> Any:
            if self.combine_fn not in (it.tl.standard._sum_combine, it.tl.standard._prod_combine):
                raise Unbatchable("scan with a combine function of its own")
            operation = np.cumsum if self.combine_fn == it.tl.standard._sum_combine else np.cumprod
            data = _front(input[0].handle.data)
            if self.reverse:
                data = np.ascontiguousarray(np.flip(data, axis=self.axis + 1))
            out = operation(data, axis=self.axis + 1)
            if self.reverse:
                out = np.flip(out, axis=self.axis + 1)
            return [self.to_tensor(np.ascontiguousarray(_back(out)), input[0].dtype)]

        def to_tensor(self, ret: Any, dtype: Any) -> Any:
            return _as_tensor(it, ret, dtype)

    def scan(input: Any, axis: Any, combine_fn: Any, reverse: bool = False, **kwargs: Any) -> Any:
        return BatchedScan(axis, combine_fn, reverse).apply(input)

    return scan


def _as_tensor(it: Any, ret: Any, dtype: Any) -> Any:
    """A reduction's or scan's result as a tensor: a block of each program's shape, or a scalar a program."""
    data = np.asarray(ret).astype(it._get_np_dtype(dtype))
    if data.ndim > 1:
        return it.tl.core.tensor(it.TensorHandle(data, dtype.scalar), it.tl.block_type(dtype, list(data.shape[:-1])))
    return it.tl.core.tensor(it.TensorHandle(data.reshape(-1), dtype.scalar), dtype)
