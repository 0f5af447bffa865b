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
    count_duplicates=False,
    continue_below_rejected=False,
    give_up=0.0,
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
            if count_duplicates:  # q(x) times the number of siblings drafted as x
                kids = children[rows, node]
                same = (tokens.gather(1, kids.clamp_min(0)) == x) & (kids >= 0)
                qx = qx * same.sum(dim=1)
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
        if give_up:  # lossless but wasteful: now and then ignore the children and draw from p
            quit_here = active & (torch.rand(b, generator=generator, device=device, dtype=torch.float64) < give_up)
            accepted = torch.where(quit_here, PAD, accepted)
            big_p = torch.where(quit_here.unsqueeze(1), p0, big_p)
        if continue_below_rejected:  # every child rejected: go on into the first one anyway
            first = children[rows, node, 0]
            accepted = torch.where(active & (accepted < 0) & (first >= 0), first, accepted)
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


class _Inputs(_Buggy):
    """A correct verifier handed inputs broken by ``breaks``."""

    def __init__(self, drafting: str, doc: str, breaks) -> None:
        super().__init__(drafting, doc)
        self.breaks = breaks

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        return super().verify_tree(
            *self.breaks(parents, draft_token_ids, draft_probs, target_probs), generator=generator
        )


def _rows_shifted(parents, tokens, draft_probs, target_probs):
    return parents, tokens, draft_probs, target_probs.roll(1, dims=0)


class _LongestPath:
    """Verifies every root-to-leaf path on its own, as a chain, and keeps the longest accepted
    prefix (ties: the first leaf): each path alone is exact, the choice among them is biased."""

    spectest_tree_drafting = "iid"

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        from spectest.implementations.reference import verify as chain_verify

        b, n = parents.shape
        device = parents.device
        rows = torch.arange(b, device=device)
        deepest = int(depths(parents).max())
        is_leaf = (parents >= 0) & ~(parents.unsqueeze(2) == torch.arange(n, device=device)).any(dim=1)
        is_leaf[:, 0] = ~(parents[:, 1:] >= 0).any(dim=1)
        best_len = torch.full((b,), -1, dtype=torch.int64, device=device)
        best_path = torch.full((b, deepest), PAD, dtype=torch.int64, device=device)
        best_token = torch.zeros(b, dtype=torch.int64, device=device)
        for leaf in range(n):
            chain = [torch.where(is_leaf[:, leaf], leaf, 0)]  # rows where it is no leaf: the root alone
            for _ in range(deepest):
                chain.append(torch.where(chain[-1] > 0, parents[rows, chain[-1].clamp_min(0)], chain[-1]))
            nodes = torch.stack(chain[::-1], dim=1)  # root ... leaf, the root repeated in front
            start = (nodes == 0).sum(dim=1) - 1  # position of the root
            k = max(deepest, 1)
            slots = (start.unsqueeze(1) + torch.arange(k + 1, device=device)).clamp_max(deepest)
            along = nodes.gather(1, slots)  # root, depth 1, ..., repeated leaf at the end
            length = (depths(parents).gather(1, nodes[:, -1:].clamp_min(0))).squeeze(1)
            ids = draft_token_ids.gather(1, along[:, 1:])
            q = draft_probs[rows.unsqueeze(1), along[:, :-1]]
            p = target_probs[rows.unsqueeze(1), along]
            emitted = chain_verify(ids, q.to(p.dtype), p, generator=generator)
            got = ((emitted[:, :-1] == ids).long().cumprod(dim=1).sum(dim=1)).clamp_max(length)
            better = is_leaf[:, leaf] & (got > best_len)
            if not bool(better.any()):
                continue
            best_len = torch.where(better, got, best_len)
            taken = torch.where(torch.arange(deepest, device=device) < got.unsqueeze(1), along[:, 1 : deepest + 1], PAD)
            best_path = torch.where(better.unsqueeze(1), taken, best_path)
            u = torch.rand(b, generator=generator, device=device, dtype=torch.float64)
            bonus = inverse_cdf_blocked(target_probs[rows, nodes[:, -1]].double(), u)  # the whole path accepted
            best_token = torch.where(better, torch.where(got == length, bonus, emitted[rows, got]), best_token)
        return best_path, best_token


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
# The per-node check catches it only about one run in two (the bias of a reused uniform is spread
# over every token id); the joint over sequences catches it every time.
tree_uniform_reused = _Buggy("iid", "The last acceptance uniform is reused for the correction.", reuse_uniform=True)
tree_skips_duplicate_siblings = _Buggy(
    "iid", "A sibling with the token of a rejected sibling is skipped as already rejected.", skip_duplicates=True
)
tree_lossy_threshold = _Buggy("iid", "Accepts any child whose p / q is at least 0.5 (lossy).", threshold=0.5)
tree_leaf_bonus_from_parent = _Buggy(
    "top-k", "The bonus at a leaf is drawn from its parent's p.", leaf_bonus_from_parent=True
)
tree_counts_duplicates_twice = _Buggy(
    "iid", "q(x) of a sibling is multiplied by how many siblings drafted x.", count_duplicates=True
)
tree_topk_rule_on_iid = _Buggy(
    "iid",
    "Sampled children verified as one-hot drafts (accept with P(x)): lossless, but accepts less; "
    "declares the standard rule.",
    soft_q=False,
)
tree_topk_rule_on_iid.spectest_capabilities = frozenset({"standard-rejection"})
tree_continues_below_rejected = _Buggy(
    "iid", "When every child is rejected, the path goes on into the first child.", continue_below_rejected=True
)
tree_rows_mixed = _Inputs("iid", "Each row verifies against the previous row's target.", _rows_shifted)
tree_longest_path = _LongestPath()
tree_accepts_less = _Buggy(
    "iid", "Exact, but gives up on a node's children one time in five; declares the standard rule.", give_up=0.2
)
tree_accepts_less.spectest_capabilities = frozenset({"standard-rejection"})
tree_parent_off_by_one = _Transformed("iid", "Returns node ids one too low.", _off_by_one)
tree_int32_path = _Transformed("top-k", "Returns the path as int32.", _int32)

JOINT = "test_tree_sequences_follow_the_target"
TOKENS_PER_PASS = "test_tree_tokens_per_pass_follow_the_exact_model"
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
    "tree_uniform_reused": {JOINT: (R.TREE_JOINT, R.NEVER_IMPOSSIBLE)},
    "tree_counts_duplicates_twice": STATISTICAL,
    "tree_topk_rule_on_iid": {TOKENS_PER_PASS: (R.TREE_TOKENS_PER_PASS,)},
    "tree_continues_below_rejected": {PER_NODE: NODE_OR_ZERO, EXACT: (R.NEVER_ACCEPTS_IMPOSSIBLE_NODE, R.FORCED_PATH)},
    "tree_rows_mixed": {
        PER_NODE: NODE_OR_ZERO,
        EXACT: (R.FORCED_PATH, R.NEVER_ACCEPTS_IMPOSSIBLE_NODE, R.NEVER_IMPOSSIBLE),
    },
    "tree_longest_path": STATISTICAL,
    # Lossless (the joint and per-node checks pass it): only the standard rule's figures catch it.
    "tree_accepts_less": {TOKENS_PER_PASS: (R.TREE_TOKENS_PER_PASS,), EXACT: (R.FORCED_PATH,)},
    "tree_leaf_bonus_from_parent": STATISTICAL,
    # Usually not a chain under parents any more; where it still is (a path of one node), the wrong node.
    "tree_parent_off_by_one": {
        PER_NODE: (R.PATH_FOLLOWS_THE_TREE, *NODE_OR_ZERO),
        EXACT: (R.PATH_FOLLOWS_THE_TREE, R.FORCED_PATH),
    },
    "tree_int32_path": {PER_NODE: (R.OUTPUT_DTYPE,), EXACT: (R.OUTPUT_DTYPE,)},
}
