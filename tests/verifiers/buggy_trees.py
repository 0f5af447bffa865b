"""Known-buggy tree verifiers: each breaks one rule that engines' tree samplers have broken or
nearly broken. Written independently of spectest's reference (a second, loop-per-row oracle
would be too slow; this one is vectorised like the reference but with every step overridable).

``BUGS`` declares, for each, the properties that must catch it and the rules they may name.
"""

from __future__ import annotations

import torch

from spectest import rules as R
from spectest.implementations.tree import children_table, normalised
from spectest.protocol import PAD
from spectest.sampling import inverse_cdf_blocked
from spectest.tree_protocol import depths

PER_NODE = "test_every_reached_tree_node_is_exact"
EXACT = "test_tree_paths_obey_the_exact_rules"
NODE_OR_ZERO = (R.PER_NODE, R.NEVER_IMPOSSIBLE)


def _tree(
    parents,
    tokens,
    draft_probs,
    target_probs,
    generator,
    *,
    drafting,
    threshold=None,
    residual_from_node_p=False,
    update_q=None,
    soft_q=None,
    correction_from_first_child=False,
    leaf_bonus_from_residual=False,
    reuse_uniform=False,
    skip_duplicates=False,
    leaf_bonus_from_parent=False,
):
    """Multi-step rejection sampling over each node's children, every step overridable."""
    b = parents.shape[0]
    device = parents.device
    rows = torch.arange(b, device=device)
    children = children_table(parents)
    deepest = int(depths(parents).max())
    update_q = (drafting == "without-replacement") if update_q is None else update_q
    soft_q = (drafting != "top-k") if soft_q is None else soft_q
    node = torch.zeros(b, dtype=torch.int64, device=device)
    parent_of = torch.zeros(b, dtype=torch.int64, device=device)
    path = torch.full((b, deepest), PAD, dtype=torch.int64, device=device)
    token = torch.full((b,), PAD, dtype=torch.int64, device=device)
    active = torch.ones(b, dtype=torch.bool, device=device)
    for depth in range(deepest + 1):
        p0 = target_probs[rows, node].double()
        big_p, big_q = p0, draft_probs[rows, node].double()
        accepted = torch.full((b,), PAD, dtype=torch.int64, device=device)
        tried = torch.zeros_like(big_p, dtype=torch.bool)
        last_u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
        for rank in range(children.shape[2]):
            u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
            child = children[rows, node, rank]
            trying = active & (accepted < 0) & (child >= 0)
            x = tokens[rows, child.clamp_min(0)].unsqueeze(1)
            if skip_duplicates:
                trying &= ~tried.gather(1, x).squeeze(1)
            last_u = torch.where(trying, u, last_u)
            px = big_p.gather(1, x).squeeze(1)
            qx = big_q.gather(1, x).squeeze(1) if soft_q else torch.ones_like(px)
            accept = trying & (u * qx < px)
            if threshold is not None:
                accept |= trying & (px >= threshold * qx)
            one_hot = torch.zeros_like(big_q).scatter(1, x, 1.0)
            q_used = big_q if soft_q else one_hot
            residual = ((p0 if residual_from_node_p else big_p) - q_used).clamp_min(0)
            accepted = torch.where(accept, child, accepted)
            rejected = (trying & ~accept).unsqueeze(1)
            tried |= rejected & one_hot.bool()
            big_p = torch.where(rejected, normalised(residual, big_p), big_p)
            if update_q:
                big_q = torch.where(rejected, normalised(big_q.scatter(1, x, 0.0), big_q), big_q)
        u = last_u if reuse_uniform else torch.rand(b, generator=generator, device=device, dtype=torch.float64)
        stops = active & (accepted < 0)
        has_children = children[rows, node, 0] >= 0
        weights = big_p
        if correction_from_first_child:
            first = children[rows, node, 0].clamp_min(0)
            weights = torch.where(has_children.unsqueeze(1), target_probs[rows, first].double(), weights)
        if leaf_bonus_from_residual:
            leaf_residual = normalised((p0 - draft_probs[rows, node].double()).clamp_min(0), p0)
            weights = torch.where((~has_children & (node > 0)).unsqueeze(1), leaf_residual, weights)
        if leaf_bonus_from_parent:
            weights = torch.where((~has_children).unsqueeze(1), target_probs[rows, parent_of].double(), weights)
        token = torch.where(stops, inverse_cdf_blocked(weights, u), token)
        active &= ~stops
        if depth < deepest:
            path[:, depth] = torch.where(active, accepted, PAD)
        parent_of = torch.where(active, node, parent_of)
        node = torch.where(active, accepted, node)
    return path, token


class _Buggy:
    def __init__(self, drafting: str, doc: str, **bug) -> None:
        self.spectest_tree_drafting = drafting
        self.bug = bug
        self.__doc__ = doc

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        return _tree(
            parents,
            draft_token_ids,
            draft_probs,
            target_probs,
            generator,
            drafting=self.spectest_tree_drafting,
            **self.bug,
        )


class _Transformed(_Buggy):
    """A correct verifier whose output is then broken by ``breaks``."""

    def __init__(self, drafting: str, doc: str, breaks) -> None:
        super().__init__(drafting, doc)
        self.breaks = breaks

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        out = super().verify_tree(parents, draft_token_ids, draft_probs, target_probs, generator=generator)
        return self.breaks(parents, draft_token_ids, *out)


def _off_by_one(parents, tokens, path, token):
    return torch.where(path > 1, path - 1, path), token


def _int32(parents, tokens, path, token):
    return path.to(torch.int32), token


tree_residual_from_node_p = _Buggy(
    "iid",
    "The residual after a rejected sibling is taken from the node's p, not the running P.",
    residual_from_node_p=True,
)
tree_wr_rule_on_iid = _Buggy(
    "iid", "Drafts are i.i.d., but q is updated as if they were drawn without replacement.", update_q=True
)
tree_iid_rule_on_wr = _Buggy(
    "without-replacement", "Drafts are without replacement, but q is never updated.", update_q=False
)
tree_soft_q_on_topk = _Buggy("top-k", "Top-k children are deterministic, but the soft-q ratio is used.", soft_q=True)
tree_correction_from_child = _Buggy(
    "iid", "When every child is rejected, the token comes from the first child's p.", correction_from_first_child=True
)
tree_leaf_bonus_from_residual = _Buggy(
    "iid", "At a leaf the bonus is drawn from norm(max(p - q, 0)) instead of p.", leaf_bonus_from_residual=True
)
# Not in BUGS: the per-node check catches it only about one run in two (the bias of a reused
# uniform is spread over every token id); a joint tree property would be needed, as for the chain.
tree_uniform_reused = _Buggy("iid", "The last acceptance uniform is reused for the correction.", reuse_uniform=True)
tree_skips_duplicate_siblings = _Buggy(
    "iid", "A sibling with the token of a rejected sibling is skipped as already rejected.", skip_duplicates=True
)
tree_lossy_threshold = _Buggy("iid", "Accepts any child whose p / q is at least 0.5 (lossy).", threshold=0.5)
tree_leaf_bonus_from_parent = _Buggy(
    "top-k", "The bonus at a leaf is drawn from its parent's p.", leaf_bonus_from_parent=True
)
tree_parent_off_by_one = _Transformed("iid", "Returns node ids one too low.", _off_by_one)
tree_int32_path = _Transformed("top-k", "Returns the path as int32.", _int32)

STATISTICAL = {PER_NODE: NODE_OR_ZERO}
BUGS = {
    "tree_residual_from_node_p": STATISTICAL,
    "tree_wr_rule_on_iid": STATISTICAL,
    "tree_iid_rule_on_wr": STATISTICAL,
    "tree_soft_q_on_topk": STATISTICAL,
    "tree_correction_from_child": STATISTICAL,
    "tree_leaf_bonus_from_residual": STATISTICAL,
    "tree_skips_duplicate_siblings": STATISTICAL,
    "tree_lossy_threshold": STATISTICAL,
    "tree_leaf_bonus_from_parent": STATISTICAL,
    # Usually not a chain under parents any more; where it still is (a path of one node), the wrong node.
    "tree_parent_off_by_one": {
        PER_NODE: (R.PATH_FOLLOWS_THE_TREE, *NODE_OR_ZERO),
        EXACT: (R.PATH_FOLLOWS_THE_TREE, R.FORCED_PATH),
    },
    "tree_int32_path": {PER_NODE: (R.OUTPUT_DTYPE,), EXACT: (R.OUTPUT_DTYPE,)},
}
