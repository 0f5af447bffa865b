"""Tokens per pass under block verification (Sun et al. 2024), exact by enumeration.

Given the drafts x_1..x_K, block verification's acceptance is fixed by the running weights
w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)) and the success probabilities h_i (see
``spectest.implementations.block``): with independent coins, the accepted length tau is the last
success, so P(tau = i | x) = h_i prod_{j > i} (1 - h_j) (h_0 = 1). The distribution of L = tau + 1
averages that over every draft sequence, weighted by prod q_i(x_i): V^K sequences, enumerated
in chunks (``max_sequences`` caps the work). Per-position distributions do not depend on the
drafts here (the context-free pairs of the chain properties).
"""

from __future__ import annotations

import itertools

import numpy as np
from spectest.simulators.chain import TokensPerPass, acceptance_probability, tokens_per_pass

CHUNK = 65_536


def _success(p: np.ndarray, q: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """h [S, K] for draft sequences ``drafts`` [S, K] (p [K + 1, V], q [K, V])."""
    k = q.shape[0]
    positions = np.arange(k)
    px, qx = p[positions, drafts], q[positions, drafts]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(qx > 0, px / np.where(qx > 0, qx, 1.0), np.where(px > 0, 2.0, 0.0))
    w = np.empty_like(ratio)  # w[:, i] = w_{i+1}
    running = np.ones(drafts.shape[0])
    for i in range(k):  # the cap applies at every step: min(1, w_{i-1} r_i), not min(1, prod r)
        running = np.minimum(running * ratio[:, i], 1.0)
        w[:, i] = running
    h = np.empty_like(w)
    for i in range(k - 1):
        residual = np.clip(w[:, i, None] * p[i + 1] - q[i + 1], 0, None).sum(axis=1)
        denominator = residual + 1 - w[:, i]
        h[:, i] = np.where(denominator > 0, residual / np.where(denominator > 0, denominator, 1.0), 1.0)
    h[:, k - 1] = w[:, k - 1]
    return h


def block_tokens_per_pass(p: np.ndarray, q: np.ndarray, *, max_sequences: int = 2_000_000) -> TokensPerPass:
    """Exact distribution of L under block verification for one row: ``p`` [K + 1, V] (target
    after 0..K drafts), ``q`` [K, V]."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    k, v = q.shape
    if p.shape != (k + 1, v):
        raise ValueError(f"need p [K + 1, V] and q [K, V], got {p.shape} and {q.shape}")
    supports = [np.flatnonzero(q[i] > 0) for i in range(k)]
    count = int(np.prod([s.size for s in supports], dtype=np.float64))
    if count > max_sequences:
        raise ValueError(f"{count} draft sequences exceed max_sequences={max_sequences}: use a smaller V or K")
    probs = np.zeros(k + 1)
    sequences = itertools.product(*supports)
    while True:
        chunk = np.array(list(itertools.islice(sequences, CHUNK)), dtype=np.int64).reshape(-1, k)
        if chunk.size == 0:
            break
        weight = np.prod(q[np.arange(k), chunk], axis=1)
        h = _success(p, q, chunk)
        ones = np.ones((len(chunk), 1))
        later_fail = np.concatenate([np.cumprod((1 - h)[:, ::-1], axis=1)[:, ::-1], ones], axis=1)  # prod_{j > i}
        tau = np.concatenate([ones, h], axis=1) * later_fail  # P(tau = i), i = 0..K
        probs += weight @ tau
    return TokensPerPass(probs)


def token_wise_tokens_per_pass(p: np.ndarray, q: np.ndarray) -> TokensPerPass:
    """The same row under token-wise rejection sampling (the chain model)."""
    return tokens_per_pass(acceptance_probability(np.asarray(p)[: len(q)], np.asarray(q)))
