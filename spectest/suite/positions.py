"""Per-row, per-position exactness of repeated verify calls, shared by the chain and logits suites.

Every row and position of a batch has its own (p, q); the batch is handed to the verifier many
copies at a time with fresh drafts, and the emitted token at each (row, position) is tested
against p there, weighted by how often that position is reached (standard rejection sampling
reaches position i with probability prod_{j<i} sum min(p_j, q_j); a verifier that declares one-hot drafts,
prod_{j<i} sum q_j p_j). Tokens of target
probability zero are an exact failure. Where most tokens are expected far below once (large
vocabularies), every token is also its own cell (spectest.statistics.sparse), the rows at each
position one stratum.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from spectest import rules
from spectest.protocol import PAD
from spectest.statistics.checks import token_id_orders

if TYPE_CHECKING:
    from spectest.suite.run import PropertyRun

# reps -> emitted [reps * B, K + 1] for reps fresh copies of the batch (copy r of row b at r * B + b)
RepeatedCall = Callable[[int], torch.Tensor]


def ratio_order(p: np.ndarray, q: np.ndarray | None) -> np.ndarray:
    """Pool tokens by draft/target ratio (then p): most bugs move mass along that ratio."""
    if q is None:
        return np.argsort(p, kind="stable")
    ratio = np.divide(q, p, out=np.full_like(p, np.inf), where=p > 0)
    return np.lexsort((p, ratio))


def reach_probabilities(target: np.ndarray, draft: np.ndarray, *, one_hot: bool = False) -> np.ndarray:
    """P(position i is emitted) under standard rejection sampling, prod_{j<i} sum min(p_j, q_j); ``one_hot``: for a
    verifier that takes each draft drawn from q as one-hot at its token, accepting it with probability p(x),
    prod_{j<i} sum q_j p_j (lower: planned from min(p, q), such a verifier's later positions fall short)."""
    acceptance = (target[:, :-1] * draft if one_hot else np.minimum(target[:, :-1], draft)).sum(-1)
    ones = np.ones((target.shape[0], 1))
    return np.concatenate([ones, np.cumprod(acceptance, axis=1)], axis=1)


def check_every_position(
    spec: PropertyRun,
    target: np.ndarray,
    draft: np.ndarray,
    call: RepeatedCall,
    *,
    seed: int,
    case: str,
    row_labels: Sequence[str] | None = None,
    max_case_elements: int,
    max_call_elements: int,
    lengths: np.ndarray | None = None,
) -> None:
    """Test every (row, position) of ``call``'s output against ``target`` [B, K+1, V] (float64);
    ``draft`` [B, K, V] is the distribution the call's drafts come from (it sets the reach of
    each position, hence the plan); ``case`` describes the inputs for messages; ``lengths`` [B]:
    drafts per row of a ragged batch (row r's token at position n_r is its bonus, later ones never come)."""
    __tracebackhide__ = True
    started = time.perf_counter()
    b, k1, v = target.shape
    k = k1 - 1
    per_rep = b * (2 * k + 1) * v
    row_labels = row_labels or [""] * b
    reach = reach_probabilities(target, draft, one_hot=spec.model.one_hot_drafts)
    if lengths is not None:
        reach = reach * (np.arange(k1)[None, :] <= lengths[:, None])
    check = spec.distribution(
        rules.PER_POSITION,
        target.reshape(b * k1, v),
        case_seed=seed,
        reach=reach.ravel(),
        min_draws=20,
        max_draws=max(20, max_case_elements // per_rep),
        views={
            "by draft/target ratio": [
                ratio_order(target[r, i], draft[r, i] if i < k else None) for r in range(b) for i in range(k1)
            ],
            "by token id": token_id_orders(b * k1, v),
        },
        labels=[f"row {r}{row_labels[r]} pos {i}: " for r in range(b) for i in range(k1)],
        # Rows at one position are independent given how many draws reached it; positions of a row are not.
        strata=np.tile(np.arange(k1), b),
    )
    slots = torch.arange(k1, device=spec.device)
    emitted_tokens = 0
    while not check.done:
        reps = check.next_batch(max(1, max_call_elements // per_rep))
        emitted = call(reps)
        present = emitted != PAD
        emitted_tokens += int(present.sum())
        rows = torch.arange(b, device=spec.device).repeat(reps).unsqueeze(1)
        cell = (rows * k1 + slots) * v + emitted.clamp_min(0)
        # On a CPU the tokens' cells are counted where they fall (a call at V = 256000 emits a few dozen tokens into
        # a million cells); on a GPU they are counted there, and the counts stay there (the check bins them there).
        check.add_cells(cell[present], reps)
        spec.require_possible(check, lambda g, c: f"row {g // k1} position {g % k1} token {c}", case)
    context = f"{check.draws} draws of each of {b} rows, every row and position different, {case}"
    result = check.result()
    if result.measured is not None:  # lossy mode: what the loss buys, case by case, for the report
        spec.record(
            {
                "tokens_per_call": emitted_tokens / max(1, b * check.draws),
                "optimal_tokens_per_call": float(reach.sum(axis=1).mean()),
                "k": k,
                "measured_tv": result.measured.as_record(),
            }
        )
    spec.check_fit(result, context=context, started=started)
