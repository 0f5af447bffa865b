"""A chain verifier written as a Triton kernel, gated on a machine without a GPU:

    pytest --spec-model examples/my_triton_kernel.py:verify --spec-interpret

``--spec-interpret`` turns Triton's interpreter on before this module imports triton, and runs each launch's
programs side by side (spectest.gpu.interpreter), so the property suite's hundreds of thousands of rows take
minutes, not hours. One program per row: the K acceptance tests (accept draft d at position i iff u_i q_i(d) < p_i(d)),
then one sweep over the row's residual max(0, p - q) at the first rejection (p itself after K acceptances: the bonus)
for its total, and a second for the first cell whose running sum passes a uniform times that total.

``verify_from_p`` is the same kernel with a classic bug planted: at a rejection it draws the extra token from p
instead of the residual, so tokens the draft already offered come out too often. The suite fails it, saying where
the mass went.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chain(drafts, q, p, u, v, out, vocab, K: tl.constexpr, BLOCK: tl.constexpr, RESIDUAL: tl.constexpr):
    row = tl.program_id(0)
    accepted = 0
    rejected = 0
    for i in range(K):
        if rejected == 0:
            d = tl.load(drafts + row * K + i)
            p_d = tl.load(p + (row * (K + 1) + i) * vocab + d)
            q_d = tl.load(q + (row * K + i) * vocab + d)
            if tl.load(u + row * K + i) * q_d < p_d:
                tl.store(out + row * (K + 1) + i, d)
                accepted += 1
            else:
                rejected = 1
    p_row = p + (row * (K + 1) + accepted) * vocab
    q_row = q + (row * K + accepted) * vocab
    subtract = (rejected == 1) & RESIDUAL  # the bonus row (and the planted bug) draws from p alone
    total = 0.0
    for start in range(0, vocab, BLOCK):
        cells = start + tl.arange(0, BLOCK)
        inside = cells < vocab
        weight = tl.load(p_row + cells, mask=inside, other=0.0)
        weight -= tl.load(q_row + cells, mask=inside & subtract, other=0.0)
        total += tl.sum(tl.maximum(weight, 0.0))
    if total <= 0.0:  # p - q rounded to nothing: p itself
        subtract = False
        total = 1.0
    goal = tl.load(v + row) * total
    running = 0.0
    token = -1
    last = 0
    for start in range(0, vocab, BLOCK):
        cells = start + tl.arange(0, BLOCK)
        inside = cells < vocab
        weight = tl.load(p_row + cells, mask=inside, other=0.0)
        weight -= tl.load(q_row + cells, mask=inside & subtract, other=0.0)
        weight = tl.maximum(weight, 0.0)
        past = ((running + tl.cumsum(weight, 0)) > goal) & (weight > 0.0)
        first = tl.min(tl.where(past, cells, vocab), 0)
        if (token < 0) & (first < vocab):
            token = first
        last = tl.maximum(last, tl.max(tl.where(weight > 0.0, cells, 0), 0))
        running += tl.sum(weight)
    tl.store(out + row * (K + 1) + accepted, tl.where(token >= 0, token, last))  # past the end: the last weighed cell


def _launch(draft_token_ids, draft_probs, target_probs, generator, residual: bool):
    batch, k = draft_token_ids.shape
    vocab = target_probs.shape[-1]
    device = target_probs.device
    u = torch.rand((batch, k), generator=generator, device=device, dtype=torch.float32)
    v = torch.rand((batch,), generator=generator, device=device, dtype=torch.float32)
    out = torch.full((batch, k + 1), -1, dtype=torch.int64, device=device)
    block = min(1024, triton.next_power_of_2(vocab))
    _chain[(batch,)](
        draft_token_ids.contiguous(),
        draft_probs.float().contiguous(),
        target_probs.float().contiguous(),
        u,
        v,
        out,
        vocab,
        K=k,
        BLOCK=block,
        RESIDUAL=residual,
    )
    return out


def verify(draft_token_ids, draft_probs, target_probs, *, generator):
    """q [B, K, V], p [B, K + 1, V] -> int64 [B, K + 1]: the accepted drafts, one token, then -1."""
    return _launch(draft_token_ids, draft_probs, target_probs, generator, residual=True)


def verify_from_p(draft_token_ids, draft_probs, target_probs, *, generator):
    """The planted bug: the extra token after a rejection comes from p, not from max(0, p - q)."""
    return _launch(draft_token_ids, draft_probs, target_probs, generator, residual=False)
