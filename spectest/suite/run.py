"""A property in progress: Hypothesis settings and seeds, contract-checked calls, verdicts.

Hypothesis draws each case (sizes, kinds, a sampling seed); all sampling inside a case is
seeded from that draw, and Hypothesis itself is seeded from the run's ``--spec-seed``. A run is
therefore replayed exactly by its seed, and a failing case shrinks without ever being Flaky.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import hypothesis
import numpy as np
import pytest
import torch
from hypothesis import Phase
from hypothesis import strategies as st

from spectest import rules
from spectest.cases.settings import profile_for_budget
from spectest.protocol import (
    BLOCK_VERIFICATION,
    ContractViolation,
    Model,
    call_propose,
    call_verify,
    call_verify_logits,
)
from spectest.sampling import make_generator
from spectest.sampling_params import SamplingParams
from spectest.session import RECORD_KEY, SpecSession, examples_for, missing_capabilities
from spectest.speed.clock import OWN_CLOCK, Ledger, cpu_time
from spectest.speed.memory import keep_freed_memory
from spectest.statistics.checks import DistributionCheck
from spectest.statistics.chisquare import FitResult
from spectest.suite.loop import Generation, generate
from spectest.tree_protocol import call_verify_tree


def share_cores_with_other_workers() -> None:
    """Under pytest-xdist, give each worker's torch its share of the cores (unless the user chose a
    thread count): N workers with a full pool each oversubscribe the machine, and on 2 cores that
    made the suite twice as slow as one process."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if (
        workers > 1
        and "OMP_NUM_THREADS" not in os.environ
        and not getattr(share_cores_with_other_workers, "done", False)
    ):
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
        share_cores_with_other_workers.done = True  # type: ignore[attr-defined]


# A check may take up to BORROW_LIMIT times its equal share of the property's remaining time,
# leaving each later check at least BORROW_RESERVE of an initial share.
BORROW_LIMIT = 2.0
BORROW_RESERVE = 0.5


def check_allowance(budget: float, spent: float, planned: int, started: int) -> float:
    """Own time the ``started``-th of a property's ``planned`` checks may take, ``spent`` of its
    ``budget`` being gone: its equal share of what is left, or up to BORROW_LIMIT times that when
    the checks still to come keep BORROW_RESERVE of an initial share each. One expensive case of a
    fast implementation then runs at its planned size, and a slow implementation still gives
    every check at least half its share (each check also takes its minimum draws)."""
    remaining_checks = max(1, planned - started + 1)
    remaining = budget - spent
    equal = remaining / remaining_checks
    reserve = (remaining_checks - 1) * BORROW_RESERVE * budget / max(1, planned)
    return max(1e-9, equal, min(BORROW_LIMIT * equal, remaining - reserve))


EXPLICIT_EXAMPLE_NOTE = "Failing explicit example"


def drop_explicit_example_note(skip: BaseException) -> None:
    """A skip raised inside an explicit case, without the note Hypothesis adds to every exception from
    one ("Failing explicit example: ..."): a skip is no failure, and the note made the reason read as one
    (a real engine's efficiency figures, reported by a skip, came out under "Failing explicit example")."""
    notes = getattr(skip, "__notes__", None)
    if notes:
        skip.__notes__ = [note for note in notes if not note.startswith(EXPLICIT_EXAMPLE_NOTE)]


class StatisticalFailure(AssertionError):
    """A distribution check rejected exactness at the run's per-check significance level."""

    kind = "statistical"

    def __init__(self, message: str, *, check: str) -> None:
        super().__init__(message)
        self.rule = check  # the distribution check that rejected, e.g. "joint sequence distribution"


class HarnessError(RuntimeError):
    """The harness itself is wrong (a property breaks its own declaration), not the implementation."""


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays (also inside lists, tuples and dicts) as Python values."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class SuiteRun:
    """One property on one subject (a verifier model or an engine): what it declared (``marker``:
    examples, checks, explicit), the run's configuration, and the verdicts it reaches. The
    statistics, seeds, budgets and verdicts are the same for every subject; :class:`PropertyRun`
    adds the verifier's calls, :class:`spectest.e2e.run.EngineRun` an engine's."""

    replay_flag = "--spec-model"

    def __init__(self, session: SpecSession, model: Any, node: pytest.Item, marker: dict[str, Any]) -> None:
        self.session = session
        self.model = model
        self.node = node
        if missing := missing_capabilities(marker, model.capabilities):
            pytest.skip(f"{model.name} does not have capability {', '.join(missing)} (see docs/reference/protocols.md)")
        if marker.get("exact_only") and session.max_tv_for(model) is not None:
            pytest.skip(
                f"{model.name} runs in lossy mode: this property tests exactness every token its own cell, which a "
                "lossy model is allowed to miss; its loss is measured by the other output properties"
            )
        self.device = torch.device(session.device)
        self.explicit = int(marker.get("explicit", 0))
        self.examples = examples_for(marker, session.budget)
        self.declared_checks = int(marker.get("checks", 1))
        self.concluded = 0  # statistical conclusions in the current example
        self.alpha = session.alpha_per_check(model.name)
        self.test_name = getattr(node, "originalname", node.name)
        self.replay = session.replay_command(model, self.test_name, flag=self.replay_flag)
        # Lossy mode: the largest TV per emitted token this model may show (None: exact).
        self.max_tv = session.max_tv_for(model)
        self.ledger = Ledger(cpu_time if self.device.type == "cpu" else OWN_CLOCK)
        share_cores_with_other_workers()
        keep_freed_memory()
        self.checks_started = 0
        self.planned_checks = self.examples * self.declared_checks
        # Own time the implementation's calls may take in this property's distribution checks.
        self.budget = session.implementation_budget(model, self.planned_checks)
        self.tolerance = session.tolerance_for(model)  # the TV its checks are planned to detect

    def __repr__(self) -> str:
        return f"<spectest property {self.test_name} on {self.model.name}, alpha per check {self.alpha:.3g}>"

    @property
    def lossy(self) -> bool:
        return self.max_tv is not None

    def distribution(
        self,
        name: str,
        probs: np.ndarray,
        *,
        case_seed: int = 0,
        tokens: int = 1,
        time_budget: float | None = None,
        **kwargs: Any,
    ) -> DistributionCheck:
        """A distribution check at this run's per-check level and tolerance (see spectest.statistics.checks).
        In lossy mode an output-distribution check measures TV instead, its limit the model's
        maximum per token times ``tokens``, the tokens each cell spans (TV of an L-token joint is
        at most the sum of its L per-token distances). ``time_budget``: the allowance of checks
        that share their draws (see :meth:`shared_allowance`); by default the check's own."""
        measured = None
        if self.max_tv is not None and name in rules.OUTPUT_DISTRIBUTIONS:
            measured = (min(1.0, self.max_tv * tokens), tokens)
        return DistributionCheck(
            name,
            probs,
            alpha=self.alpha,
            tolerance=self.tolerance,
            seed=case_seed,
            time_budget=time_budget if time_budget is not None else self._check_budget(),
            spent=lambda: self.ledger.total("calls"),
            ledger=self.ledger,
            measured=measured,
            **kwargs,
        )

    def _check_budget(self) -> float | None:
        """Own time the implementation may spend in the next distribution check (see
        :func:`check_allowance`). Only the implementation's own time counts, so a busy machine,
        or slow input generation, never cuts a check short."""
        self.checks_started += 1
        if self.budget is None:
            return None
        return check_allowance(self.budget, self.ledger.total("calls"), self.planned_checks, self.checks_started)

    def shared_allowance(self, checks: int) -> float | None:
        """Own time for ``checks`` distribution checks fed by the same draws (an engine's call feeds
        every PIT check of a case at once): the sum of their shares, each check running on all of it."""
        allowances = [self._check_budget() for _ in range(checks)]
        return None if allowances[0] is None else sum(allowances)  # type: ignore[arg-type]

    def finish(self) -> None:
        """Record how the property's time split between inputs, the implementation and the statistics."""
        if self.checks_started or self.ledger.total("calls"):
            self.record({"timing": self.ledger.split()})

    def given(
        self, strategy: st.SearchStrategy[Any], body: Callable[[Any], None], *, explicit: Sequence[Any] = ()
    ) -> None:
        """Run ``body`` on cases drawn from ``strategy`` (explicit cases first), with this run's
        example count, seed and shrinking policy. Statistical failures and contract violations
        propagate with their messages."""
        __tracebackhide__ = True
        if len(explicit) > self.explicit:
            raise HarnessError(
                f"{self.test_name}: its marker declares at most {self.explicit} explicit cases, got {len(explicit)}"
            )
        phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if self.session.shrink else [])
        # Fewer explicit cases than declared (they may depend on the model) leave room for generated
        # ones: the examples, and so the checks the significance split counted, stay the same.
        settings = hypothesis.settings(
            profile_for_budget(self.session.budget.name),
            max_examples=self.examples - len(explicit),
            phases=phases,
            derandomize=False,
        )

        def run(case: Any) -> None:
            __tracebackhide__ = True
            self.concluded = 0
            body(case)

        for case in explicit:
            run = hypothesis.example(case)(run)
        run = hypothesis.given(strategy)(run)
        run = settings(run)
        seed_text = f"{self.session.seed}:{self.test_name}:{self.model.source}"
        try:
            hypothesis.seed(zlib.crc32(seed_text.encode()))(run)()
        except pytest.skip.Exception as skip:
            drop_explicit_example_note(skip)
            raise

    def generators(self, seed: int) -> tuple[torch.Generator, torch.Generator]:
        """Independent generators for the harness's own draws and for the verifier."""
        return make_generator(seed, self.device), make_generator(seed ^ 0x5DEECE66D, self.device)

    def markov_sequences(
        self, check: DistributionCheck, target: Any, draft: Any, case: Any, *, per_call: int = 50_000
    ) -> Iterator[tuple[Generation, int]]:
        """Whole sequences of a Markov case's pair (``target``, ``draft``: the case's chains; ``case``: its
        ``length``, ``k``, ``dtype`` and ``seed``) through this run's verifier, batch after batch until ``check``
        has its draws: each batch's generation and how many sequences it holds."""
        draft_gen, verify_gen = self.generators(case.seed)
        while not check.done:
            n = check.next_batch(per_call)
            run = generate(
                self.verify,
                target,
                draft,
                n_sequences=n,
                length=case.length,
                k=case.k,
                draft_generator=draft_gen,
                verify_generator=verify_gen,
                device=self.device,
                dtype=getattr(torch, case.dtype),
            )
            yield run, n

    def require(self, ok: bool, rule: str, detail: str) -> None:
        """An exact check: fail naming the model and the rule."""
        __tracebackhide__ = True
        if not ok:
            raise ContractViolation(self.model.name, rule, f"{detail}\nreplay: {self.replay}")

    def record(self, figures: dict[str, Any]) -> None:
        """Record figures that are reported, not judged (efficiency, tokens per pass, ...), as plain
        Python values: a worker sends them to the controller, which takes no numpy scalars."""
        self.node.user_properties.append(
            (
                RECORD_KEY,
                {"kind": "figure", "model": self.model.name, "property": self.test_name, "seed": self.session.seed}
                | {name: plain(value) for name, value in figures.items()},
            )
        )

    def require_possible(
        self,
        check: DistributionCheck,
        describe: Callable[[int, int], str],
        context: str,
        *,
        rule: str = rules.NEVER_IMPOSSIBLE,
        source: str = "target",
    ) -> None:
        """Exact check: no cell of expected probability zero was ever observed."""
        __tracebackhide__ = True
        hit = check.impossible()
        if hit is not None:
            group, cell, count = hit
            self.require(
                False,
                rule,
                f"{describe(group, cell)} has {source} probability 0 but came out {count} times ({context})",
            )

    def conclude(self, check: DistributionCheck, *, context: str, started: float | None = None) -> None:
        """The verdict of a finished distribution check (records it; fails on rejection)."""
        __tracebackhide__ = True
        self.check_fit(check.result(), context=context, started=started)

    def _count_conclusion(self) -> None:
        self.concluded += 1
        if self.concluded > self.declared_checks:
            raise HarnessError(
                f"{self.test_name} reached {self.concluded} statistical conclusions in one example but its "
                f"spec_property marker declares checks={self.declared_checks}: the significance split would be "
                "wrong (every check would get more than its share of --spec-alpha); fix the marker"
            )

    def conclude_exact_law(self, passed: bool, rule: str, detail: str) -> None:
        """The verdict of a test against an exact law that is not a distribution over cells (a count's
        two-sided tail, say): counted against the marker's checks like any conclusion, failing as a
        statistical failure at this run's per-check level."""
        __tracebackhide__ = True
        self._count_conclusion()
        if not passed:
            raise StatisticalFailure(
                f"[{self.model.name}] {rule}: rejected ({detail}).\n"
                f"A correct implementation fails this check with probability {self.alpha:.2g}.\n"
                f"replay: {self.replay}",
                check=rule,
            )

    def check_fit(self, result: FitResult, *, context: str, started: float | None = None) -> None:
        """Record a distribution check and fail if it rejects exactness."""
        __tracebackhide__ = True
        self._count_conclusion()
        record = (
            {"kind": "check"}
            | result.as_record()
            | {
                "model": self.model.name,
                "property": self.test_name,
                "seed": self.session.seed,
                "context": context,
                "duration_s": time.perf_counter() - started if started is not None else None,
            }
        )
        if result.time_limited:
            record["below_plan_because"] = (
                f"the implementation's own time in its calls reached this property's budget of {self.budget:.3g} s"
            )
        self.node.user_properties.append((RECORD_KEY, record))
        if not result.passed and result.measured is not None:
            raise StatisticalFailure(
                f"[{self.model.name}] output is further from the target than its declared maximum TV ({context}).\n"
                f"{result.summary()}\n"
                f"A model within its maximum fails this check with probability {self.alpha:.2g}.\n"
                f"replay: {self.replay}",
                check=rules.WITHIN_MAX_TV,
            )
        if not result.passed:
            raise StatisticalFailure(
                f"[{self.model.name}] output is not distributed as the target ({context}).\n"
                f"{result.summary()}\n"
                f"A correct implementation fails this check with probability {self.alpha:.2g}.\n"
                f"replay: {self.replay}",
                check=result.rule or result.check.partition(", pooled ")[0],
            )


# A subject that runs Triton kernels in Triton's interpreter costs what the interpreter costs: about 0.1-1 us a cell
# (a probability of p or q) batched (spectest.gpu.interpreter), 100 times that program by program. Its calls are
# never held to --spec-timeout alone: a call's limit is that plus INTERPRETED_SLACK times its cells at the slowest
# rate the model's calls of LARGE_CALL cells or more have shown in this process (INTERPRETED_PRIOR before any has),
# so a call slow because the interpreter is slow passes while a hang still fails, later by that margin.
INTERPRETED_SLACK = 20.0
INTERPRETED_PRIOR = 2e-6
LARGE_CALL = 1 << 16
_RATES: dict[str, float] = {}  # model name -> slowest seconds per cell seen in a large call


def interpreted_timeout(model: Model, base: float, cells: int) -> float:
    """The time limit of one call of ``cells`` cells (see INTERPRETED_SLACK); ``base`` for a compiled subject, or
    when the run has no time limit (0)."""
    if not model.interpreted or not base:
        return base
    return base + INTERPRETED_SLACK * _RATES.get(model.name, INTERPRETED_PRIOR) * cells


def record_rate(model: Model, seconds: float, cells: int) -> None:
    if model.interpreted and cells >= LARGE_CALL:
        _RATES[model.name] = max(_RATES.get(model.name, 0.0), seconds / cells)


class PropertyRun(SuiteRun):
    """A verifier property: its calls go through the protocol's contract (shape, dtype, ids,
    exceptions, hangs) and are timed as the implementation's own."""

    def __init__(self, session: SpecSession, model: Model, node: pytest.Item, marker: dict[str, Any]) -> None:
        super().__init__(session, model, node, marker)
        # Declared standard token-wise rejection sampling: p = q then means certain acceptance.
        # A top-k tree model's chain view hands it one-hot drafts: not the chain's standard rule.
        self.tree_standard = "standard-rejection" in model.capabilities
        self.block = BLOCK_VERIFICATION in model.capabilities  # held to the block model instead
        self.standard = self.tree_standard and not (
            getattr(model.verify, "spectest_chain_view", False) and model.tree_drafting == "top-k"
        )

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        generator: torch.Generator,
        *,
        num_draft_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cells = target_probs.numel() + draft_probs.numel()
        started = time.perf_counter()
        with self.ledger.measure("calls"):
            emitted = call_verify(
                self.model,
                draft_token_ids,
                draft_probs,
                target_probs,
                generator,
                timeout=interpreted_timeout(self.model, self.session.timeout, cells),
                num_draft_tokens=num_draft_tokens,
            )
        record_rate(self.model, time.perf_counter() - started, cells)
        return emitted

    def verify_logits(
        self,
        draft_token_ids: torch.Tensor,
        draft_logits: torch.Tensor,
        target_logits: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> torch.Tensor:
        cells = target_logits.numel() + draft_logits.numel()
        started = time.perf_counter()
        with self.ledger.measure("calls"):
            emitted = call_verify_logits(
                self.model,
                draft_token_ids,
                draft_logits,
                target_logits,
                params,
                generator,
                timeout=interpreted_timeout(self.model, self.session.timeout, cells),
            )
        record_rate(self.model, time.perf_counter() - started, cells)
        return emitted

    def verify_tree(
        self,
        parents: torch.Tensor,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        timeout = interpreted_timeout(self.model, self.session.timeout, target_probs.numel() + draft_probs.numel())
        with self.ledger.measure("calls"):
            return call_verify_tree(
                self.model, parents, draft_token_ids, draft_probs, target_probs, generator, timeout=timeout
            )

    def propose(
        self, draft_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.ledger.measure("calls"):
            timeout = interpreted_timeout(self.model, self.session.timeout, draft_logits.numel())
            return call_propose(self.model, draft_logits, params, generator, timeout=timeout)
