"""The Monte Carlo twin of the analytic models: the same chain, sampled (vectorised, seeded).

Each simulator draws with a caller-supplied ``numpy.random.Generator`` so that any figure it
produces replays from its seed. Tests cross-check every analytic quantity against these.
"""

from __future__ import annotations

import numpy as np
from spectest.simulators.markov import MarkovChainModel


def simulate_positions(acceptance: np.ndarray | list[float], passes: int, rng: np.random.Generator) -> np.ndarray:
    """L for ``passes`` independent passes with position-dependent acceptance a_1..a_K."""
    a = np.asarray(acceptance, dtype=np.float64)
    accepted = rng.random((passes, a.size)) < a
    return np.cumprod(accepted, axis=1).sum(axis=1) + 1


def simulate_iid(alpha: float, k: int, passes: int, rng: np.random.Generator) -> np.ndarray:
    return simulate_positions(np.full(k, alpha), passes, rng)


def _categorical(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    cdf = rows.cumsum(axis=1)
    u = rng.random(rows.shape[0])[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=1), rows.shape[1] - 1)


def simulate_markov(
    model: MarkovChainModel, k: int, chains: int, passes: int, rng: np.random.Generator, start: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``chains`` independent generations for ``passes`` passes each, token by token.

    Returns (start context of every pass [chains, passes], tokens emitted [chains, passes]).
    ``start``: each chain's first context (default: the start-of-sequence context).
    """
    context = np.full(chains, model.start) if start is None else np.asarray(start).copy()
    starts = np.empty((chains, passes), dtype=np.int64)
    emitted = np.empty((chains, passes), dtype=np.int64)
    rows = np.arange(chains)
    for t in range(passes):
        starts[:, t] = context
        alive = np.ones(chains, dtype=bool)  # still accepting in this pass
        count = np.zeros(chains, dtype=np.int64)
        last = context.copy()
        for _ in range(k):
            q = model.draft[last]
            p = model.target[last]
            proposal = _categorical(q, rng)
            ratio = p[rows, proposal] / q[rows, proposal]
            accept = alive & (rng.random(chains) < ratio)
            reject = alive & ~accept
            if reject.any():
                residual = np.clip(p[reject] - q[reject], 0, None)
                last[reject] = _categorical(residual, rng)
                count[reject] += 1
            last[accept] = proposal[accept]
            count[accept] += 1
            alive = accept
        if alive.any():  # bonus token after K accepts
            last[alive] = _categorical(model.target[last[alive]], rng)
            count[alive] += 1
        emitted[:, t] = count
        context = last
    return starts, emitted


def simulate_tree(
    parents: np.ndarray,
    target: np.ndarray,
    draft: np.ndarray,
    drafting: str,
    context: int,
    passes: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Draft and verify ``passes`` independent trees of one shape from one root context, node by
    node: tables [D + 1, T, V] as in ``simulators.tree.expected_tree_pass``. Returns each pass's
    accepted depth and extra token."""
    from spectest.simulators.tree import TOP_K, WITHOUT_REPLACEMENT, tree_children, tree_depths

    children, depth = tree_children(parents), tree_depths(parents)
    target, draft = np.asarray(target, np.float64), np.asarray(draft, np.float64)
    if target.ndim == 2:
        target, draft = target[None].repeat(depth.max() + 1, 0), draft[None].repeat(depth.max() + 1, 0)
    v, rows = target.shape[-1], np.arange(passes)
    tokens = np.zeros((passes, depth.size), dtype=np.int64)
    tokens[:, 0] = context
    for node in range(depth.size):  # draft every node's children from q at the node
        if depth[node] < 0 or not children[node]:
            continue
        q = draft[depth[node], tokens[:, node]]
        taken = np.zeros_like(q, dtype=bool)
        for rank, child in enumerate(children[node]):
            if drafting == TOP_K:
                tokens[:, child] = np.argsort(-q, axis=1, kind="stable")[:, min(rank, v - 1)]
            else:
                weights = np.where(taken, 0.0, q) if drafting == WITHOUT_REPLACEMENT else q
                tokens[:, child] = _categorical(weights, rng)
                taken[rows, tokens[:, child]] = True
    accepted_depth = np.zeros(passes, dtype=np.int64)
    extra = np.zeros(passes, dtype=np.int64)
    for i in range(passes):  # verify, pass by pass (the twin favours plainness over speed)
        node = 0
        while True:
            big_p = target[depth[node], tokens[i, node]].copy()
            big_q = draft[depth[node], tokens[i, node]].copy()
            chosen = None
            for child in children[node]:
                x = tokens[i, child]
                if drafting == TOP_K:
                    if rng.random() < big_p[x]:
                        chosen = child
                        break
                    big_p[x] = 0.0
                else:
                    if rng.random() * big_q[x] < big_p[x]:
                        chosen = child
                        break
                    big_p = np.clip(big_p - big_q, 0, None)
                    if drafting == WITHOUT_REPLACEMENT:
                        big_q[x] = 0.0
                        big_q /= big_q.sum()
                big_p /= big_p.sum()
            if chosen is None:
                accepted_depth[i] = depth[node]
                extra[i] = _categorical(big_p[None, :], rng)[0]
                break
            node = chosen
    return accepted_depth, extra
