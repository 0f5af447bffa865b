"""The reference chain verifier: modified rejection sampling, vectorised over rows and positions.

It reads only what a verifier must: the K draft-token probabilities of p and q per row, and the
two V-long rows that the one extra token needs (the residual at the first rejection, or the
bonus row). No Python loop over rows or positions.
"""

from __future__ import annotations

import torch

from spectest.protocol import PAD
from spectest.sampling import sample_categorical

spectest_capabilities = frozenset({"standard-rejection"})


def verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
) -> torch.Tensor:
    """Accept draft i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit
    one token from norm(max(0, p - q)), or the bonus from target_probs[:, K] if all K pass."""
    batch, k = draft_token_ids.shape
    device = draft_token_ids.device
    ids = draft_token_ids.unsqueeze(-1)
    p_draft = target_probs[:, :k].gather(-1, ids).squeeze(-1)
    q_draft = draft_probs.gather(-1, ids).squeeze(-1)
    u = torch.rand((batch, k), generator=generator, device=device, dtype=target_probs.dtype)
    # u < p/q without a division: exact when p >= q (always accepted) and when q = 0.
    accepted = u * q_draft < p_draft
    n_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)

    rows = torch.arange(batch, device=device)
    p_next = target_probs[rows, n_accepted]
    q_next = draft_probs[rows, n_accepted.clamp(max=k - 1)]
    all_accepted = (n_accepted == k).unsqueeze(-1)
    residual = torch.where(all_accepted, p_next, (p_next - q_next).clamp_min(0))
    # p != q at a rejection, so the residual has mass; rounding can still empty it: fall back to p.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_next, residual)
    extra = sample_categorical(residual, generator)

    slots = torch.arange(k + 1, device=device)
    emitted = torch.full((batch, k + 1), PAD, dtype=torch.int64, device=device)
    emitted[:, :k] = torch.where(slots[:k] < n_accepted.unsqueeze(1), draft_token_ids, PAD)
    emitted[rows, n_accepted] = extra
    return emitted
