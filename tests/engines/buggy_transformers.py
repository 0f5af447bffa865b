"""Known-buggy engines: transformers' assisted generation patched at exactly one point each.

Each is ``transformers-assisted`` (spectest.e2e.engines.transformers_loops) with one of the loop bugs
found in real engines put back in, for the duration of each request's ``generate``:
``pytest --spec-engine tests/engines/buggy_transformers.py:stale_cache``. ``BUGS`` declares the
properties that must catch each, and the rules or checks that may name it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import transformers.generation.utils as generation_utils
from transformers import DynamicCache
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.utils import GenerationMixin

from spectest import rules as R
from spectest.e2e.engines.transformers_loops import TransformersAssisted


@contextlib.contextmanager
def replaced(owner: Any, name: str, make: Any) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` while inside."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


class Patched(TransformersAssisted):
    """transformers-assisted with one patch around each request."""

    def patch(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def patches(self) -> contextlib.AbstractContextManager[None]:
        return self.patch()


def target_processors(change: Any) -> contextlib.AbstractContextManager[None]:
    """The assisted loop runs with ``change(its processor list)`` as the target's processors."""
    return replaced(
        GenerationMixin,
        "_assisted_decoding",
        lambda original: (
            lambda self, input_ids, logits_processor, *a, **k: original(
                self, input_ids, change(logits_processor), *a, **k
            )
        ),
    )


class TargetParamsNotApplied(Patched):
    """vLLM #9834: the request's temperature and filters never reach the target distributions the
    verifier compares against (the assistant still applies them to its drafts)."""

    def patch(self):
        return target_processors(lambda processors: LogitsProcessorList())


class RawDraftLogitsAsQ(Patched):
    """transformers #47932: the candidate generator drafts from the processed draft distribution but
    hands the verifier the raw draft logits as q."""

    def patch(self):
        def raw(original):
            def generate_candidates(self, generation_args):
                generation_args["generation_config"].output_logits = True
                out = self.assistant_model.generate(**generation_args, **self.assistant_kwargs)
                self.assistant_kwargs["cache"] = out.cache
                return out.sequences, torch.stack(out.logits, dim=1)

            return generate_candidates

        return replaced(AssistedCandidateGenerator, "_generate_candidates", raw)


def speculative_sampling(candidate_ids, candidate_logits, k, new_logits, *, next_row=False):
    """Token-wise rejection sampling of one pass, as transformers' loop calls it; ``next_row``:
    after a rejection at n, the correction uses the target row n + 1 (openvino.genai #4190)."""
    drafts = candidate_ids[:, -k:]
    q, p = candidate_logits.softmax(dim=-1), new_logits.softmax(dim=-1)
    positions = torch.arange(k)
    ratio = p[0, positions, drafts[0]] / q[0, positions, drafts[0]]
    accepted = int((torch.rand_like(ratio) <= ratio).to(torch.int64).cumprod(0).sum())
    if accepted < candidate_logits.shape[1]:
        row = p[:, accepted + 1] if next_row else p[:, accepted]
        residual = (row - q[:, accepted]).clamp_min(0)
        weights = residual / residual.sum()
    else:
        weights = p[:, accepted]
    extra = torch.multinomial(weights, num_samples=1)
    return torch.cat((drafts[:, :accepted], extra), dim=-1), torch.tensor(accepted)


class LogitsOneOff(Patched):
    """TensorRT-LLM #15098: the verifier is handed the target logits one position off."""

    def patch(self):
        def shifted(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                moved = torch.cat((new_logits[:, 1:], new_logits[:, -1:]), dim=1)
                return original(candidate_ids, candidate_logits, k, moved, **kwargs)

            return call

        return replaced(generation_utils, "_speculative_sampling", shifted)


class ArgmaxForSampled(Patched):
    """SGLang #31214: the platform silently verifies greedily (argmax) for requests with T > 0."""

    def patch(self):
        def greedy(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                chosen = new_logits.argmax(dim=-1)
                matches = int((candidate_ids[:, -k:] == chosen[:, :k]).to(torch.int64).cumprod(-1).sum())
                return chosen[:, : matches + 1], torch.tensor(matches)

            return call

        return replaced(generation_utils, "_speculative_sampling", greedy)


class SeedsIgnored(Patched):
    """vLLM #6038, TensorRT-LLM #17599: per-request seeds are ignored on the speculative path: every
    request draws from one stream that runs on from call to call."""

    stream = itertools.count(7919, 104729)

    def patch(self):
        return contextlib.nullcontext()

    def request_seed(self, params, row, seed):
        return next(self.stream)


class CorrectionFromNextRow(Patched):
    """openvino.genai #4190: after a rejection the next token is taken from the target row after the
    rejected position."""

    def patch(self):
        return replaced(
            generation_utils,
            "_speculative_sampling",
            lambda original: lambda ids, logits, k, new, **kw: speculative_sampling(ids, logits, k, new, next_row=True),
        )


class RejectedDraftsKept(Patched):
    """lucidrains/speculative-decoding #3: rejected drafts stay in the output, the correction after them."""

    def patch(self):
        def kept(original):
            def call(candidate_ids, candidate_logits, k, new_logits, **kwargs):
                valid, _ = original(candidate_ids, candidate_logits, k, new_logits, **kwargs)
                return torch.cat((candidate_ids[:, -k:], valid[:, -1:]), dim=-1), torch.tensor(k)

            return call

        return replaced(generation_utils, "_speculative_sampling", kept)


class StaleCache(Patched):
    """The target's KV cache is not cropped after a rejection: later passes attend to rejected drafts."""

    def patch(self):
        return contextlib.nullcontext()

    def speculation(self):
        cache = DynamicCache(config=self.models[0].config)
        cache.crop = lambda *args, **kwargs: None
        return {**super().speculation(), "cache": cache}


class TargetWarpedTwice(Patched):
    """The request's temperature and filters applied twice to the target (as transformers applies
    them twice to its draft): at temperature T the verifier's target is softmax(logits / T^2)."""

    def patch(self):
        return target_processors(lambda processors: LogitsProcessorList([*processors, *processors]))


target_params_not_applied = TargetParamsNotApplied()
raw_draft_logits_as_q = RawDraftLogitsAsQ()
logits_one_off = LogitsOneOff()
argmax_for_sampled = ArgmaxForSampled()
seeds_ignored = SeedsIgnored()
correction_from_next_row = CorrectionFromNextRow()
rejected_drafts_kept = RejectedDraftsKept()
stale_cache = StaleCache()
target_warped_twice = TargetWarpedTwice()

OUTPUT = "test_engine_output_follows_the_target"
GREEDY = "test_greedy_requests_equal_greedy_decoding"
PIT = R.PIT_CHECKS
BUGS = {
    "target_params_not_applied": {OUTPUT: (R.NEVER_IMPOSSIBLE, *PIT)},
    "raw_draft_logits_as_q": {OUTPUT: PIT},
    "logits_one_off": {OUTPUT: (R.NEVER_IMPOSSIBLE, *PIT)},
    "argmax_for_sampled": {OUTPUT: PIT},
    "seeds_ignored": {
        "test_same_seed_same_output": (R.E2E_SEEDED,),
        "test_seeded_requests_ignore_the_batch": (R.E2E_BATCH_INVARIANT,),
    },
    "correction_from_next_row": {OUTPUT: (R.NEVER_IMPOSSIBLE, *PIT)},
    "rejected_drafts_kept": {OUTPUT: (R.NEVER_IMPOSSIBLE, *PIT)},
    "stale_cache": {OUTPUT: (R.NEVER_IMPOSSIBLE, R.GREEDY_IS_ARGMAX, *PIT), GREEDY: (R.GREEDY_IS_ARGMAX,)},
    "target_warped_twice": {OUTPUT: PIT},
}
