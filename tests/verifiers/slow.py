"""Exact but slow chain verifiers: every exactness property passes them; the speed property tells them apart.

Each is the reference algorithm, distributed exactly as it should be, at another cost:

* ``sleeps_per_rejection`` costs more the more drafts are rejected: its measured speedup falls
  short of what its own costs predict, and it fails the speed property by default;
* ``sleeps_per_call`` (a fixed wait per call) and ``full_residual_every_position`` (about four
  times an efficient pass) cost the same whatever happens: they follow the model with their own
  costs (they pass by default) and fail only when the efficiency gate is asked for
  (``--spec-speed-gate 1.1``, or the model's ``spectest_speed_gate``: ``sleeps_per_call_gated``).

``pytest --spec-model tests/verifiers/slow.py:sleeps_per_rejection -k speed``
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


# Sized so the speed property catches it with power near 1 at the meta-tests' alpha of 0.01, idle or
# loaded: at 3 ms its measured speedup sat at 0.8 of its own model at the sweep's lowest acceptance,
# where a round falls below 1/1.1 in about 85% of rounds and the sign test (18 of 21) rejects about
# 6 runs in 10; at 8 ms it sits near 0.55, below the margin in every round.
SLEEP_PER_REJECTION_S = 0.008


def sleeps_per_rejection(draft_token_ids, draft_probs, target_probs, *, generator):
    """Waits 8 ms times the share of rows that ended in a rejection (a host round trip whenever a
    correction is needed, say): free when every draft is accepted, costly when few are."""
    emitted = reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)
    rejected = ((emitted != -1).sum(dim=1) <= draft_token_ids.shape[1]).double().mean()
    time.sleep(SLEEP_PER_REJECTION_S * float(rejected))
    return emitted


# At 2 ms a pass cost about 1.2 times an efficient one, so under the 1.1 gate a round passed now and
# then and the sign test (14 of 15) missed it about 4 runs in 10; 5 ms is about 1.6 times.
SLEEP_PER_CALL_S = 0.005


def sleeps_per_call(draft_token_ids, draft_probs, target_probs, *, generator):
    """Waits 5 ms on every call, whatever happens (a host round trip per step, say): a constant
    cost, about 1.6 times an efficient pass of the speed property's workload."""
    emitted = reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)
    time.sleep(SLEEP_PER_CALL_S)
    return emitted


class SleepsPerCallGated:
    """``sleeps_per_call`` declaring the efficiency gate itself (``spectest_speed_gate``)."""

    spectest_capabilities = frozenset({"standard-rejection"})
    spectest_speed_gate = 1.1

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        return sleeps_per_call(draft_token_ids, draft_probs, target_probs, generator=generator)


sleeps_per_call_gated = SleepsPerCallGated()
SPEED = "test_measured_speedup_follows_the_model"
# name -> {property that must fail it: the rule that names it}; both pass every other property.
BUGS = {"sleeps_per_rejection": {SPEED: (R.SPEEDUP_AGREES,)}}
ONLY = tuple(BUGS)
# Caught only under the efficiency gate (--spec-speed-gate, or declared): exact, following their own cost model.
GATED = {
    "sleeps_per_call": {SPEED: (R.EFFICIENT_PASS,)},
    "sleeps_per_call_gated": {SPEED: (R.EFFICIENT_PASS,)},
    "full_residual_every_position": {SPEED: (R.EFFICIENT_PASS,)},
}
