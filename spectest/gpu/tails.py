"""Blocks whose last lanes hold one value, kept as their live lanes and that one value: the batched interpreter's
answer to wide tiles over a small vocabulary.

A sampler's kernel loads a vocabulary tile of thousands of lanes (vLLM's are 8192 wide) with a mask and a fill
(``other=-inf``); over a vocabulary of 20 tokens, all but 20 lanes of every program hold the fill, and every
operation after the load (a subtraction, an exponential, a comparison) computes that same value again on each of
them: the tile, not the vocabulary, sets the cost. Here a load whose mask every program of a group shares, and whose
enabled lanes all lie before lane ``L``, gives a :class:`Tailed` value: lanes ``[0, L)`` as an array ``[L, programs]``
and one row ``[1, programs]`` standing for every lane from ``L`` on.

Exactness is by construction, not by argument about the kernel:

* an elementwise operation (the builder's ``binary_op``, ``unary_op``, ``ternary_op`` and casts) on the live lanes
  and on the tail row is the same numpy call on the same values as on the whole block, lane by lane;
* a maximum, minimum or their index is taken over the live lanes and one copy of the tail (a value repeated changes
  neither, and the first tail lane is lane ``L``);
* a sum is taken, as before, over each program's whole block laid out contiguously, so numpy adds in the same order;
* anything else reads ``data``, which builds the whole block (once) exactly as the load would have: the operations
  taught here are a fast path, never a different result.

Operands that are not tailed join an operation only when they are one value a program (a scalar, a row the block
broadcasts) or a block every program shares whose own lanes from ``L`` on are one value, checked bit for bit;
otherwise the tailed operand is built whole and the builder's own operation runs.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np


@cache
def _deferred_class() -> type:
    """A ``TensorHandle`` whose ``data`` is built from its parts on first read (``_build``), made once Triton is
    imported."""
    from triton.runtime.interpreter import TensorHandle

    class Deferred(TensorHandle):
        def __init__(self, dtype: Any) -> None:  # the dataclass's fields, without its eager data
            self.dtype = dtype
            self.attr: dict[str, Any] = {}
            self._data: np.ndarray | None = None

        def _build(self) -> np.ndarray:
            raise NotImplementedError

        @property
        def data(self) -> np.ndarray:
            if self._data is None:
                self._data = self._build()
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = value

    return Deferred


@cache
def tailed_class() -> type:
    """:class:`Tailed`, made once Triton (and its ``TensorHandle``) is imported."""

    class Tailed(_deferred_class()):
        """A 1-D block ``[lanes, programs]``: ``live`` [L, p] then ``tail`` [1, q] repeated to ``lanes``."""

        def __init__(self, live: np.ndarray, tail: np.ndarray, lanes: int, dtype: Any) -> None:
            super().__init__(dtype)
            self.live, self.tail, self.lanes = live, tail, lanes

        def _build(self) -> np.ndarray:
            programs = max(self.live.shape[-1], self.tail.shape[-1])
            whole = np.empty((self.lanes, programs), dtype=self.live.dtype)
            whole[: len(self.live)] = self.live
            whole[len(self.live) :] = self.tail
            return whole

    return Tailed


@cache
def factored_class() -> type:
    """:class:`Factored`, made once Triton is imported."""

    class Factored(_deferred_class()):
        """A pointer a program ``base`` [p] plus a tile of offsets every program shares [lanes, 1], as the
        builder's ``addptr`` adds them (uint64, ``width`` bytes an element): ``data`` builds the whole block,
        :meth:`rows` the addresses of some lanes only."""

        def __init__(self, base: np.ndarray, offsets: np.ndarray, width: np.uint64, dtype: Any) -> None:
            super().__init__(dtype)
            self.base, self.offsets, self.width = base, offsets, width

        def rows(self, lanes: np.ndarray, programs: int) -> np.ndarray:
            out = self.offsets[lanes].astype(np.uint64)
            out *= self.width
            return np.broadcast_to(out + self.base, (len(lanes), programs))

        def _build(self) -> np.ndarray:
            shape = np.broadcast_shapes(self.base.shape, self.offsets.shape)
            out = np.broadcast_to(self.offsets, shape).astype(np.uint64)
            out *= self.width
            out += self.base
            return out

    return Factored


def factored(base: np.ndarray, offsets: np.ndarray, width: np.uint64, dtype: Any) -> Any:
    return factored_class()(base, offsets, width, dtype)


def is_factored(handle: Any) -> bool:
    return isinstance(handle, factored_class())


def shape_of(handle: Any) -> tuple[int, ...]:
    """``handle.data.shape``, without building a factored or tailed block whole."""
    if is_factored(handle) and handle._data is None:
        return np.broadcast_shapes(handle.base.shape, handle.offsets.shape)
    if is_tailed(handle):
        return (handle.lanes, max(handle.live.shape[-1], handle.tail.shape[-1]))
    return handle.data.shape


def is_tailed(handle: Any) -> bool:
    return isinstance(handle, tailed_class()) and handle._data is None


def tailed(live: np.ndarray, tail: np.ndarray, lanes: int, dtype: Any) -> Any:
    return tailed_class()(live, tail, lanes, dtype)


def load_fill(other: np.ndarray, shape: tuple[int, ...], live: int) -> np.ndarray | None:
    """A load's fill as [lanes or 1, programs] where a load into ``shape`` whose enabled lanes all lie before
    ``live`` can be kept tailed (a 1-D block, lanes left over, the fill one value on them); None otherwise."""
    fill = other if other.ndim == len(shape) else other[None]
    if len(shape) != 2 or live >= shape[0] or not uniform_from(fill, live):
        return None
    return fill


def loaded(fill: np.ndarray, shape: tuple[int, ...], live: int, enabled: Any, values: np.ndarray, dtype: Any) -> Any:
    """The tailed result of a load: the fill on lanes [0, live), ``values`` at ``enabled`` among them, the fill's
    row at ``live`` for the rest."""
    own = len(fill) > 1
    out = np.empty((live, shape[-1]), dtype=values.dtype)
    out[...] = fill[:live] if own else fill
    out[enabled] = values
    tail = np.asarray(fill[live : live + 1] if own else fill, dtype=values.dtype)
    return tailed(out, tail, shape[0], dtype)


def uniform_from(data: np.ndarray, start: int) -> bool:
    """Whether ``data`` [lanes, p]'s lanes from ``start`` on are one value in each column, bit for bit."""
    rest = data[start:]
    if len(rest) <= 1 or rest.strides[0] == 0:  # a broadcast along the lanes: one value by construction
        return True
    bits = np.ascontiguousarray(rest).view(np.uint8).reshape(len(rest), -1)
    return bool((bits == bits[:1]).all())


def _split(handle: Any, lanes: int, live: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``handle``'s data as (lanes [0, live), the tail row), or None where it has no such form."""
    if is_tailed(handle):
        if handle.lanes != lanes or len(handle.live) > live:
            return None
        if len(handle.live) == live:
            return handle.live, handle.tail
        programs = max(handle.live.shape[-1], handle.tail.shape[-1])
        head = np.broadcast_to(handle.live, (len(handle.live), programs))
        extra = np.broadcast_to(handle.tail, (live - len(handle.live), programs))
        return np.concatenate([head, extra]), handle.tail
    data = handle.data
    if data.ndim == 1 or (data.ndim == 2 and data.shape[0] == 1):
        return data, data  # one value a program: the same on every lane
    if data.ndim == 2 and data.shape[0] == lanes and data.strides[0] == 0:
        return data[:1], data[:1]  # a value a program splat or broadcast across the block
    if data.ndim == 2 and data.shape == (lanes, 1) and uniform_from(data, live):
        return data[:live], data[live : live + 1]
    return None


def elementwise(operation: Callable[..., Any], handles: tuple[Any, ...]) -> Any | None:
    """``operation`` (a builder method taking these handles, returning a handle) on the tailed form of its operands,
    or None where they have none (the caller runs it on the whole blocks)."""
    from triton.runtime.interpreter import TensorHandle

    shaped = [h for h in handles if is_tailed(h)]
    if not shaped:
        return None
    lanes = shaped[0].lanes
    live = max(len(h.live) for h in shaped)
    parts = [_split(h, lanes, live) for h in handles]
    if any(part is None for part in parts):
        return None
    heads = [TensorHandle(part[0], h.dtype) for part, h in zip(parts, handles, strict=True)]
    tails = [TensorHandle(part[1], h.dtype) for part, h in zip(parts, handles, strict=True)]
    head, tail = operation(*heads), operation(*tails)
    if head.data.ndim != 2 or tail.data.shape[0] != 1 or head.data.dtype != tail.data.dtype:
        return None
    return tailed(head.data, tail.data, lanes, head.dtype)


def stacked(handle: Any) -> np.ndarray:
    """A tailed block as its live lanes and one tail lane, [L + 1, programs]: the block for a maximum or minimum
    and their first index (a repeated value changes neither, and the first tail lane is lane L)."""
    programs = max(handle.live.shape[-1], handle.tail.shape[-1])
    return np.concatenate(
        [np.broadcast_to(handle.live, (len(handle.live), programs)), np.broadcast_to(handle.tail, (1, programs))]
    )


def front(handle: Any) -> np.ndarray:
    """A tailed block as the interpreter holds each program's block: [programs, lanes], each row contiguous, built
    without the whole block's transposition (a tail of zeros costs no pass: fresh zeroed pages)."""
    programs = max(handle.live.shape[-1], handle.tail.shape[-1])
    zeros = not np.ascontiguousarray(handle.tail).view(np.uint8).any()  # every bit zero: +0, not -0
    rows = (np.zeros if zeros else np.empty)((programs, handle.lanes), dtype=handle.live.dtype)
    live = len(handle.live)
    rows[:, :live] = handle.live.T
    if not zeros:
        rows[:, live:] = handle.tail.T
    return rows
