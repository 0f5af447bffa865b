"""Exact but slow engines: transformers' assisted generation patched to waste time or drafts.

Their output is distributed exactly as the target says (every exactness property passes them);
the speed properties must not:

* ``keeps_one_token_per_pass``: every pass keeps only its first token (the first accepted draft, or
  the correction) and throws the rest away: exact, because where a pass stops does not depend on the
  tokens it throws away, but one token per pass where its acceptance allows about two;
* ``target_thrice_per_pass``: every pass runs the target twice more over the whole sequence and
  throws the results away: its passes cost more than its components explain. Its target has 8
  layers, so the target weighs in a pass as it does in a real pair (with the 2-layer target of
  ``transformers-assisted`` a target run is a sixth of a pass: transformers drafts with a whole
  ``generate`` call). One wasted run was not enough: at about 0.62 of the prediction per round
  (median), the noise of a shared machine's prediction put 4 of 23 rounds past the 10% margin in one
  CI run, one more than the sign test over rounds may miss; two wasted runs put it near 0.45.

``transformers_assisted_counted`` and ``target_thrice_counted`` are ``transformers-assisted`` and
``target_thrice_per_pass`` reporting their passes only as vLLM's counters do (``pass_counts``: passes and
K drafts each, nothing per pass), and running in a process of their own (:mod:`spectest.e2e.isolated`,
their parts timed there, on its CPU clock): the speed property is held to what a real engine reports,
where a real engine runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers.generation.utils as generation_utils

from spectest import rules as R
from spectest.e2e.engines.transformers_loops import TRANSFORMERS_ASSISTED, TransformersAssisted
from spectest.e2e.isolated import IsolatedWithDraft

# The patching helpers of the known-buggy engines beside this file (loaded by path: this file is
# resolved by path too, from any directory).
_spec = importlib.util.spec_from_file_location(
    "spectest_engines_patching", Path(__file__).with_name("buggy_transformers.py")
)
_buggy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_buggy)
Patched, replaced = _buggy.Patched, _buggy.replaced


class KeepsOneTokenPerPass(Patched):
    """Not the tempting "drop the last accepted draft and resample it from the target": that one
    is lossy (it peeks at whether the next draft was rejected, which depends on the token it
    replaces) and the output property catches it."""

    def patch(self):
        def first_only(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                valid, _ = original(candidate_ids, candidate_logits, k, new_logits, **kwargs)
                return valid[:, :1], torch.tensor(0)

            return call

        return replaced(generation_utils, "_speculative_sampling", first_only)


class TargetThricePerPass(Patched):
    wasted_runs = 2

    def patch(self):
        target = self.models[0]

        def wasteful(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                with torch.no_grad():
                    for _ in range(self.wasted_runs):
                        target(input_ids=candidate_ids)  # the whole sequence again, result unused
                return original(candidate_ids, candidate_logits, k, new_logits, **kwargs)

            return call

        return replaced(generation_utils, "_speculative_sampling", wasteful)


class CountedLikeVllm:
    """``engine`` reporting after each call only ``pass_counts`` (the passes it ran and K drafts for each, as
    vLLM's ``spec_decode_num_drafts`` and ``num_draft_tokens`` do), nothing per pass; the rest is ``engine``'s."""

    passes = tokens_per_pass = draft_lengths = None  # hidden: a real engine does not report them

    def __init__(self, engine) -> None:
        self._engine = engine
        self.pass_counts: dict[str, int] | None = None

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def generate(self, prompts, params, max_new_tokens, seed):
        outputs = self._engine.generate(prompts, params, max_new_tokens, seed)
        passes = sum(self._engine.passes)
        self.pass_counts = {"passes": passes, "draft_tokens": passes * self._engine.k}
        return outputs


def build_counted(*, thrice: bool) -> CountedLikeVllm:
    """The engine in the child: torch on one thread (the child's clock counts every thread's CPU)."""
    torch.set_num_threads(1)
    return CountedLikeVllm(TargetThricePerPass(target_layers=8) if thrice else TRANSFORMERS_ASSISTED)


class InItsOwnProcess(IsolatedWithDraft):
    """A counted loop in a child process, declared as ``transformers-assisted`` is."""

    spectest_engine_capabilities = TransformersAssisted.spectest_engine_capabilities
    spectest_draft_warps = TransformersAssisted.spectest_draft_warps

    def __init__(self, name: str, *, thrice: bool) -> None:
        super().__init__(name, f"{__file__}:build_counted", {"thrice": thrice})


keeps_one_token_per_pass = KeepsOneTokenPerPass()
target_thrice_per_pass = TargetThricePerPass(target_layers=8)
transformers_assisted_counted = InItsOwnProcess("transformers_assisted_counted", thrice=False)
target_thrice_counted = InItsOwnProcess("target_thrice_counted", thrice=True)

TOKENS = "test_tokens_per_pass_follow_the_engines_acceptance"
SPEED = "test_engine_speedup_follows_its_model"
BUGS = {
    "keeps_one_token_per_pass": {TOKENS: (R.ACCEPTANCE_TRIALS,)},
    "target_thrice_per_pass": {SPEED: (R.E2E_SPEEDUP_AGREES,)},
    "target_thrice_counted": {SPEED: (R.E2E_SPEEDUP_AGREES,)},
}
