"""One distribution check from plan to verdict: the statistics every property uses.

1. Plan: the fewest draws that detect ``tolerance`` (TV) with power 0.99 at the check's level.
2. Sample in growing batches; after each, update an anytime-valid e-process over bins fixed by
   the plan, and stop the moment it rejects (gross bugs fail after a few hundred draws).
3. Conclude at the planned size with the pooled Pearson test (G and the TV interval reported).

Cells are pooled in more than one *view* (orderings fixed before sampling): by probability or
draft/target ratio, where acceptance bugs move mass, and by token id, where indexing and
inverse-CDF bugs move it. The fixed tests of the views are combined by Bonferroni, their
e-processes by averaging (an average of test martingales is one). The check's level is split
between the sequential and the fixed test (union bound), so a correct implementation fails it
with probability at most ``alpha`` whatever happens.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import logsumexp

from spectest.speed.clock import Ledger
from spectest.statistics.chisquare import FitResult, Group, chisquare_groups, plan_draws, pool_cells
from spectest.statistics.sequential import MixtureEProcess
from spectest.statistics.sparse import in_sparse_regime, sparse_identity_test
from spectest.statistics.tv import measure_tv

# Lossy mode: a TV interval per group needs many draws in each group, not only the few a pooled
# exactness test needs; measured checks plan at least this many (the time budget still caps them).
MEASURED_DRAWS = 4000
SEQUENTIAL_SHARE = 0.5  # fraction of a check's alpha spent on early stopping
FIRST_BATCH = 256

Orders = Sequence[np.ndarray | None]  # one pooling order per group; None = ascending probability


@dataclass
class _View:
    name: str
    orders: Orders
    bin_index: np.ndarray  # [G, C] global bin id, -1 for impossible or unplanned cells
    eprocess: MixtureEProcess


class _DeviceTally:
    """A check's counts on the device that made them (torch tensors): looks bin them there, so a look moves the
    views' bin totals, not the table; the table crosses to the CPU when read, once per new batch."""

    def __init__(self, like: Any, views: Sequence[_View]) -> None:
        import torch

        self.counts = torch.zeros(like.shape, dtype=torch.int64, device=like.device)
        self.pending = torch.zeros_like(self.counts)
        self.bins = []
        for view in views:
            valid = view.bin_index >= 0
            self.bins.append(
                (
                    torch.from_numpy(np.flatnonzero(valid)).to(like.device),
                    torch.from_numpy(view.bin_index[valid]).to(like.device),
                    view.eprocess.counts.size,
                )
            )
        self._table: np.ndarray | None = None

    def add(self, counts: Any) -> None:
        self.counts += counts
        self.pending += counts
        self._table = None

    def look(self) -> list[np.ndarray]:
        """Each view's bin totals of the counts not yet looked at (float64, as numpy's weighted bincount)."""
        import torch

        flat = self.pending.view(-1)
        binned = [
            torch.bincount(index, weights=flat[cells].double(), minlength=size).cpu().numpy()
            for cells, index, size in self.bins
        ]
        self.pending.zero_()
        return binned

    def waiting(self) -> bool:
        return bool(self.pending.any())

    def at(self, cells: np.ndarray) -> np.ndarray:
        import torch

        return self.counts.view(-1)[torch.from_numpy(cells).to(self.counts.device)].cpu().numpy()

    def table(self) -> np.ndarray:
        if self._table is None:
            self._table = self.counts.cpu().numpy()
        return self._table


def token_id_orders(groups: int, cells: int) -> Orders:
    return [np.arange(cells)] * groups


class DistributionCheck:
    def __init__(
        self,
        name: str,
        probs: np.ndarray,
        *,
        alpha: float,
        tolerance: float,
        min_draws: int,
        max_draws: int,
        reach: np.ndarray | None = None,
        views: Mapping[str, Orders] | None = None,
        labels: Sequence[str] | None = None,
        cell_name: Callable[[int], str] | None = None,
        seed: int = 0,
        time_budget: float | None = None,
        spent: Callable[[], float] | None = None,
        ledger: Ledger | None = None,
        measured: tuple[float, int] | None = None,
        first_look: int = FIRST_BATCH,
        strata: np.ndarray | None = None,
    ) -> None:
        """``probs`` [G, C]: exact probabilities of each group's cells; ``reach`` [G]: expected
        samples per group per draw (1 if every draw lands in every group); ``views``: pooling
        orders by name (default: by probability, and by token id); ``measured``: (limit, tokens per
        cell) for lossy mode, where the check runs to its plan and the TV interval decides
        (spectest.statistics.tv); ``time_budget``: seconds of
        the implementation's own time (``spent()``, cumulative) after which the check concludes
        with the draws it has (at least ``min_draws``). Time does not depend on the counts, so
        stopping on it keeps the fixed test valid; ``ledger`` accounts the statistics' own time;
        ``first_look``: draws before the e-processes first look (then at every doubling), fewer
        where one draw is expensive (an engine's whole generate call); ``strata`` [G]: groups
        that are independent given their sample sizes share a stratum (rows of a call at one
        position): where the plan leaves many tokens expected below once, a test that keeps every
        token its own cell joins the pooled views (spectest.statistics.sparse), with its share of the level."""
        self.ledger = ledger
        self.measured = measured
        self.time_budget = time_budget or None
        self.spent = spent or time.perf_counter
        self.started = self.spent()
        self.name = name
        self.probs = probs
        groups, cells = probs.shape
        self.reach = np.ones(groups) if reach is None else np.asarray(reach, dtype=np.float64)
        if views is None:
            views = {"by probability": [None] * groups, "by token id": token_id_orders(groups, cells)}
        self.labels = list(labels) if labels is not None else [""] * groups
        self.cell_name = cell_name
        self.seed = seed
        self.alpha = alpha
        self.alpha_sequential = alpha * SEQUENTIAL_SHARE
        self.alpha_fixed = alpha - self.alpha_sequential
        self.tolerance = tolerance
        # Lossy mode measures TV; the sparse test detects deviations, which a lossy model is allowed.
        self.strata = None if strata is None or measured is not None else np.asarray(strata)
        with self._statistics():
            # The regime is decided before sampling, from the plan (probabilities, reach, level), never
            # from the counts: planned with the sparse test's share of the level first, and again
            # without it where the plan leaves too few tokens expected below once to test.
            def plan(tests: int) -> tuple[int, float]:
                return plan_draws(
                    self.reach,
                    (probs > 0).sum(axis=1),
                    probs.max(axis=1),
                    alpha=self.alpha_fixed / tests,
                    tolerance=tolerance,
                    min_draws=min_draws,
                    max_draws=max_draws,
                )

            self.planned, self.planned_mde = plan(len(views) + 1) if self.strata is not None else plan(len(views))
            self.sparse = self.strata is not None and in_sparse_regime(probs, self.planned * self.reach)
            if self.strata is not None and not self.sparse:
                self.planned, self.planned_mde = plan(len(views))
            self.alpha_view = self.alpha_fixed / (len(views) + self.sparse)
            if measured is not None:
                self.planned = max(self.planned, min(max_draws, MEASURED_DRAWS))
            self.views = [self._view(view_name, list(orders)) for view_name, orders in views.items()]
        self._counts = np.zeros(probs.shape, dtype=np.int64)
        self.pending = np.zeros(probs.shape, dtype=np.int64)  # counts not yet shown to the e-processes
        self._waiting = False  # whether pending holds counts (a flag: scanning the table costs a pass)
        self._zero_cells: np.ndarray | None = None
        # Whether a cell of probability zero may have been counted: a table of counts may hold one anywhere; cells
        # handed one by one (add_cells) are looked at as they come.
        self._maybe_impossible = False
        self._device: _DeviceTally | None = None  # counts kept where they were made (see add)
        self.draws = 0
        self.next_look = min(first_look, self.planned)
        self.min_draws = min_draws

    def _statistics(self) -> contextlib.AbstractContextManager[None]:
        return self.ledger.measure("statistics") if self.ledger is not None else contextlib.nullcontext()

    def _view(self, name: str, orders: Orders) -> _View:
        """Bins of one view, pooled at the planned expected counts (fixed before sampling)."""
        index = np.full(self.probs.shape, -1, dtype=np.int64)
        offset = 0
        for g, (p, order) in enumerate(zip(self.probs, orders, strict=True)):
            bins = pool_cells(
                p * self.planned * self.reach[g], np.argsort(p, kind="stable") if order is None else order
            )
            index[g] = np.where(bins >= 0, bins + offset, -1)
            offset += int(bins.max()) + 1 if (bins >= 0).any() else 0
        valid = index >= 0
        mass = np.bincount(index[valid], weights=self.probs[valid], minlength=offset)
        group_of_bin = np.zeros(offset, dtype=np.int64)
        group_of_bin[index[valid]] = np.nonzero(valid)[0]
        group_mass = np.bincount(group_of_bin, weights=mass, minlength=self.probs.shape[0])
        return _View(name, orders, index, MixtureEProcess(mass / group_mass[group_of_bin], group_of_bin))

    def next_batch(self, largest: int) -> int:
        """Draws to take next: up to the next look of the e-processes, at most ``largest``, and
        no more than the time budget has room for at the speed measured so far."""
        size = max(1, min(self.next_look - self.draws, largest))
        if self.time_budget is not None and self.draws == 0:
            return min(size, max(1, self.min_draws))  # a first, small batch measures the speed
        if self.time_budget is not None:
            elapsed = max(1e-9, self.spent() - self.started)
            room = int((self.time_budget - elapsed) / (elapsed / self.draws))
            size = min(size, max(1, room, self.min_draws - self.draws))
        return size

    def add(self, counts: Any, draws: int) -> None:
        """Fold in the cell counts [G, C] of ``draws`` more draws. The e-processes look at doubling
        draw counts (256, 512, ...) and at the plan: gross bugs stop after a few hundred draws,
        and monitoring costs a handful of updates however many calls the sampling took.

        ``counts`` is a numpy array, or a torch tensor on the subject's device (a GPU): then the counts stay
        there, each look bins them there, and only the views' bin totals cross to the CPU (the whole table once,
        when the verdict is drawn)."""
        with self._statistics():
            if isinstance(counts, np.ndarray):
                if self._device is not None:
                    raise TypeError("a check fed counts on a device takes every batch there")
                self._add(counts, draws)
            else:
                if self._device is None:
                    if self.draws:
                        raise TypeError("a check fed numpy counts takes every batch as numpy")
                    self._device = _DeviceTally(counts, self.views)
                self._device.add(counts)
                self.draws += draws
                if self.draws >= self.next_look:
                    for view, binned in zip(self.views, self._device.look(), strict=True):
                        view.eprocess.update(binned)
                    self._advance_look()

    def add_cells(self, cells: Any, draws: int) -> None:
        """Fold in ``draws`` more draws given as the flat cell (``group * C + cell``) of every token they gave, a
        numpy array or torch tensor of integers: the same as :meth:`add` of their counts, at a cost that follows
        the tokens rather than the table (a call at V = 256000 emits a few dozen tokens into a table of a million
        cells). A tensor on a device other than the CPU is counted there and goes to :meth:`add`."""
        if not isinstance(cells, np.ndarray):
            if cells.device.type != "cpu":
                import torch

                self.add(torch.bincount(cells.reshape(-1), minlength=self.probs.size).view(self.probs.shape), draws)
                return
            cells = cells.numpy()
        with self._statistics():
            if self._device is not None:
                raise TypeError("a check fed counts on a device takes every batch there")
            cells, times = np.unique(cells.reshape(-1), return_counts=True)
            if cells.size and (cells[0] < 0 or cells[-1] >= self.probs.size):
                raise ValueError(f"cells outside the {self.probs.shape} table of {self.name}")
            self._counts.reshape(-1)[cells] += times
            self.pending.reshape(-1)[cells] += times
            self._waiting |= bool(cells.size)
            self._maybe_impossible |= bool((self.probs.reshape(-1)[cells] <= 0).any())
            self.draws += draws
            if self.draws >= self.next_look:
                self._look()

    @property
    def counts(self) -> np.ndarray:
        """The cell counts so far [G, C] (from the device, if they were kept there, at each read)."""
        return self._device.table() if self._device is not None else self._counts

    def _add(self, counts: np.ndarray, draws: int) -> None:
        self._counts += counts
        self.pending += counts
        self._waiting = self._maybe_impossible = True
        self.draws += draws
        if self.draws >= self.next_look:
            self._look()

    def _look(self) -> None:
        """Show the e-processes what came since their last look."""
        for view in self.views:
            valid = view.bin_index >= 0
            binned = np.bincount(
                view.bin_index[valid], weights=self.pending[valid], minlength=view.eprocess.counts.size
            )
            view.eprocess.update(binned)
        self.pending[:] = 0
        self._waiting = False
        self._advance_look()

    def _advance_look(self) -> None:
        self.next_look = min(self.planned, 2 * self.draws) if self.draws < self.planned else self.draws + 1

    @property
    def log_e(self) -> float:
        """Log of the averaged e-process over the views."""
        return float(logsumexp([view.eprocess.log_e for view in self.views]) - math.log(len(self.views)))

    @property
    def rejected_early(self) -> bool:
        """The e-process tests exactness: in lossy mode it reports but never stops the check."""
        return self.measured is None and self.log_e >= math.log(1 / self.alpha_sequential)

    @property
    def out_of_time(self) -> bool:
        return (
            self.time_budget is not None
            and self.draws >= self.min_draws
            and self.spent() - self.started >= self.time_budget
        )

    @property
    def done(self) -> bool:
        waiting = self._device.waiting() if self._device is not None else self._waiting
        return self.rejected_early or (self.draws >= self.planned and not waiting) or self.out_of_time

    def impossible(self) -> tuple[int, int, int] | None:
        """(group, cell, count) of the first cell observed although its probability is zero."""
        if self._device is None and not self._maybe_impossible:
            return None
        if self._zero_cells is None:  # the cells of probability zero, found once: looking costs a gather
            self._zero_cells = np.flatnonzero(self.probs <= 0)
        seen = self._device.at(self._zero_cells) if self._device is not None else self._counts.ravel()[self._zero_cells]
        hit = np.flatnonzero(seen > 0)
        if hit.size == 0:
            return None
        g, c = np.unravel_index(int(self._zero_cells[hit[0]]), self.probs.shape)
        return int(g), int(c), int(seen[hit[0]])

    def result(self) -> FitResult:
        """The verdict: the view with the smallest p-value, its p-value Bonferroni-corrected."""
        with self._statistics():
            return self._result()

    def _result(self) -> FitResult:
        fits = []
        for view in self.views:
            groups = [
                Group(self.counts[g], self.probs[g], self.labels[g], view.orders[g], self.cell_name)
                for g in range(self.probs.shape[0])
            ]
            fits.append(
                chisquare_groups(f"{self.name}, pooled {view.name}", groups, alpha=self.alpha_view, seed=self.seed)
            )
        sparse = (
            sparse_identity_test(self.counts, self.probs, self.strata, alpha=self.alpha_view, labels=self.labels)
            if self.sparse
            else None
        )
        fit = min(fits, key=lambda f: f.p_value)
        tests = len(self.views) + self.sparse
        if sparse is not None and sparse.p_value < fit.p_value and not self.rejected_early:
            fit.sparse_decided = True
            fit.p_value = sparse.p_value
            fit.worst_cells = sparse.worst
        fit.sparse = sparse
        fit.rule = self.name
        fit.p_value = min(1.0, fit.p_value * tests)
        fit.alpha = self.alpha_fixed
        fit.min_detectable_tv = min(f.min_detectable_tv for f in fits)
        fit.log_e_value = self.log_e
        fit.e_alpha = self.alpha_sequential
        fit.planned_draws = self.planned
        fit.draws = self.draws
        fit.tolerance = self.tolerance
        fit.time_limited = self.draws < self.planned and not self.rejected_early
        if self.measured is not None:
            limit, tokens = self.measured
            fit.measured = measure_tv(
                self.counts,
                self.probs,
                [view.bin_index for view in self.views],
                alpha=self.alpha,
                limit=limit,
                labels=self.labels,
                tokens=tokens,
            )
        if self.rejected_early:
            fit.stopped_early = True
            fit.method = "sequential"
            fit.p_value = float(min(1.0, math.exp(-self.log_e)))
        return fit
