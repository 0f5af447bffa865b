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
    children = children_table(parents)
    deepest = int(depths(parents).max())
    node = torch.zeros(b, dtype=torch.int64, device=device)
    path = torch.full((b, deepest), PAD, dtype=torch.int64, device=device)
    active = torch.ones(b, dtype=torch.bool, device=device)
    v = target_probs.shape[-1]
    # The running P and Q of a row exist only once it has rejected a child at its current node
    # ("dirty"): until then they are the node's p and q, read in place (a chain view's rows then
    # cost a gather per draft, as the chain reference does, not a V-long row).
    big_p = torch.zeros((b, v), dtype=torch.float64, device=device)
    big_q = torch.zeros((b, v), dtype=torch.float64, device=device)
    extra = torch.zeros((b, v), dtype=torch.float64, device=device)  # each row's extra-token weights
    extra_u = torch.zeros(b, dtype=torch.float64, device=device)  # and its uniform, drawn at its depth
    for depth in range(deepest + 1):
        accepted = torch.full((b,), PAD, dtype=torch.int64, device=device)
        dirty = torch.zeros(b, dtype=torch.bool, device=device)
        for rank in range(children.shape[2]):
            u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
            child = children[torch.arange(b, device=device), node, rank]
            trying = (active & (accepted < 0) & (child >= 0)).nonzero().squeeze(1)
            if trying.numel() == 0:
                continue  # the uniform is drawn all the same: the stream does not depend on the data
            at_node = node[trying]
            x = draft_token_ids[trying, child[trying]]
            seen = dirty[trying]
            px = torch.where(seen, big_p[trying, x], target_probs[trying, at_node, x].double())
            if drafting == "top-k":
                accept = u[trying] < px
            else:
                qx = torch.where(seen, big_q[trying, x], draft_probs[trying, at_node, x].double())
                accept = u[trying] * qx < px
            accepted[trying[accept]] = child[trying[accept]]
            rejected = trying[~accept]
            if rejected.numel() == 0:
                continue
            x, seen, at_node = x[~accept].unsqueeze(1), seen[~accept].unsqueeze(1), at_node[~accept]
            p_rows = torch.where(seen, big_p[rejected], target_probs[rejected, at_node].double())
            q_rows = torch.where(seen, big_q[rejected], draft_probs[rejected, at_node].double())
            if drafting == "top-k":
                big_p[rejected] = normalised(p_rows.scatter(1, x, 0.0), p_rows)
            else:
                big_p[rejected] = normalised((p_rows - q_rows).clamp_min(0), p_rows)
                if drafting == "without-replacement":
                    q_rows = normalised(q_rows.scatter(1, x, 0.0), q_rows)
            big_q[rejected] = q_rows
            dirty[rejected] = True
        u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
        stops = active & (accepted < 0)
        stopping = stops.nonzero().squeeze(1)
        if stopping.numel():  # the correction from P, or the bonus from p at a node without children
            seen = dirty[stopping].unsqueeze(1)
            extra[stopping] = torch.where(seen, big_p[stopping], target_probs[stopping, node[stopping]].double())
            extra_u[stopping] = u[stopping]
        active &= ~stops
        if depth < deepest:
            path[:, depth] = torch.where(active, accepted, PAD)
        node = torch.where(active, accepted, node)
    return path, inverse_cdf_blocked(extra, extra_u)  # one draw per row, as if made at its depth


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
