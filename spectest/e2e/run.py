"""A property in progress on an engine: the suite's statistics, seeds and verdicts, the engine's calls.

Every call goes through the engine contract (:mod:`spectest.e2e.protocol`) and is timed as the
engine's own time, so ``--spec-run-seconds`` budgets a slow engine the way it budgets a slow
verifier: a check that runs out concludes with the draws it has and says what it can still detect.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from spectest.e2e.cases import EngineCase, Requests, draw_requests
from spectest.e2e.protocol import EngineModel, PassRecord, call_generate, call_logits
from spectest.sampling_params import SamplingParams
from spectest.session import SpecSession
from spectest.suite.run import SuiteRun


class EngineRun(SuiteRun):
    """One end-to-end property on one engine."""

    replay_flag = "--spec-engine"

    def __init__(self, session: SpecSession, engine: EngineModel, node: pytest.Item, marker: dict[str, Any]) -> None:
        super().__init__(session, engine, node, marker)
        self.engine = engine

    @property
    def order(self) -> tuple[str, ...]:
        return self.engine.filter_order

    def requests(self, case: EngineCase, call: int) -> Requests:
        """The ``call``-th batch of ``case``, with only the parameters the engine takes."""
        engine = self.engine
        return draw_requests(
            case,
            engine.vocab_size,
            call,
            engine.sampling_params,
            tokens=engine.prompt_tokens,
            prefix=engine.prompt_prefix,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> list[list[int]]:
        with self.ledger.measure("calls"):
            return call_generate(self.engine, prompts, params, max_new_tokens, seed, timeout=self.session.timeout)

    def plain_generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> list[list[int]]:
        with self.ledger.measure("calls"):
            return call_generate(
                self.engine,
                prompts,
                params,
                max_new_tokens,
                seed,
                timeout=self.session.timeout,
                method="plain_generate",
            )

    # Teacher forcing is the adapter's code (the budget counts it with the calls), but it is work the
    # harness asks for to score the engine, not the engine's generation: the report shows it apart.
    def target_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        with self.ledger.measure("calls"), self.ledger.measure("scoring"):
            return call_logits(self.engine, "target", sequences, timeout=self.session.timeout)

    def draft_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        with self.ledger.measure("calls"), self.ledger.measure("scoring"):
            return call_logits(self.engine, "draft", sequences, timeout=self.session.timeout)

    def pass_record(self, prompts: int) -> PassRecord:
        return self.engine.pass_record(prompts)
