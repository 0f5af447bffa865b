"""Exact acceptance-chain model for finite-state (order-1 Markov) target/draft pairs.

Contexts are the last token (plus a start context). In context c the draft proposes x and it is
accepted with probability min(1, T(c,x)/D(c,x)), so "x proposed and accepted" has probability
A(c, x) = min(T(c, x), D(c, x)). With F_j(c0, c') the probability that a pass started in c0
accepts its first j drafts and the j-th is c':

    F_0 = I,  F_{j+1} = F_j A,  P(L >= j + 1) = F_j 1.

The pass ends in the context of its last emitted token: the correction y after j accepts with
probability F_j R (R(c', y) = max(0, T(c', y) - D(c', y))), or the bonus after K accepts with
probability F_K T. Those next-context probabilities form a Markov chain over pass start
contexts; its long-run (Cesàro) distribution from the start context, solved exactly with linear
algebra, gives the long-run tokens per pass of a whole generation (renewal-reward).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.sparse.csgraph import connected_components
from spectest.simulators.chain import TokensPerPass


@dataclass(frozen=True)
class MarkovChainModel:
    """Target and draft tables [V + 1, V]: row c is the next-token distribution in context c,
    row V the start-of-sequence context (the layout of ``spectest.cases.toy_models.MarkovChain``)."""

    target: np.ndarray
    draft: np.ndarray

    def __post_init__(self) -> None:
        if self.target.shape != self.draft.shape or self.target.shape[0] != self.target.shape[1] + 1:
            raise ValueError(f"need two [V + 1, V] tables, got {self.target.shape} and {self.draft.shape}")

    @property
    def vocab_size(self) -> int:
        return self.target.shape[1]

    @property
    def start(self) -> int:
        return self.vocab_size

    def _accepted(self) -> np.ndarray:
        """A as a square [V + 1, V + 1] matrix over contexts (no token leads back to the start)."""
        square = np.zeros((self.vocab_size + 1, self.vocab_size + 1))
        square[:, : self.vocab_size] = np.minimum(self.target, self.draft)
        return square

    def _square(self, table: np.ndarray) -> np.ndarray:
        square = np.zeros((self.vocab_size + 1, self.vocab_size + 1))
        square[:, : self.vocab_size] = table
        return square

    def tokens_per_pass(self, k: int) -> TokensPerPass:
        """Exact distribution of L for a pass started in each context: probs [V + 1, K + 1]."""
        accepted = self._accepted()
        reach = np.empty((self.vocab_size + 1, k + 1))
        f = np.eye(self.vocab_size + 1)
        for j in range(k + 1):
            reach[:, j] = f.sum(axis=1)  # P(L >= j + 1)
            f = f @ accepted
        stop = reach - np.concatenate([reach[:, 1:], np.zeros((reach.shape[0], 1))], axis=1)
        return TokensPerPass(stop)

    def next_context(self, k: int) -> np.ndarray:
        """N [V + 1, V + 1]: probability that a pass started in c0 ends with last token c1."""
        accepted = self._accepted()
        residual = self._square(np.clip(self.target - self.draft, 0, None))
        bonus = self._square(self.target)
        f = np.eye(self.vocab_size + 1)
        nxt = np.zeros_like(f)
        for _ in range(k):
            nxt += f @ residual
            f = f @ accepted
        return nxt + f @ bonus

    def long_run_contexts(self, k: int) -> np.ndarray:
        """Cesàro-limit distribution of pass start contexts from the start of a sequence."""
        return long_run_distribution(self.next_context(k), self.start)

    def long_run_tokens_per_pass(self, k: int) -> float:
        """Exact long-run mean tokens per target pass of a whole generation."""
        return float(self.long_run_contexts(k) @ self.tokens_per_pass(k).mean)

    def prefix_match_bound(self, j: int, context: int | None = None, max_sequences: int = 2_000_000) -> float:
        """Maximal-coupling bound: no lossless verifier emits the draft's first j tokens from
        ``context`` with probability above sum over j-token sequences of min(P(seq), Q(seq)).
        Exact when V^j <= max_sequences; otherwise the exact bound of the longest affordable
        prefix, which is larger (so still a valid bound)."""
        context = self.start if context is None else context
        v = self.vocab_size
        affordable = max(1, min(j, int(np.log(max_sequences) / np.log(max(v, 2)))))
        p = self.target[context]
        q = self.draft[context]
        for _ in range(affordable - 1):
            last = np.arange(p.size) % v
            p = (p[:, None] * self.target[last]).reshape(-1)
            q = (q[:, None] * self.draft[last]).reshape(-1)
        return float(np.minimum(p, q).sum())


def long_run_distribution(transition: np.ndarray, start: int) -> np.ndarray:
    """lim (1/n) sum_t e_start P^t for a finite chain, exactly: absorption probabilities into
    each closed class times that class's stationary distribution."""
    states = transition.shape[0]
    reachable = np.zeros(states, dtype=bool)
    frontier = [start]
    reachable[start] = True
    while frontier:
        state = frontier.pop()
        for nxt in np.flatnonzero(transition[state] > 0):
            if not reachable[nxt]:
                reachable[nxt] = True
                frontier.append(int(nxt))
    index = np.flatnonzero(reachable)
    sub = transition[np.ix_(index, index)]
    _, labels = connected_components(sub > 0, directed=True, connection="strong")
    closed = [c for c in np.unique(labels) if sub[np.ix_(labels == c, labels != c)].sum() <= 1e-15]
    transient = np.isin(labels, closed, invert=True)
    result = np.zeros(states)
    local_start = int(np.flatnonzero(index == start)[0])
    for c in closed:
        members = labels == c
        block = sub[np.ix_(members, members)]
        stationary = _stationary(block)
        if transient.any():  # absorption probability into this class
            q = sub[np.ix_(transient, transient)]
            r = sub[np.ix_(transient, members)].sum(axis=1)
            absorb = np.linalg.solve(np.eye(q.shape[0]) - q, r)
            weight = (
                absorb[np.flatnonzero(transient) == local_start].sum()
                if transient[local_start]
                else float(members[local_start])
            )
        else:
            weight = float(members[local_start])
        result[index[members]] += weight * stationary
    return result


def _stationary(block: np.ndarray) -> np.ndarray:
    """Stationary distribution of an irreducible stochastic matrix (least squares for stability)."""
    n = block.shape[0]
    system = np.vstack([block.T - np.eye(n), np.ones((1, n))])
    rhs = np.zeros(n + 1)
    rhs[-1] = 1.0
    solution, *_ = np.linalg.lstsq(system, rhs, rcond=None)
    solution = np.clip(solution, 0, None)
    return solution / solution.sum()


def context_free_prefix_bound(target: np.ndarray, draft: np.ndarray, j: int, max_sequences: int = 2_000_000) -> float:
    """Maximal-coupling bound for per-position distributions that do not depend on the prefix
    (target [K+1, V], draft [K, V]): sum over j-token sequences of min(prod p_i, prod q_i)."""
    v = target.shape[-1]
    affordable = max(1, min(j, int(np.log(max_sequences) / np.log(max(v, 2)))))
    p, q = target[0], draft[0]
    for i in range(1, affordable):
        p = np.multiply.outer(p, target[i]).reshape(-1)
        q = np.multiply.outer(q, draft[i]).reshape(-1)
    return float(np.minimum(p, q).sum())


def brute_force_prefix_bound(model: MarkovChainModel, j: int) -> float:
    """The same bound by explicit enumeration (for tests on tiny vocabularies)."""
    total = 0.0
    for seq in itertools.product(range(model.vocab_size), repeat=j):
        p = q = 1.0
        context = model.start
        for token in seq:
            p *= model.target[context, token]
            q *= model.draft[context, token]
            context = token
        total += min(p, q)
    return total
