"""Known-buggy block verifiers: each declares ``block-verification`` and gets one step of Sun et
al.'s algorithm wrong. Written out step by step (not calling the reference), each step overridable.

``BUGS`` declares, for each, the properties that must catch it and the rules they may name.
"""

from __future__ import annotations

import torch

from spectest import rules as R
from spectest.protocol import BLOCK_VERIFICATION, PAD
from spectest.sampling import inverse_cdf_blocked

spectest_capabilities = frozenset({BLOCK_VERIFICATION})


def _block(
    draft_token_ids,
    draft_probs,
    target_probs,
    generator,
    *,
    first_failure=False,
    unweighted_residual=False,
    local_ratio=False,
    last_from_ratio=False,
):
    b, k = draft_token_ids.shape
    device = draft_token_ids.device
    p, q = target_probs.double(), draft_probs.double()
    ids = draft_token_ids.unsqueeze(-1)
    ratio = p[:, :k].gather(-1, ids).squeeze(-1) / q.gather(-1, ids).squeeze(-1)
    w = [torch.ones(b, dtype=torch.float64, device=device)]
    for i in range(k):
        w.append(torch.clamp((1.0 if local_ratio else w[-1]) * ratio[:, i], max=1.0))
    w = torch.stack(w, dim=1)
    h = []
    for i in range(1, k):
        r = (w[:, i, None] * p[:, i] - q[:, i]).clamp_min(0).sum(-1)
        d = r + 1 - w[:, i]
        h.append(torch.where(d > 0, r / d.clamp_min(1e-300), 1.0))
    h.append(ratio[:, k - 1].clamp(max=1.0) if last_from_ratio else w[:, k])
    h = torch.stack(h, dim=1)
    coins = torch.rand((b, k), generator=generator, device=device, dtype=torch.float64)
    v = torch.rand((b,), generator=generator, device=device, dtype=torch.float64)
    success = coins < h
    if first_failure:  # the prefix before the first failed coin
        tau = success.long().cumprod(dim=1).sum(dim=1)
    else:
        tau = torch.where(success, torch.arange(1, k + 1, device=device), 0).max(dim=1).values
    rows = torch.arange(b, device=device)
    scale = torch.ones_like(tau, dtype=torch.float64) if unweighted_residual else w[rows, tau]
    residual = (scale.unsqueeze(1) * p[rows, tau] - q[rows, tau.clamp_max(k - 1)]).clamp_min(0)
    token = inverse_cdf_blocked(torch.where((tau == k).unsqueeze(1), p[rows, tau], residual), v)
    slots = torch.arange(k + 1, device=device)
    drafts = torch.cat([draft_token_ids, torch.full_like(draft_token_ids[:, :1], PAD)], dim=1)
    out = torch.where(slots < tau.unsqueeze(1), drafts, PAD)
    return torch.where(slots == tau.unsqueeze(1), token.unsqueeze(1), out)


def block_stops_at_first_failure(draft_token_ids, draft_probs, target_probs, *, generator):
    """Accepts the drafts before the first failed coin instead of up to the last success."""
    return _block(draft_token_ids, draft_probs, target_probs, generator, first_failure=True)


def block_residual_without_weight(draft_token_ids, draft_probs, target_probs, *, generator):
    """The extra token comes from norm(max(p - q, 0)), without the running weight w_tau on p."""
    return _block(draft_token_ids, draft_probs, target_probs, generator, unweighted_residual=True)


def block_local_ratio(draft_token_ids, draft_probs, target_probs, *, generator):
    """The running weight is min(1, p_i / q_i) at each position, not carried along the block."""
    return _block(draft_token_ids, draft_probs, target_probs, generator, local_ratio=True)


def block_last_threshold_from_ratio(draft_token_ids, draft_probs, target_probs, *, generator):
    """The last position succeeds with min(1, p_K / q_K) instead of the running weight w_K."""
    return _block(draft_token_ids, draft_probs, target_probs, generator, last_from_ratio=True)


def block_accepts_less(draft_token_ids, draft_probs, target_probs, *, generator):
    """Lossless, but ignores q: accepts draft i with probability p_i(x_i), on a rejection draws from
    p_i without x_i. Declares block verification, so it must accept at least as much as token-wise."""
    b, k = draft_token_ids.shape
    device = draft_token_ids.device
    p = target_probs.double()
    ids = draft_token_ids.unsqueeze(-1)
    coins = torch.rand((b, k), generator=generator, device=device, dtype=torch.float64)
    v = torch.rand((b,), generator=generator, device=device, dtype=torch.float64)
    accepted = (coins < p[:, :k].gather(-1, ids).squeeze(-1)).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(b, device=device)
    rejected = draft_token_ids[rows, accepted.clamp_max(k - 1)]
    without = p[rows, accepted].scatter(1, rejected.unsqueeze(1), 0.0)
    token = inverse_cdf_blocked(torch.where((accepted == k).unsqueeze(1), p[rows, accepted], without), v)
    slots = torch.arange(k + 1, device=device)
    drafts = torch.cat([draft_token_ids, torch.full_like(draft_token_ids[:, :1], PAD)], dim=1)
    out = torch.where(slots < accepted.unsqueeze(1), drafts, PAD)
    return torch.where(slots == accepted.unsqueeze(1), token.unsqueeze(1), out)


JOINT = "test_sequences_follow_the_target"
PER_POSITION = "test_every_row_and_position_is_exact"
CALLS = "test_tokens_per_call_follow_the_chain_model"
AT_LEAST = "test_accepts_at_least_as_many_tokens_as_token_wise"
LOSSY = (R.JOINT, R.PER_POSITION, R.NEVER_IMPOSSIBLE)
BUGS = {
    "block_stops_at_first_failure": {JOINT: LOSSY, CALLS: (R.BLOCK_TOKENS_PER_CALL,)},
    "block_residual_without_weight": {JOINT: LOSSY},  # lengths follow the block model: only the extra token is off
    "block_local_ratio": {JOINT: LOSSY, CALLS: (R.BLOCK_TOKENS_PER_CALL,)},
    "block_last_threshold_from_ratio": {JOINT: LOSSY, CALLS: (R.BLOCK_TOKENS_PER_CALL,)},
    # Exact (every exactness property passes it): only the acceptance figures catch it.
    "block_accepts_less": {AT_LEAST: (R.AT_LEAST_TOKEN_WISE,), CALLS: (R.BLOCK_TOKENS_PER_CALL,)},
}
ONLY = ("block_accepts_less",)
