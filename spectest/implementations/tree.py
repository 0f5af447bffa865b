"""Reference tree verifiers (registered ``reference-tree-iid``, ``reference-tree-without-replacement``,
``reference-tree-topk``): multi-step rejection sampling over each node's children, vectorised
over the batch (loops over depth and sibling rank only).

At a node with target p and draft q the children are tried in index order. Child x is accepted
with probability min(1, P(x) / Q(x)), where P starts as p and Q as q; on a rejection
P <- norm(max(P - Q, 0)) and, for siblings drafted without replacement, Q <- q without the
tokens tried so far, renormalised. For ``top-k`` children (deterministic) Q is the one-hot of x,
so the rule reads: accept with P(x), else P <- P without x, renormalised. When every child is
rejected the extra token is drawn from P; at a node without children it is the bonus, from p.
Each step keeps P the exact conditional distribution of the next token, so the output is
lossless (SpecInfer; Chen et al., "Sequoia"; Jeon et al., "Recursive speculative decoding").

Uniforms come from the caller's generator only: one per row for every (depth, sibling rank)
step and one per row for every extra token, drawn whether or not a row needs it, so a row's
output does not depend on what the other rows did.
"""

from __future__ import annotations

import torch

from spectest.protocol import PAD
from spectest.sampling import inverse_cdf_blocked
from spectest.tree_protocol import depths


def children_table(parents: torch.Tensor) -> torch.Tensor:
    """[B, N, W]: the children of every node in index order, -1 padded (W = the widest node)."""
    b, n = parents.shape
    used = parents >= 0
    rank = torch.zeros_like(parents)
    for i in range(1, n):
        rank[:, i] = (parents[:, 1:i] == parents[:, i : i + 1]).sum(dim=1)
    width = int(rank[used].max()) + 1 if bool(used.any()) else 1
    table = torch.full((b, n, width), PAD, dtype=torch.int64, device=parents.device)
    rows, nodes = used.nonzero(as_tuple=True)
    table[rows, parents[rows, nodes], rank[rows, nodes]] = nodes
    return table


def normalised(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Rows of ``weights`` normalised; a row without mass (only reachable through rounding) keeps
    ``fallback``."""
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny), fallback)


def verify_tree(
    parents: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator,
    drafting: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    b = parents.shape[0]
    device = parents.device
    rows = torch.arange(b, device=device)
    children = children_table(parents)
    deepest = int(depths(parents).max())
    node = torch.zeros(b, dtype=torch.int64, device=device)

    def at(probs: torch.Tensor) -> torch.Tensor:  # each row's distribution at its current node
        return probs[rows, node].to(torch.float64)

    big_p, big_q = at(target_probs), at(draft_probs)
    path = torch.full((b, deepest), PAD, dtype=torch.int64, device=device)
    token = torch.full((b,), PAD, dtype=torch.int64, device=device)
    active = torch.ones(b, dtype=torch.bool, device=device)
    for depth in range(deepest + 1):
        accepted = torch.full((b,), PAD, dtype=torch.int64, device=device)
        for rank in range(children.shape[2]):
            u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
            child = children[rows, node, rank]
            trying = active & (accepted < 0) & (child >= 0)
            if not bool(trying.any()):
                continue  # the uniform is drawn all the same: the stream does not depend on the data
            x = draft_token_ids[rows, child.clamp_min(0)].unsqueeze(1)
            px = big_p.gather(1, x).squeeze(1)
            if drafting == "top-k":
                accept = trying & (u < px)
                residual = big_p.scatter(1, x, 0.0)
                new_q = big_q
            else:
                accept = trying & (u * big_q.gather(1, x).squeeze(1) < px)
                residual = (big_p - big_q).clamp_min(0)
                new_q = normalised(big_q.scatter(1, x, 0.0), big_q) if drafting == "without-replacement" else big_q
            accepted = torch.where(accept, child, accepted)
            rejected = (trying & ~accept).unsqueeze(1)
            big_p = torch.where(rejected, normalised(residual, big_p), big_p)
            big_q = torch.where(rejected, new_q, big_q)
        u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
        stops = active & (accepted < 0)
        token = torch.where(stops, inverse_cdf_blocked(big_p, u), token)
        active &= ~stops
        if depth < deepest:
            path[:, depth] = torch.where(active, accepted, PAD)
        node = torch.where(active, accepted, node)
        big_p, big_q = at(target_probs), at(draft_probs)
    return path, token


class TreeReference:
    """A registered tree reference for one drafting scheme; it declares ``standard-rejection``:
    the standard multi-step rule of its scheme (the harness holds a top-k model's chain view,
    which sees one-hot drafts, to the lossless rules only)."""

    def __init__(self, drafting: str) -> None:
        self.spectest_tree_drafting = drafting
        self.spectest_capabilities = frozenset({"standard-rejection"})

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        return verify_tree(
            parents,
            draft_token_ids,
            draft_probs,
            target_probs,
            generator=generator,
            drafting=self.spectest_tree_drafting,
        )


TREE_IID = TreeReference("iid")
TREE_WITHOUT_REPLACEMENT = TreeReference("without-replacement")
TREE_TOPK = TreeReference("top-k")
