"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", 2024),
registered ``reference-block``: the chain's inputs and outputs, lossless, and never fewer tokens
per call on average than token-wise rejection sampling.

Token-wise verification stops at the first rejected draft. Block verification carries a running
weight w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)) (w_0 = 1) along the block and accepts the prefix
up to the *last* position i whose coin succeeds, with success probability

    h_i = r_i / (r_i + 1 - w_i),  r_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)   (i < K),  h_K = w_K,

then draws the extra token from norm(max(w_tau p_{tau+1} - q_{tau+1}, 0)) after tau accepted drafts
(the bonus from p_{K+1} when tau = K). Here p_{i+1}, q_{i+1} are the distributions after i drafts:
``target_probs[:, i]`` and ``draft_probs[:, i]``. Vectorised over the batch; one coin per position
and one uniform for the extra token per row, from the caller's generator only.
"""

from __future__ import annotations

import torch

from spectest.protocol import BLOCK_VERIFICATION, PAD
from spectest.sampling import inverse_cdf_blocked


def block_weights(
    draft_token_ids: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(w [B, K + 1] with w_0 = 1, h [B, K]): the running weights and each position's success probability."""
    b, k = draft_token_ids.shape
    p, q = target_probs.double(), draft_probs.double()
    ids = draft_token_ids.unsqueeze(-1)
    px = p[:, :k].gather(-1, ids).squeeze(-1)
    qx = q.gather(-1, ids).squeeze(-1)
    ratio = torch.where(qx > 0, px / qx.clamp_min(torch.finfo(torch.float64).tiny), (px > 0).double() * 2.0)
    weights = [torch.ones(b, dtype=torch.float64, device=p.device)]
    for i in range(k):
        weights.append(torch.clamp(weights[-1] * ratio[:, i], max=1.0))
    w = torch.stack(weights, dim=1)
    residual = (w[:, 1:k, None] * p[:, 1:k] - q[:, 1:k]).clamp_min(0).sum(-1)  # r_1 .. r_{K-1}
    denominator = residual + 1 - w[:, 1:k]
    inner = torch.where(denominator > 0, residual / denominator.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
    h = torch.cat([inner, w[:, k:]], dim=1)
    return w, h


def verify(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
) -> torch.Tensor:
    b, k = draft_token_ids.shape
    device = draft_token_ids.device
    w, h = block_weights(draft_token_ids, draft_probs, target_probs)
    coins = torch.rand((b, k), generator=generator, device=device, dtype=torch.float64)
    v = torch.rand((b,), generator=generator, device=device, dtype=torch.float64)
    positions = torch.arange(1, k + 1, device=device)
    tau = torch.where(coins < h, positions, 0).max(dim=1).values  # the last success, 0 for none
    rows = torch.arange(b, device=device)
    p_next = target_probs[rows, tau].double()
    q_next = draft_probs[rows, tau.clamp_max(k - 1)].double()
    residual = (w[rows, tau].unsqueeze(1) * p_next - q_next).clamp_min(0)
    weights = torch.where((tau == k).unsqueeze(1), p_next, residual)
    token = inverse_cdf_blocked(weights, v)
    slots = torch.arange(k + 1, device=device)
    drafts = torch.cat([draft_token_ids, torch.full_like(draft_token_ids[:, :1], PAD)], dim=1)
    out = torch.where(slots < tau.unsqueeze(1), drafts, PAD)
    return torch.where(slots == tau.unsqueeze(1), token.unsqueeze(1), out)


class BlockReference:
    """The registered block verifier: exact, not token-wise (it does not declare standard-rejection)."""

    spectest_capabilities = frozenset({BLOCK_VERIFICATION})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        return verify(draft_token_ids, draft_probs, target_probs, generator=generator)


BLOCK = BlockReference()
