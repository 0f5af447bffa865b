"""Exact but slow chain verifiers: every exactness property passes them, the speed property must not.

Each is the reference algorithm, distributed exactly as it should be, with a cost the model of
an efficient pass does not allow: ``pytest --spec-model tests/verifiers/slow.py:full_residual_every_position``.
"""

from __future__ import annotations

import time

import torch

from spectest import rules as R
from spectest.implementations.reference import verify as reference_verify
from spectest.protocol import PAD

spectest_capabilities = frozenset({"standard-rejection"})


def full_residual_every_position(draft_token_ids, draft_probs, target_probs, *, generator):
    """vLLM's early layout: the recovered token of *every* position, from the full [B, K + 1, V]
    residual (the bonus row last) normalised in float64, by an exponential race; then the
    chain keeps the one at the first rejection. Exact, and K + 1 times the rows a verifier needs."""
    batch, k = draft_token_ids.shape
    ids = draft_token_ids.unsqueeze(-1)
    p = target_probs.double()
    q = torch.cat([draft_probs.double(), torch.zeros_like(p[:, :1])], dim=1)  # the bonus row has q = 0
    p_d = p[:, :k].gather(-1, ids).squeeze(-1)
    q_d = q[:, :k].gather(-1, ids).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=p.device, dtype=torch.float64)
    n_accepted = (u * q_d < p_d).long().cumprod(dim=1).sum(dim=1)
    residual = (p - q).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)  # rounding emptied a row
    residual = residual / residual.sum(-1, keepdim=True)
    race = residual / torch.empty_like(residual).exponential_(1.0, generator=generator)
    recovered = race.argmax(dim=-1)  # [B, K + 1]
    slots = torch.arange(k + 1, device=p.device)
    emitted = torch.where(slots < n_accepted.unsqueeze(1), torch.nn.functional.pad(draft_token_ids, (0, 1)), PAD)
    rows = torch.arange(batch, device=p.device)
    emitted[rows, n_accepted] = recovered[rows, n_accepted]
    return emitted


SLEEP_PER_REJECTION_S = 0.003


def sleeps_per_rejection(draft_token_ids, draft_probs, target_probs, *, generator):
    """Waits 3 ms times the share of rows that ended in a rejection (a host round trip whenever a
    correction is needed, say): free when every draft is accepted, costly when few are."""
    emitted = reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)
    rejected = ((emitted != -1).sum(dim=1) <= draft_token_ids.shape[1]).double().mean()
    time.sleep(SLEEP_PER_REJECTION_S * float(rejected))
    return emitted


SPEED = "test_measured_speedup_follows_the_model"
# name -> {property that must fail it: the rule that names it}; both pass every other property.
BUGS = {"full_residual_every_position": {SPEED: (R.PASS_COST,)}, "sleeps_per_rejection": {SPEED: (R.PASS_COST,)}}
ONLY = tuple(BUGS)
