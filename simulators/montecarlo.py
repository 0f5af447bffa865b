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
