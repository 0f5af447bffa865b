"""Exact but slow engines: transformers' assisted generation patched to waste time or drafts.

Their output is distributed exactly as the target says (every exactness property passes them);
the speed properties must not:

* ``keeps_one_token_per_pass``: every pass keeps only its first token (the first accepted draft, or
  the correction) and throws the rest away: exact, because where a pass stops does not depend on the
  tokens it throws away, but one token per pass where its acceptance allows about two;
* ``target_twice_per_pass``: every pass runs the target a second time over the whole sequence
  and throws the result away: its passes cost more than its components explain. Its target has 8
  layers, so the target weighs in a pass as it does in a real pair: with the 2-layer target of
  ``transformers-assisted`` a target run is a sixth of a pass (transformers drafts with a whole
  ``generate`` call), the second run costs about 17%, only 7 points past the property's 10%
  margin, and the sign test over rounds catches it in about 4 runs of 10.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers.generation.utils as generation_utils

from spectest import rules as R

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


class TargetTwicePerPass(Patched):
    def patch(self):
        target = self.models[0]

        def twice(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                with torch.no_grad():
                    target(input_ids=candidate_ids)  # the whole sequence again, result unused
                return original(candidate_ids, candidate_logits, k, new_logits, **kwargs)

            return call

        return replaced(generation_utils, "_speculative_sampling", twice)


keeps_one_token_per_pass = KeepsOneTokenPerPass()
target_twice_per_pass = TargetTwicePerPass(target_layers=8)

TOKENS = "test_tokens_per_pass_follow_the_engines_acceptance"
SPEED = "test_engine_speedup_follows_its_model"
BUGS = {
    "keeps_one_token_per_pass": {TOKENS: (R.ACCEPTANCE_TRIALS,)},
    "target_twice_per_pass": {SPEED: (R.E2E_SPEEDUP_AGREES,)},
}
