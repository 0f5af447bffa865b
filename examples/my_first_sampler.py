"""A first chain verifier to gate: modified rejection sampling, vectorised over rows, in plain torch.

``pytest --spec-model examples/my_first_sampler.py:verify`` runs the property suite on it (see the
documentation's first tutorial). Change a line (compare ``u * q_d <= p_d``, or take the bonus from
position K - 1) and watch the suite say which rule broke.
"""

from __future__ import annotations

import torch


def verify(draft_token_ids, draft_probs, target_probs, *, generator):
    """q [B, K, V], p [B, K + 1, V] -> int64 [B, K + 1]: the accepted drafts, one token, then -1."""
    batch, k = draft_token_ids.shape
    p, q = target_probs.double(), draft_probs.double()
    p_d = p[:, :k].gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1)  # p and q of each drafted token
    q_d = q.gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, dtype=torch.float64, device=p.device)
    # each draft accepted with probability min(1, p/q); count them until the first rejection
    accepted = (u * q_d < p_d).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(batch, device=p.device)
    rejected = (accepted < k).unsqueeze(1)
    residual = (p[rows, accepted] - torch.where(rejected, q[rows, accepted.clamp(max=k - 1)], 0.0)).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows, accepted])  # rounding emptied it
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # norm(max(0, p - q)), or the bonus from p
    slots = torch.arange(k + 1, device=p.device)
    emitted = torch.where(slots < accepted.unsqueeze(1), torch.nn.functional.pad(draft_token_ids, (0, 1)), -1)
    emitted[rows, accepted] = extra
    return emitted
