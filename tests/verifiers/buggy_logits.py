"""Deliberately buggy logits-level samplers, each modelled on a bug engines shipped.

Each is :class:`Textbook` (correct: processes both sides with each row's parameters, then the
reference chain) with one step replaced. Their chain ``verify`` is correct, so only the
sampling-parameter properties can catch them: ``pytest --spec-model
tests/verifiers/buggy_logits.py:temperature_target_only properties/test_sampling_params.py``.
``BUGS`` maps each name to the properties that must catch it and the text the failure must say.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectest import rules as R
from spectest.implementations.reference import row_uniforms, verify_at
from spectest.implementations.reference import verify as chain_verify
from spectest.sampling import inverse_cdf_blocked, sample_categorical
from spectest.sampling_params import NO_SEED, SamplingParams, process_logits


def without(params: SamplingParams, name: str) -> SamplingParams:
    """The parameters with one of them switched off."""
    off = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}[name]
    value = getattr(params, name)
    if name == "temperature":  # greedy stays greedy; only sampled rows lose their temperature
        changed = torch.where(value > 0, torch.ones_like(value), value)
    else:
        changed = torch.full_like(value, off)
    return replace(params, **{name: changed})


class Textbook:
    """Correct logits-level sampler whose steps the bugs below override one at a time."""

    spectest_capabilities = frozenset({"standard-rejection", "per-row-seeds"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        return chain_verify(draft_token_ids, draft_probs, target_probs, generator=generator)

    # Steps of verify_logits.
    def verify_params(self, params: SamplingParams) -> SamplingParams:
        return params

    def target_side(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        return process_logits(logits, params)

    def draft_side(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        return process_logits(logits, params)

    def uniforms(self, params: SamplingParams, k: int, generator: torch.Generator, device, dtype):
        return row_uniforms(params, k, generator, device=device, dtype=dtype)

    def verify_logits(self, draft_token_ids, draft_logits, target_logits, params, *, generator):
        params = self.verify_params(params)
        p = self.target_side(target_logits, params)
        q = self.draft_side(draft_logits, params)
        u, v = self.uniforms(params, draft_token_ids.shape[1], generator, draft_token_ids.device, p.dtype)
        return verify_at(draft_token_ids, q, p, u, lambda weights: inverse_cdf_blocked(weights, v))

    # The drafting side (a separate piece of code in an engine: correct unless a bug says so).
    def propose(self, draft_logits, params, *, generator):
        q = process_logits(draft_logits, params)
        return sample_categorical(q, generator), q


class TemperatureTargetOnly(Textbook):
    """The verifier's q ignores temperature (the drafter applied it)."""

    def draft_side(self, logits, params):
        return process_logits(logits, without(params, "temperature"))


class TemperatureDraftOnly(Textbook):
    """The verifier's p ignores temperature (sampled rows verified at temperature 1)."""

    def target_side(self, logits, params):
        return process_logits(logits, without(params, "temperature"))


class TopKTargetOnly(Textbook):
    """Top-k applied to p but not to the q in the ratio."""

    def draft_side(self, logits, params):
        return process_logits(logits, without(params, "top_k"))


class TopPDraftOnly(Textbook):
    """Top-p applied to q but not to p: tokens top-p forbids can be emitted."""

    def target_side(self, logits, params):
        return process_logits(logits, without(params, "top_p"))


class MinPTargetOnly(Textbook):
    """Min-p applied to p but not to the q in the ratio."""

    def draft_side(self, logits, params):
        return process_logits(logits, without(params, "min_p"))


class FilteredDraftsUnfilteredQ(Textbook):
    """Drafts sampled from the filtered distribution, the ratio taken with temperature-only q."""

    def draft_side(self, logits, params):
        return process_logits(logits, without(without(without(params, "top_k"), "top_p"), "min_p"))


class ArgmaxDrafts(Textbook):
    """The drafter takes the argmax but reports the soft (sampled-from) q."""

    def propose(self, draft_logits, params, *, generator):
        q = process_logits(draft_logits, params)
        return q.argmax(dim=-1), q


class GreedyDividesByZero(Textbook):
    """Divides logits by the temperature before checking for greedy rows (0 gives inf/NaN)."""

    def target_side(self, logits, params):
        scaled = logits / params.temperature.to(logits.dtype).view(-1, 1, 1)
        return process_logits(scaled, replace(params, temperature=torch.ones_like(params.temperature)))

    draft_side = target_side


class GreedyTiesToHighestId(Textbook):
    """Greedy rows take the last of exactly tied top logits (an argmax over the flipped vocabulary,
    or a reduction that keeps the later index): a different token than the engine's own greedy sampler."""

    def target_side(self, logits, params):
        probs = process_logits(logits, params)
        greedy = params.greedy.to(logits.device).view(-1, 1, 1)
        last = logits.shape[-1] - 1 - logits.flip(-1).argmax(dim=-1)
        one_hot = torch.nn.functional.one_hot(last, logits.shape[-1]).to(probs.dtype)
        return torch.where(greedy, one_hot, probs)


class MaskedLogitsZeroed(Textbook):
    """Applies the vocabulary mask by multiplying the logits by a 0/1 mask instead of filling -inf:
    masked tokens get logit 0, a middling one, so drafts of -inf-logit tokens are accepted and
    masked tokens are emitted."""

    def target_side(self, logits, params):
        mask = torch.isfinite(logits)
        return process_logits(torch.where(mask, logits, torch.zeros_like(logits)) * mask, params)


class TopKKeepsExactlyK(Textbook):
    """Top-k from torch.topk's indices: exactly k tokens, so a tie at the k-th place keeps an
    arbitrary part of it where transformers, vLLM and the processed target keep the whole tie."""

    def target_side(self, logits, params):
        vocab = logits.shape[-1]
        active = (params.top_k > 0) & (params.top_k < vocab) & ~params.greedy
        masked = logits.clone()
        for row in active.nonzero().flatten().tolist():
            top = torch.topk(logits[row], int(params.top_k[row]), dim=-1).indices
            keep = torch.zeros_like(logits[row], dtype=torch.bool).scatter_(-1, top, True)
            masked[row] = torch.where(keep, logits[row], -torch.inf)
        return process_logits(masked, replace(params, top_k=torch.zeros_like(params.top_k)))

    draft_side = target_side


class RandomRowsVerifiedGreedily(Textbook):
    """One greedy row switches the whole batch to greedy verification."""

    def verify_params(self, params):
        if bool(params.greedy.any()):
            return replace(params, temperature=torch.zeros_like(params.temperature))
        return params


class ParamsShiftedByOneRow(Textbook):
    """Row i is verified with the parameters of row i - 1."""

    def verify_params(self, params):
        return params.map(lambda t: t.roll(1))


class Row0SeedForEveryRow(Textbook):
    """Every seeded row draws from a generator seeded with row 0's seed."""

    def uniforms(self, params, k, generator, device, dtype):
        seeds = torch.where(params.seed != NO_SEED, params.seed[0], params.seed)
        return row_uniforms(replace(params, seed=seeds), k, generator, device=device, dtype=dtype)


class IgnoresRowSeeds(Textbook):
    """Declares per-row seeds but draws every row from the call's generator."""

    def uniforms(self, params, k, generator, device, dtype):
        u = torch.rand((params.batch_size, k), generator=generator, device=device, dtype=dtype)
        return u, torch.rand((params.batch_size,), generator=generator, device=device, dtype=torch.float64)


temperature_target_only = TemperatureTargetOnly()
temperature_draft_only = TemperatureDraftOnly()
top_k_target_only = TopKTargetOnly()
top_p_draft_only = TopPDraftOnly()
min_p_target_only = MinPTargetOnly()
filtered_drafts_unfiltered_q = FilteredDraftsUnfilteredQ()
argmax_drafts = ArgmaxDrafts()
greedy_divides_by_zero = GreedyDividesByZero()
greedy_ties_to_highest_id = GreedyTiesToHighestId()
masked_logits_zeroed = MaskedLogitsZeroed()
top_k_keeps_exactly_k = TopKKeepsExactlyK()
random_rows_verified_greedily = RandomRowsVerifiedGreedily()
params_shifted_by_one_row = ParamsShiftedByOneRow()
row0_seed_for_every_row = Row0SeedForEveryRow()
ignores_row_seeds = IgnoresRowSeeds()

EXACT = "test_logits_rows_follow_the_processed_target"
GREEDY = "test_greedy_rows_equal_greedy_decoding"
HONEST = "test_drafts_follow_the_reported_probs"
LOSSLESS = "test_propose_then_verify_is_lossless"
SEEDS = "test_seeded_rows_ignore_the_rest_of_the_batch"
# A wrong p can put mass where the processed target has none: the exact rule or the distribution check.
POSITION_OR_ZERO = (R.PER_POSITION, R.NEVER_IMPOSSIBLE)

# name -> {property that must fail it: the rules or checks any of which may be the one that did}
BUGS: dict[str, dict[str, tuple[str, ...]]] = {
    "temperature_target_only": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "temperature_draft_only": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "top_k_target_only": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "top_p_draft_only": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "min_p_target_only": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "filtered_drafts_unfiltered_q": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "argmax_drafts": {HONEST: (R.REPORTED_DRAFTS, R.NEVER_DRAFTS_IMPOSSIBLE), LOSSLESS: POSITION_OR_ZERO},
    "greedy_divides_by_zero": {GREEDY: (R.GREEDY_IS_ARGMAX, R.DOES_NOT_RAISE)},
    "greedy_ties_to_highest_id": {GREEDY: (R.GREEDY_IS_ARGMAX,)},
    "masked_logits_zeroed": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "top_k_keeps_exactly_k": {EXACT: POSITION_OR_ZERO, LOSSLESS: POSITION_OR_ZERO},
    "random_rows_verified_greedily": {EXACT: POSITION_OR_ZERO},
    "params_shifted_by_one_row": {EXACT: POSITION_OR_ZERO, GREEDY: (R.GREEDY_IS_ARGMAX,)},
    "row0_seed_for_every_row": {SEEDS: (R.SEEDED_ROWS,)},
    "ignores_row_seeds": {SEEDS: (R.SEEDED_ROWS,)},
}
