"""Known-correct chain verifiers other than the reference: each must pass the whole suite.

Usable directly: ``pytest --spec-model tests/verifiers/correct.py:exponential_race``.
"""

from __future__ import annotations

import torch

from spectest.implementations.block import BLOCK
from spectest.implementations.reference import verify as reference_verify
from spectest.implementations.sampler import REFERENCE, ReferenceSampler
from spectest.protocol import PAD
from spectest.sampling import sample_categorical
from spectest.sampling_params import process_logits


def _assemble(draft_token_ids: torch.Tensor, n_accepted: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    batch, k = draft_token_ids.shape
    slots = torch.arange(k + 1, device=draft_token_ids.device)
    emitted = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=draft_token_ids.device)
    emitted[:, :k] = torch.where(slots[:k] < n_accepted.unsqueeze(1), draft_token_ids, PAD)
    emitted[torch.arange(batch, device=emitted.device), n_accepted] = extra
    return emitted


def exponential_race(draft_token_ids, draft_probs, target_probs, *, generator):
    """Standard acceptance; the correction is argmax(residual / Exp(1)) instead of inverse CDF."""
    batch, k = draft_token_ids.shape
    ids = draft_token_ids.unsqueeze(-1)
    p_d = target_probs[:, :k].gather(-1, ids).squeeze(-1)
    q_d = draft_probs.gather(-1, ids).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=p_d.device, dtype=torch.float64)
    n_acc = (u < (p_d / q_d).double()).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(batch, device=p_d.device)
    p_next = target_probs[rows, n_acc].double()
    q_next = draft_probs[rows, n_acc.clamp(max=k - 1)].double()
    residual = torch.where((n_acc == k).unsqueeze(1), p_next, (p_next - q_next).clamp_min(0))
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)  # rounding emptied it
    noise = torch.empty_like(residual).exponential_(1.0, generator=generator)
    return _assemble(draft_token_ids, n_acc, (residual / noise).argmax(dim=-1))


def ignores_draft_probs(draft_token_ids, draft_probs, target_probs, *, generator):
    """Lossless but wasteful: accept d with probability p(d); on rejection sample p without d."""
    batch, k = draft_token_ids.shape
    ids = draft_token_ids.unsqueeze(-1)
    p_d = target_probs[:, :k].gather(-1, ids).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=p_d.device, dtype=p_d.dtype)
    n_acc = (u < p_d).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(batch, device=p_d.device)
    weights = target_probs[rows, n_acc].clone()
    rejected = n_acc < k
    rejected_ids = draft_token_ids[rows, n_acc.clamp(max=k - 1)]
    weights[rows[rejected], rejected_ids[rejected]] = 0.0
    return _assemble(draft_token_ids, n_acc, sample_categorical(weights, generator))


ignores_draft_probs.spectest_one_hot_drafts = True  # its positions' reach planned from p(x), not min(p, q)


class VerifierObject:
    """An object with a verify method (the other accepted shape of a model). It takes ragged
    batches FlashInfer's way: draft ids past a row's count are -1, and it counts them itself."""

    spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})
    spectest_draft_padding = "minus-one"

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        counts = (draft_token_ids != PAD).sum(dim=1)
        return reference_verify(
            draft_token_ids, draft_probs, target_probs, generator=generator, num_draft_tokens=counts
        )


as_object = VerifierObject()


class GatedReference(VerifierObject):
    """The reference declaring the speed property's efficiency gate (``spectest_speed_gate``): an
    efficient pass, so it passes the gate."""

    spectest_speed_gate = 1.1


gated_reference = GatedReference()


class OneHotDraftLogits:
    """Logits-level control that treats the draft as one-hot: accepts d with probability p(d)
    under the processed target, on rejection samples that target without d. Lossless for any draft."""

    spectest_one_hot_drafts = True

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        return ignores_draft_probs(draft_token_ids, draft_probs, target_probs, generator=generator)

    def verify_logits(self, draft_token_ids, draft_logits, target_logits, params, *, generator):
        target = process_logits(target_logits, params)
        return ignores_draft_probs(draft_token_ids, target[:, :-1], target, generator=generator)


class MinPFirst(ReferenceSampler):
    """The reference with vLLM's filter order (min-p before top-k and top-p), declared."""

    spectest_filter_order = ("min_p", "top_k", "top_p")


class ProposeWithChainVerify:
    """A drafter plus a probability-level verifier: the harness pairs propose with verify."""

    spectest_capabilities = frozenset({"standard-rejection"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        return reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)

    def propose(self, draft_logits, params, *, generator):
        return REFERENCE.propose(draft_logits, params, generator=generator)


one_hot_draft_logits = OneHotDraftLogits()
min_p_first = MinPFirst()
propose_with_chain_verify = ProposeWithChainVerify()
# The registered block verifier under a name that no other model's id contains (-k selects by substring).
block_verification = BLOCK
