"""Exact but slow engines: transformers' assisted generation patched to waste time or drafts.

Their output is distributed exactly as the target says (every exactness property passes them);
the speed properties must not:

* ``discards_last_accepted_draft``: every pass drops its last accepted draft and samples that
  position afresh from the target (exact, one token fewer per pass): it accepts fewer drafts than
  its own acceptance allows;
* ``target_twice_per_pass``: every pass runs the target a second time over the whole sequence
  and throws the result away: its passes cost more than its components explain.
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


class DiscardsLastAcceptedDraft(Patched):
    def patch(self):
        def discarding(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                valid, accepted = original(candidate_ids, candidate_logits, k, new_logits, **kwargs)
                n = int(accepted)
                if n == 0:
                    return valid, accepted
                fresh = torch.multinomial(new_logits[:, n - 1].softmax(dim=-1), num_samples=1)
                return torch.cat((candidate_ids[:, -k:][:, : n - 1], fresh), dim=-1), torch.tensor(n - 1)

            return call

        return replaced(generation_utils, "_speculative_sampling", discarding)


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


discards_last_accepted_draft = DiscardsLastAcceptedDraft()
target_twice_per_pass = TargetTwicePerPass()

TOKENS = "test_tokens_per_pass_follow_the_engines_acceptance"
SPEED = "test_engine_speedup_follows_its_model"
BUGS = {
    "discards_last_accepted_draft": {TOKENS: (R.ACCEPTANCE_TRIALS,)},
    "target_twice_per_pass": {SPEED: (R.E2E_SPEEDUP_AGREES,)},
}
