"""Tokens per pass for draft trees: exact for given p and q, and Sequoia's positional model.

A pass over a tree accepts a root-to-node path and emits one extra token, so L = accepted depth
+ 1. At each node the children are tried in index order by multi-step rejection sampling (see
``spectest.implementations.tree``); how siblings were drafted decides the rule:

* ``drafted_tree_pass``: one tree with its drafted tokens and p, q at every node. Each child's
  acceptance probability is then fixed, so the reach of every node follows top-down.
* ``expected_tree_pass``: the expectation over the drafting too, for p and q that depend on the
  node's depth and its own token (an order-1 Markov pair per depth). A dynamic programme
  bottom-up over the tree, vectorised over the node's token: at a node, child s is drafted and
  accepted with probability min(P, Q)(x) and rejected with max(Q - P, 0)(x); i.i.d. siblings leave
  one running (P, Q), siblings without replacement branch on the rejected token (Q loses it).
* ``long_run_tree_tokens_per_pass``: a whole generation under an order-1 Markov pair: the pass
  start contexts form a Markov chain whose long-run distribution weighs each context's mean.
* Positional acceptance (Chen et al., "Sequoia", 2024): the child of sibling rank r is the
  accepted one with probability a_r (by depth, optionally), whatever the context. Expected tokens
  for a shape, the optimal tree for a node budget (dynamic programme) and its speedup against
  the best chain under a cost where drafting costs c per level and verifying N nodes 1 + d N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from spectest.simulators.chain import TokensPerPass
from spectest.simulators.markov import MarkovChainModel, long_run_distribution
from spectest.simulators.speed import CostModel

IID, WITHOUT_REPLACEMENT, TOP_K = "iid", "without-replacement", "top-k"
SCHEMES = (IID, WITHOUT_REPLACEMENT, TOP_K)
MAX_BRANCHES = 200_000  # rejected-token sequences one node may enumerate (without replacement)


def _check_parents(parents: np.ndarray) -> np.ndarray:
    parents = np.asarray(parents, dtype=np.int64)
    if parents.ndim != 1 or parents.size == 0 or parents[0] != -1:
        raise ValueError(f"parents must be a 1-d array starting with -1 (the root), got {parents.tolist()}")
    for i, parent in enumerate(parents[1:], start=1):
        if not (parent == -1 or 0 <= parent < i) or (parent >= 0 and parent != 0 and parents[parent] < 0):
            raise ValueError(f"node {i}: parent {parent} must be -1 (unused) or a used node before it")
    return parents


def tree_children(parents: np.ndarray) -> list[list[int]]:
    """The children of every node in index order (unused slots have none)."""
    parents = _check_parents(parents)
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every node (the root 0, unused slots -1)."""
    parents = _check_parents(parents)
    depth = np.full(parents.size, -1, dtype=np.int64)
    depth[0] = 0
    for node in range(1, parents.size):
        if parents[node] >= 0:
            depth[node] = depth[parents[node]] + 1
    return depth


def _check_scheme(drafting: str) -> None:
    if drafting not in SCHEMES:
        raise ValueError(f"drafting must be one of {SCHEMES}, got {drafting!r}")


def _normalised(weights: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    total = weights.sum(axis=-1, keepdims=True)
    return np.where(total > 0, weights / np.where(total > 0, total, 1.0), fallback)


@dataclass(frozen=True)
class TreePass:
    """One pass over a tree: L's distribution, each node's reach (the probability the path
    enters it) and the extra token's distribution."""

    tokens: TokensPerPass
    reach: np.ndarray  # [N]
    extra_token: np.ndarray  # [V]


def drafted_tree_pass(
    parents: np.ndarray, tokens: np.ndarray, draft_probs: np.ndarray, target_probs: np.ndarray, drafting: str
) -> TreePass:
    """Exact pass over one drafted tree: ``tokens`` [N], ``draft_probs`` and ``target_probs``
    [N, V] (node i's q and p), siblings verified by the rule of ``drafting``."""
    _check_scheme(drafting)
    children, depth = tree_children(parents), tree_depths(parents)
    p_all, q_all = np.asarray(target_probs, np.float64), np.asarray(draft_probs, np.float64)
    reach = np.zeros(depth.size)
    reach[0] = 1.0
    stop = np.zeros(int(depth.max()) + 1)
    extra = np.zeros(p_all.shape[-1])
    for node in range(depth.size):
        if depth[node] < 0 or reach[node] == 0:
            continue
        big_p, big_q, alive = p_all[node], q_all[node], reach[node]
        for child in children[node]:
            x = tokens[child]
            if drafting == TOP_K:
                accept = big_p[x]
            else:
                accept = min(1.0, big_p[x] / big_q[x]) if big_q[x] > 0 else float(big_p[x] > 0)
            reach[child] = alive * accept
            alive *= 1 - accept
            if drafting == TOP_K:
                big_p = _normalised(np.where(np.arange(big_p.size) == x, 0.0, big_p), big_p)
            else:
                residual = _normalised(np.clip(big_p - big_q, 0, None), big_p)
                if drafting == WITHOUT_REPLACEMENT:
                    big_q = _normalised(np.where(np.arange(big_q.size) == x, 0.0, big_q), big_q)
                big_p = residual
        stop[depth[node]] += alive
        extra += alive * big_p
    return TreePass(TokensPerPass(stop), reach, extra)


@dataclass(frozen=True)
class _Outcome:
    """Below one node, for every token the node may carry: accepted depth [T, D + 1] and the
    extra token [T, V]."""

    depths: np.ndarray
    extra: np.ndarray


def _node_outcome(p: np.ndarray, q: np.ndarray, children: list[_Outcome], drafting: str, width: int) -> _Outcome:
    """The DP step at one node with tables p, q [T, V] (rows: the node's token)."""
    rows, v = p.shape
    depths = np.zeros((rows, width))
    extra = np.zeros((rows, v))
    # A branch: (weight [T], P [T, V], Q [T, V]): all earlier siblings rejected this way.
    branches = [(np.ones(rows), p, q)]
    order = np.argsort(-q, axis=1, kind="stable") if drafting == TOP_K else None
    for rank, child in enumerate(children):
        below = np.concatenate([np.zeros((v, 1)), child.depths[:v, :-1]], axis=1)  # one level deeper
        next_branches = []
        for weight, big_p, big_q in branches:
            if drafting == TOP_K:
                x = order[:, min(rank, v - 1)]
                hit = np.zeros_like(big_p)
                hit[np.arange(rows), x] = 1.0
                accepted = big_p * hit
            else:
                accepted = np.minimum(big_p, big_q)
            depths += weight[:, None] * (accepted @ below)
            extra += weight[:, None] * (accepted @ child.extra[:v])
            if drafting == TOP_K:
                rest = weight * (1 - accepted.sum(axis=1))
                next_branches.append((rest, _normalised(big_p * (1 - hit), big_p), big_q))
            elif drafting == IID:
                rest = weight * (1 - accepted.sum(axis=1))
                next_branches.append((rest, _normalised(np.clip(big_p - big_q, 0, None), big_p), big_q))
            else:
                residual = _normalised(np.clip(big_p - big_q, 0, None), big_p)
                rejected = np.clip(big_q - big_p, 0, None)  # drafted x and rejected it
                for x in np.flatnonzero(rejected.max(axis=0) > 0):
                    removed = big_q.copy()
                    removed[:, x] = 0.0
                    next_branches.append((weight * rejected[:, x], residual, _normalised(removed, big_q)))
        branches = next_branches
        if len(branches) > MAX_BRANCHES:
            raise ValueError(f"a node enumerates {len(branches)} rejected-token sequences; use a smaller vocabulary")
    for weight, big_p, _ in branches:
        depths[:, 0] += weight
        extra += weight[:, None] * big_p
    return _Outcome(depths, extra)


def expected_tree_pass(
    parents: np.ndarray, target: np.ndarray, draft: np.ndarray, drafting: str
) -> tuple[TokensPerPass, np.ndarray]:
    """Exact pass averaged over the drafting, for every root context.

    ``target``, ``draft``: [D + 1, T, V] (or [T, V], the same at every depth): row t of level d is
    p (q) after a node at depth d whose token is t; rows 0..V-1 are tokens, the root may use
    further rows (a start-of-sequence context). Returns L's distribution [T, D + 1] and the extra
    token's [T, V], by the root's context."""
    _check_scheme(drafting)
    children, depth = tree_children(parents), tree_depths(parents)
    width = int(depth.max()) + 1
    target, draft = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    if target.ndim == 2:
        target, draft = np.broadcast_to(target, (width, *target.shape)), np.broadcast_to(draft, (width, *draft.shape))
    if target.shape != draft.shape or target.shape[0] < width or target.shape[1] < target.shape[2]:
        raise ValueError(f"need tables [>= {width}, T >= V, V], got {target.shape} and {draft.shape}")
    outcomes: dict[int, _Outcome] = {}
    for node in range(depth.size - 1, -1, -1):
        if depth[node] < 0:
            continue
        d = depth[node]
        outcomes[node] = _node_outcome(target[d], draft[d], [outcomes[c] for c in children[node]], drafting, width)
    root = outcomes[0]
    return TokensPerPass(root.depths), root.extra


def long_run_tree_tokens_per_pass(parents: np.ndarray, model: MarkovChainModel, drafting: str) -> float:
    """Exact long-run mean tokens per pass of a whole generation with one tree shape, under an
    order-1 Markov pair (tables [V + 1, V], row V the start of a sequence)."""
    dist, extra = expected_tree_pass(parents, model.target, model.draft, drafting)
    v = model.vocab_size
    transition = np.zeros((v + 1, v + 1))
    transition[:, :v] = extra  # the next pass starts after the extra token
    contexts = long_run_distribution(transition, model.start)
    return float(contexts @ dist.mean)


# Positional acceptance (Sequoia).


def _acceptance_by_depth(acceptance: np.ndarray | list[float], levels: int) -> np.ndarray:
    """[levels, W]: the rank acceptances at each depth (children at depth d + 1 use row d)."""
    a = np.asarray(acceptance, dtype=np.float64)
    a = a[None, :] if a.ndim == 1 else a
    if a.ndim != 2 or a.size == 0 or (a < 0).any() or (a.sum(axis=1) > 1 + 1e-12).any():
        raise ValueError(f"acceptance must be [W] or [depth, W], entries >= 0 summing to at most 1 per depth, got {a}")
    if a.shape[0] < levels:  # deeper levels keep the last level's rates
        a = np.concatenate([a, np.broadcast_to(a[-1], (levels - a.shape[0], a.shape[1]))])
    return a


def positional_tree_pass(parents: np.ndarray, acceptance: np.ndarray | list[float]) -> TokensPerPass:
    """L's distribution for a tree when the child of sibling rank r (at depth d + 1) is the
    accepted one with probability ``acceptance[r]`` (``acceptance[d, r]``), whatever the tokens."""
    children, depth = tree_children(parents), tree_depths(parents)
    levels = int(depth.max()) + 1
    a = _acceptance_by_depth(acceptance, max(levels - 1, 1))
    reach = np.zeros(depth.size)
    reach[0] = 1.0
    stop = np.zeros(levels)
    for node in range(depth.size):
        if depth[node] < 0:
            continue
        kids = children[node]
        if len(kids) > a.shape[1]:
            raise ValueError(f"node {node} has {len(kids)} children but acceptance covers {a.shape[1]} ranks")
        for rank, child in enumerate(kids):
            reach[child] = reach[node] * a[depth[node], rank]
        stop[depth[node]] += reach[node] * (1 - a[depth[node], : len(kids)].sum()) if kids else reach[node]
    return TokensPerPass(stop)


def positional_acceptance(p: np.ndarray, q: np.ndarray, width: int, drafting: str) -> np.ndarray:
    """a_r for a context-free pair: P(the rank-r child is the accepted one) at a node with
    ``width`` children drafted from q as ``drafting`` says, from stars of 1..width children."""
    star_accepts = []
    for k in range(1, width + 1):
        star = np.array([-1] + [0] * k)
        v = np.asarray(p).shape[-1]
        same = (np.broadcast_to(p, (v, v)), np.broadcast_to(q, (v, v)))  # every context alike
        dist, _ = expected_tree_pass(star, *same, drafting)
        star_accepts.append(1 - dist.probs[0, 0])
    return np.diff(np.concatenate([[0.0], star_accepts]))


@dataclass(frozen=True)
class OptimalTree:
    """The tree of at most ``budget`` drafted nodes (and ``max_depth`` levels) with the most
    expected tokens per pass under positional acceptance."""

    parents: np.ndarray
    tokens_per_pass: float

    @property
    def nodes(self) -> int:
        return int(self.parents.size - 1)

    @property
    def depth(self) -> int:
        return int(tree_depths(self.parents).max())


def _optimal_tables(budget: int, a: np.ndarray, max_depth: int) -> tuple[np.ndarray, list]:
    """best[h, n]: most expected tokens of a subtree of at most n nodes (with its root) rooted at
    depth max_depth - h (so of height <= h), under depth-dependent acceptance a [levels, W];
    choices[h][r, m]: the size of the rank-r child when ranks r.. share at most m nodes (0: none)."""
    n_max = budget + 1
    best = np.full((max_depth + 1, n_max + 1), -np.inf)
    best[:, 1:] = 1.0
    choices: list = [None] * (max_depth + 1)
    sizes = np.arange(1, n_max)
    fits = sizes[None, :] <= np.arange(n_max)[:, None]  # [m, s - 1]: a child of s nodes fits in m
    for h in range(1, max_depth + 1):
        rates = a[max_depth - h]
        gain = np.zeros((rates.size + 1, n_max))
        pick = np.zeros((rates.size + 1, n_max), dtype=np.int64)
        for r in range(rates.size - 1, -1, -1):
            rest = gain[r + 1][np.clip(np.arange(n_max)[:, None] - sizes[None, :], 0, None)]
            values = np.where(fits, rates[r] * best[h - 1, sizes][None, :] + rest, -np.inf)
            s = values.argmax(axis=1) if sizes.size else np.zeros(n_max, dtype=np.int64)
            top = values[np.arange(n_max), s] if sizes.size else np.full(n_max, -np.inf)
            better = top > 0
            gain[r] = np.where(better, top, 0.0)
            pick[r] = np.where(better, s + 1, 0)
        best[h, 1:] = 1.0 + gain[0]
        choices[h] = pick
    return best, choices


def _build(choices: list, h: int, nodes: int) -> np.ndarray:
    """The parents array of the optimal subtree of at most ``nodes`` nodes and height <= h."""
    parents = [-1]

    def grow(node: int, h: int, nodes: int) -> None:
        if h == 0 or nodes <= 1:
            return
        pick, remaining, rank = choices[h], nodes - 1, 0
        subtrees = []
        while rank < pick.shape[0] - 1 and remaining > 0 and pick[rank, remaining] > 0:
            subtrees.append(int(pick[rank, remaining]))
            remaining -= subtrees[-1]
            rank += 1
        for size in subtrees:
            parents.append(node)
            grow(len(parents) - 1, h - 1, size)

    grow(0, h, nodes)
    return np.asarray(parents, dtype=np.int64)


def optimal_tree(budget: int, acceptance: np.ndarray | list[float], *, max_depth: int | None = None) -> OptimalTree:
    """The tree of at most ``budget`` drafted nodes and ``max_depth`` levels maximising expected
    tokens per pass under positional acceptance (Sequoia's dynamic programme)."""
    if budget < 0 or (max_depth is not None and max_depth < 0):
        raise ValueError(f"budget and max_depth must be >= 0, got {budget} and {max_depth}")
    max_depth = budget if max_depth is None else min(max_depth, budget)
    a = _acceptance_by_depth(acceptance, max(max_depth, 1))
    _, choices = _optimal_tables(budget, a, max_depth)
    tree = _build(choices, max_depth, budget + 1)
    return OptimalTree(tree, float(positional_tree_pass(tree, a).mean))


def tree_speedup(tokens_per_pass: float, nodes: int, depth: int, cost: CostModel) -> float:
    """Speedup over plain decoding of a tree pass: drafting costs c per level, verifying N
    drafted nodes costs 1 + d N, plus the pass overhead (a chain of K is the tree K, K)."""
    return (
        tokens_per_pass
        * (1 + cost.plain_overhead)
        / (cost.cost_ratio * depth + 1 + cost.verify_growth * nodes + cost.overhead)
    )


@dataclass(frozen=True)
class TreePlan:
    """The optimal tree for a budget and the best chain within it, with their speedups."""

    tree: OptimalTree
    tree_speedup: float
    chain_k: int
    chain_tokens_per_pass: float
    chain_speedup: float

    def as_dict(self) -> dict[str, object]:
        return {
            "tree": {
                "parents": self.tree.parents.tolist(),
                "nodes": self.tree.nodes,
                "depth": self.tree.depth,
                "tokens_per_pass": self.tree.tokens_per_pass,
                "speedup": self.tree_speedup,
            },
            "chain": {"k": self.chain_k, "tokens_per_pass": self.chain_tokens_per_pass, "speedup": self.chain_speedup},
            "tree_over_chain": self.tree_speedup / self.chain_speedup,
        }


def plan_tree(
    budget: int, acceptance: np.ndarray | list[float], cost: CostModel, *, max_depth: int | None = None
) -> TreePlan:
    """The fastest tree and the fastest chain of at most ``budget`` drafted nodes and
    ``max_depth`` levels (every node count and height is tried: drafting costs per level)."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    max_depth = budget if max_depth is None else min(max_depth, budget)
    a = _acceptance_by_depth(acceptance, max(max_depth, 1))
    candidates = []
    for h in range(0, max_depth + 1):
        _, choices = _optimal_tables(budget, a, h)
        for n in range(1, budget + 2):
            tree = _build(choices, h, n)
            tokens = float(positional_tree_pass(tree, a).mean)
            best = OptimalTree(tree, tokens)
            candidates.append((tree_speedup(tokens, best.nodes, best.depth, cost), -best.nodes, best))
    speed, _, tree = max(candidates, key=lambda c: (c[0], c[1]))
    chains = []
    for k in range(0, max_depth + 1):
        chain = float(positional_tree_pass(np.arange(-1, k), a[:, :1]).mean) if k else 1.0
        chains.append((tree_speedup(chain, k, k, cost), -k, chain))
    chain_speed, minus_k, chain_tokens = max(chains)
    return TreePlan(tree, speed, -minus_k, chain_tokens, chain_speed)
