"""The processed target along an engine's own output: impossible tokens, greedy decoding, the PIT.

The harness never trusts the engine's processing (that is where the loop bugs live): for every
generated token x_t it takes the target's raw logits at that prefix (teacher forcing, from the
engine's ``target_logits``), and computes p_t itself with the request's parameters
(:func:`spectest.sampling_params.process_logits`, in float64).

Numerical ambiguity. The engine computes in its own precision, so a token at the edge of a
filter (the k-th of top-k, the last one top-p keeps, the min-p threshold) may be in or out. A
token's inclusion is *ambiguous* when a relative perturbation of 1e-4 of the logits flips it; the
filters all keep a prefix of the descending order, and raising a token's logit while lowering the
others can only help it in, so the extremes are two: the token favoured (its logit up by 1e-4 of
itself, every other down by 1e-4 of itself) and disfavoured. A position is *fragile* when the
first token its filters drop, favoured, or the last they keep, disfavoured, flips.

The probability integral transform. If the loop is exact, U_t = P_t(X < x_t) + V_t p_t(x_t),
with V_t uniform from the harness's own generator, is Uniform(0, 1) given everything before t
(the Rosenblatt transform), in any fixed order of the vocabulary: by token id, and by decreasing
p_t. So the U_t of a whole generation are i.i.d. uniform whatever the prompts and models, and any
grouping by what was known before x_t was drawn keeps them so (Doob's optional skipping): the
position in the generation, or the offset inside a speculative pass of a token-wise verifier.
Grouping by what happened to x_t itself (accepted, corrected, bonus) would not: a correction is
by construction drawn from the part of p_t the draft did not cover.
"""

from __future__ import annotations

import numpy as np
import torch

from spectest.sampling_params import SamplingParams, filter_active, process_logits

AMBIGUITY = 1e-4  # relative perturbation of the logits that counts as numerical noise


def _process(logits: torch.Tensor, params: SamplingParams, order: tuple[str, ...]) -> torch.Tensor:
    """[M, V] processed distributions of logit rows [M, V] with one parameter row each."""
    return process_logits(logits.unsqueeze(1), params, order=order).squeeze(1)


def processed_draft(
    logits: torch.Tensor, params: SamplingParams, order: tuple[str, ...], warps: int = 1
) -> torch.Tensor:
    """[M, V] the draft distribution q the engine samples its drafts from: the request's processing
    applied ``warps`` times (the log of one pass's output is the next pass's logits)."""
    probs = _process(logits, params, order)
    for _ in range(warps - 1):
        probs = _process(probs.log(), params, order)
    return probs


def mask_tokens(logits: torch.Tensor, masked: tuple[int, ...]) -> torch.Tensor:
    """Ids the engine declares it masks get logit -inf, as the engine samples them."""
    if not masked:
        return logits
    out = logits.clone()
    out[:, list(masked)] = float("-inf")
    return out


def _tilted(logits: torch.Tensor, token: torch.Tensor, up: bool, eps: float) -> torch.Tensor:
    """Every logit moved by ``eps`` of itself against ``token`` (or for it, with ``up``)."""
    step = eps * logits.abs().nan_to_num(posinf=0.0, neginf=0.0)
    sign = 1.0 if up else -1.0
    out = logits - sign * step
    rows = torch.arange(logits.shape[0])
    out[rows, token] = logits[rows, token] + sign * step[rows, token]
    return out


def included_when_favoured(
    logits: torch.Tensor, tokens: torch.Tensor, params: SamplingParams, order: tuple[str, ...], eps: float = AMBIGUITY
) -> torch.Tensor:
    """[M] bool: is each token kept by its row's filters when the perturbation favours it?"""
    probs = _process(_tilted(logits, tokens, True, eps), params, order)
    return probs[torch.arange(logits.shape[0]), tokens] > 0


def fragile(
    logits: torch.Tensor, probs: torch.Tensor, params: SamplingParams, order: tuple[str, ...], eps: float = AMBIGUITY
) -> torch.Tensor:
    """[M] bool: rows whose filtered support flips under the perturbation (see the module docstring)."""
    kept = probs > 0
    filtered = (~kept & torch.isfinite(logits)).any(dim=-1) & ~params.greedy
    out = torch.zeros(logits.shape[0], dtype=torch.bool)
    if not bool(filtered.any()):
        return out
    rows = filtered.nonzero().flatten()
    z, p, sub = logits[rows], probs[rows], params.take(rows)
    outside = torch.where(p > 0, float("-inf"), z.masked_fill(~torch.isfinite(z), float("-inf")))
    first_out = outside.argmax(dim=-1)
    inside = torch.where(p > 0, z, float("inf"))
    last_in = inside.argmin(dim=-1)
    up = _process(_tilted(z, first_out, True, eps), sub, order) > 0
    down = _process(_tilted(z, last_in, False, eps), sub, order) > 0
    out[rows] = (up != (p > 0)).any(dim=-1) | (down != (p > 0)).any(dim=-1)
    return out


def greedy_decisions(
    logits: torch.Tensor, tokens: torch.Tensor, tie_break: str, eps: float = AMBIGUITY
) -> tuple[torch.Tensor, torch.Tensor]:
    """([M] the token is greedy decoding's, [M] a near-tie at the top: skipped). Exact ties follow
    ``tie_break`` ("lowest-id": the first argmax; "any": any tied top token); a runner-up within
    ``eps`` of the top logit (relative) is a near-tie either engine rounding could settle."""
    top = logits.max(dim=-1).values
    tied = logits == top.unsqueeze(1)
    ties = tied.sum(dim=-1) > 1
    below = torch.where(tied, float("-inf"), logits).max(dim=-1).values
    near = ~ties & (top - below <= eps * top.abs().clamp_min(1.0))
    chosen = logits.argmax(dim=-1)
    rows = torch.arange(logits.shape[0])
    ok = tokens == chosen if tie_break == "lowest-id" else tied[rows, tokens]
    return ok | near, near


def pit(
    probs: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor, by: str, draft: torch.Tensor | None = None
) -> torch.Tensor:
    """Randomised PIT [M] of each token under its row of ``probs``: the mass strictly before it in
    an order fixed before the token was drawn, plus a uniform share of its own. Orders (``by``):
    ``"id"``; ``"probability"``, decreasing; ``"ratio"``, increasing draft/target ratio q/p of the
    ``draft`` rows (where acceptance bugs move mass: toward what the draft favours, or away); ties
    by id."""
    rows = torch.arange(probs.shape[0])
    own = probs[rows, tokens]
    if by == "id":
        before = probs.cumsum(dim=-1)[rows, tokens] - own
    else:
        if by == "probability":
            key = -probs
        elif by == "ratio" and draft is not None:
            key = torch.where(probs > 0, draft / probs.clamp_min(1e-300), torch.inf)
        else:
            raise ValueError(f"unknown PIT order {by!r} (the ratio order needs the draft rows)")
        mine = key[rows, tokens].unsqueeze(1)
        ids = torch.arange(probs.shape[1])
        ahead = (key < mine) | ((key == mine) & (ids < tokens.unsqueeze(1)))
        before = (probs * ahead).sum(dim=-1)
    return (before + uniforms * own).clamp(0.0, 1.0 - 1e-12)


def position_group(position: int) -> int:
    """Positions 0, 1, 2-3, 4-7, 8-15, ...: a group per doubling (known before the token is drawn)."""
    return 0 if position == 0 else int(np.log2(position)) + 1


def position_label(group: int) -> str:
    if group <= 1:
        return f"position {group}"
    return f"positions {2 ** (group - 1)}-{2**group - 1}"


def offsets(tokens_per_pass: list[int]) -> list[int]:
    """Each emitted token's offset inside its pass, from the tokens every pass emitted."""
    return [offset for count in tokens_per_pass for offset in range(count)]


__all__ = [
    "AMBIGUITY",
    "fragile",
    "greedy_decisions",
    "included_when_favoured",
    "mask_tokens",
    "offsets",
    "pit",
    "position_group",
    "position_label",
]


def explain_exclusion(logits: torch.Tensor, token: int, params: SamplingParams, order: tuple[str, ...]) -> str:
    """Why the processed target gives ``token`` probability 0 at one position (logits [V], ``params`` one
    row), and what the engine would have had to do to emit it: ignore one of the request's filters (each
    that, turned off alone, keeps it: a server that lost the parameter between its HTTP layer and its
    sampler), or all of them, or apply temperature and the filters in another order than the declared one
    (the first such order); a masked id (logit -inf) is said to be one."""
    from itertools import permutations

    from spectest.protocol import FILTERS, TEMPERATURE

    row = logits.view(1, -1)
    vocab = row.shape[-1]
    if not bool(torch.isfinite(row[0, token])):
        return "its logit is -inf (a masked id): no parameter explains it"
    active = [name for name in FILTERS if bool(filter_active(name, getattr(params, name), vocab)[0])]

    def possible(names: list[str], in_order: tuple[str, ...]) -> bool:
        without = params.map(torch.clone)
        for name in names:
            getattr(without, name).fill_({"top_k": 0, "top_p": 1.0, "min_p": 0.0}[name])
        return float(_process(row, without, in_order)[0, token]) > 0

    ways = [f"ignored {name}={_value(params, name)}" for name in active if possible([name], order)]
    if not ways and len(active) > 1 and possible(active, order):
        ways.append("ignored all of " + ", ".join(f"{name}={_value(params, name)}" for name in active))
    declared = order if TEMPERATURE in order else (TEMPERATURE, *order)
    moved = next((o for o in permutations((*FILTERS, TEMPERATURE)) if o != declared and possible([], o)), None)
    if moved:
        ways.append(f"applied them in the order {', '.join(moved)} (declared: {', '.join(declared)})")
    rank = int((row[0] > row[0, token]).sum()) + 1
    said = f"it is the target's {_ordinal(rank)} most likely of {vocab}"
    if ways:
        return f"{said}; it is possible if the engine " + ", or ".join(ways)
    return f"{said}; its probability is 0 even unfiltered (logit {float(row[0, token]):.6g}, the top one {float(row.max()):.6g})"


def _value(params: SamplingParams, name: str) -> str:
    value = getattr(params, name)[0]
    return f"{int(value)}" if name == "top_k" else f"{float(value):.4g}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
