"""An engine's output against its own target, call after call: the exact rules and the PIT checks.

Each call generates one batch of requests (:mod:`spectest.e2e.cases`), scores the prompts plus
what the engine emitted with the engine's own target model (teacher forcing), and computes every
token's processed target p_t itself (:mod:`spectest.e2e.targets`):

* exact: no token of p_t = 0 (a filtered or masked token) unless its inclusion is numerically
  ambiguous (counted, reported, neither required nor forbidden); greedy requests equal greedy
  decoding token for token (near-ties at the top skipped and counted);
* statistical: the randomised PIT of every sampled token, by token id and by decreasing
  probability, in equiprobable bins, grouped by position in the generation, and (for an engine
  that reports its passes and verifies token-wise) by offset inside the pass. Each is a
  distribution check of the statistics: planned from ``--spec-tolerance`` at power 0.99,
  an anytime-valid early stop, its share of the run's alpha. Fragile positions (a filter's edge
  within the ambiguity) are left out of the PIT, decided from p_t alone, before the token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from spectest import rules
from spectest.e2e.cases import EngineCase, Requests
from spectest.e2e.protocol import DRAFT_LOGITS, TOKEN_WISE
from spectest.e2e.targets import (
    explain_exclusion,
    fragile,
    greedy_decisions,
    included_when_favoured,
    mask_tokens,
    offsets,
    pit,
    position_group,
    position_label,
    processed_draft,
)
from spectest.sampling import make_generator
from spectest.sampling_params import SamplingParams, process_logits

if TYPE_CHECKING:
    from spectest.e2e.run import EngineRun
    from spectest.statistics.checks import DistributionCheck

PIT_BINS = 10  # equiprobable bins of the PIT; the checks detect a TV this far from uniform per group
MAX_CALLS = 100_000  # a cap the plan never reaches; the time budget decides for slow engines
MIN_CALLS = 3
FIRST_LOOK = 4  # calls before the e-processes first look (then 8, 16, ...): a gross loop bug stops in seconds
MAX_OFFSET_GROUPS = 9  # offsets 0..7 and "8 or more"
AT_POSITION = {
    "id": rules.PIT_BY_ID_AT_POSITION,
    "probability": rules.PIT_BY_PROBABILITY_AT_POSITION,
    "ratio": rules.PIT_BY_RATIO_AT_POSITION,
}
AT_OFFSET = {
    "id": rules.PIT_BY_ID_AT_OFFSET,
    "probability": rules.PIT_BY_PROBABILITY_AT_OFFSET,
    "ratio": rules.PIT_BY_RATIO_AT_OFFSET,
}


@dataclass
class Tally:
    """What one case saw, for messages and the report."""

    calls: int = 0
    requests: int = 0
    tokens: int = 0
    sampled: int = 0
    ambiguous_tokens: int = 0  # emitted with p = 0, kept only by the 1e-4 perturbation
    fragile_positions: int = 0  # left out of the PIT
    greedy_tokens: int = 0
    near_ties: int = 0
    tokens_per_pass: list[int] = field(default_factory=list)
    acceptance_sum: dict[int, float] = field(default_factory=dict)  # by position: sum of sum_x min(p_t, q_t)
    acceptance_count: dict[int, int] = field(default_factory=dict)

    def acceptance(self) -> dict[int, float]:
        return {t: self.acceptance_sum[t] / self.acceptance_count[t] for t in sorted(self.acceptance_sum)}


@dataclass
class Scored:
    """One call's tokens with everything the checks need, flattened over (request, position)."""

    request: np.ndarray  # [M] request index
    position: np.ndarray  # [M] position in the generation
    tokens: torch.Tensor  # [M]
    logits: torch.Tensor  # [M, V] raw target logits at the prefix (masked ids at -inf)
    probs: torch.Tensor  # [M, V] processed target
    params: SamplingParams  # [M] each token's request's parameters
    sequences: list[list[int]]  # prompt + output of every request, as the engine scored them
    prefix: torch.Tensor  # [M, 2] (sequence, position) of the logits row that predicts each token

    def acceptance(self, q: torch.Tensor) -> torch.Tensor:
        """[M] sum_x min(p_t, q_t): the chance a draft from ``q`` [M, V] is accepted at each token's prefix."""
        return torch.minimum(self.probs, q).sum(dim=-1)

    def token_match(self, q: torch.Tensor) -> torch.Tensor:
        """[M] sum_x p_t(x) q_t(x): the chance a draft from ``q`` equals the target's own sample (token match)."""
        return (self.probs * q).sum(dim=-1).clamp(0, 1)


def score(spec: EngineRun, reqs: Requests, outputs: list[list[int]]) -> Scored:
    """Teacher-forced target logits along prompt + output, and the processed target at each new token."""
    sequences = [prompt + out for prompt, out in zip(reqs.prompts, outputs, strict=True)]
    logits = spec.target_logits(sequences)
    request, position, rows = [], [], []
    for r, (prompt, out) in enumerate(zip(reqs.prompts, outputs, strict=True)):
        for t in range(len(out)):
            request.append(r)
            position.append(t)
            rows.append((r, len(prompt) + t - 1))
    prefix = torch.tensor(rows, dtype=torch.int64)
    chosen = mask_tokens(logits[prefix[:, 0], prefix[:, 1]], spec.engine.masked_tokens)
    params = reqs.params.take(torch.tensor(request, dtype=torch.int64))
    probs = process_logits(chosen.unsqueeze(1), params, order=spec.order).squeeze(1)
    tokens = torch.tensor([outputs[r][t] for r, t in zip(request, position, strict=True)], dtype=torch.int64)
    return Scored(np.array(request), np.array(position), tokens, chosen, probs, params, sequences, prefix)


def draft_rows(spec: EngineRun, scored: Scored) -> torch.Tensor:
    """[M, V] the engine's processed draft q at every emitted token's prefix (its draft's raw logits
    by teacher forcing, processed with each request's parameters as the engine does: ``draft_warps``; a
    point mass on its argmax for a greedy draft: ``draft_sampling``)."""
    draft = spec.draft_logits(scored.sequences)
    rows = scored.prefix
    logits = draft[rows[:, 0], rows[:, 1]]
    if spec.engine.draft_sampling == "greedy":  # a point mass on the draft's argmax (the lowest id on ties)
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(scored.probs.dtype)
    return processed_draft(logits, scored.params, spec.order, spec.engine.draft_warps)


def measure_acceptance(scored: Scored, q: torch.Tensor, tally: Tally) -> None:
    """The acceptance sum_x min(p_t, q_t) at every position the engine visited, by position."""
    for t, a in zip(scored.position, scored.acceptance(q).numpy(), strict=True):
        tally.acceptance_sum[int(t)] = tally.acceptance_sum.get(int(t), 0.0) + float(a)
        tally.acceptance_count[int(t)] = tally.acceptance_count.get(int(t), 0) + 1


def require_exact(spec: EngineRun, reqs: Requests, scored: Scored, tally: Tally, case: EngineCase) -> np.ndarray:
    """The exact rules of one call; returns which tokens are sampled and not fragile (the PIT's)."""
    __tracebackhide__ = True
    params = scored.params
    rows = torch.arange(scored.tokens.shape[0])
    own = scored.probs[rows, scored.tokens]
    greedy = params.greedy.numpy()
    impossible = (own <= 0).numpy() & ~greedy
    if impossible.any():
        favoured = included_when_favoured(scored.logits, scored.tokens, params, spec.order).numpy()
        for m in np.flatnonzero(impossible & ~favoured)[:1]:
            spec.require(
                False,
                rules.NEVER_IMPOSSIBLE,
                f"{reqs.describe(int(scored.request[m]))}: position {int(scored.position[m])} emitted token "
                f"{int(scored.tokens[m])}, which the processed target gives probability 0 (even with the logits "
                f"moved 1e-4 in its favour): "
                f"{explain_exclusion(scored.logits[m], int(scored.tokens[m]), params.take(torch.tensor([m])), spec.order)}"
                f"; {case.describe()}",
            )
        tally.ambiguous_tokens += int((impossible & favoured).sum())
    if greedy.any():
        chosen = torch.as_tensor(np.flatnonzero(greedy))
        ok, near = greedy_decisions(scored.logits[chosen], scored.tokens[chosen], spec.engine.tie_break)
        tally.greedy_tokens += len(chosen)
        tally.near_ties += int(near.sum())
        if not bool(ok.all()):
            m = int(chosen[int((~ok).nonzero()[0])])
            top = scored.logits[m].topk(2)
            spec.require(
                False,
                rules.GREEDY_IS_ARGMAX,
                f"{reqs.describe(int(scored.request[m]))}: position {int(scored.position[m])} emitted token "
                f"{int(scored.tokens[m])} (logit {float(scored.logits[m, scored.tokens[m]]):.6g}), greedy decoding of the "
                f"target gives {int(top.indices[0])} (logit {float(top.values[0]):.6g}; runner-up "
                f"{int(top.indices[1])} at {float(top.values[1]):.6g}); {case.describe()}",
            )
    judged = ~greedy
    if judged.any():
        shaky = fragile(scored.logits, scored.probs, params, spec.order).numpy()
        tally.fragile_positions += int((shaky & judged).sum())
        judged &= ~shaky
    return judged


class PitChecks:
    """The PIT checks of one grouping (position, or offset in the pass), both orders."""

    def __init__(
        self, spec: EngineRun, names: tuple[str, str], labels: list[str], reach: np.ndarray, seed: int
    ) -> None:
        self.labels = labels
        groups = len(labels)
        probs = np.full((groups, PIT_BINS), 1.0 / PIT_BINS)

        def cell(c: int) -> str:
            return f"PIT in [{c / PIT_BINS:.1f}, {(c + 1) / PIT_BINS:.1f})"

        allowance = spec.shared_allowance(len(names))
        self.checks: list[DistributionCheck] = [
            spec.distribution(
                name,
                probs,
                case_seed=seed,
                reach=reach,
                min_draws=MIN_CALLS,
                max_draws=MAX_CALLS,
                views={"in PIT order": [np.arange(PIT_BINS)] * groups},
                labels=[f"{label}: " for label in labels],
                cell_name=cell,
                first_look=FIRST_LOOK,
                time_budget=allowance,
            )
            for name in names
        ]

    @property
    def done(self) -> bool:
        return all(check.done for check in self.checks)

    @property
    def rejected(self) -> bool:
        """A check's e-process already rejected: the case has failed, more calls change nothing."""
        return any(check.rejected_early for check in self.checks)

    def add(self, groups: np.ndarray, values: list[np.ndarray]) -> None:
        """One call's PIT values (one array per order) in their groups."""
        for check, u in zip(self.checks, values, strict=True):
            if check.done:
                continue
            counts = np.zeros((len(self.labels), PIT_BINS), dtype=np.int64)
            np.add.at(counts, (groups, np.minimum((u * PIT_BINS).astype(np.int64), PIT_BINS - 1)), 1)
            check.add(counts, 1)


def expected_sampled(case: EngineCase) -> float:
    """Share of a case's requests that sample (greedy ones give no PIT)."""
    return {"greedy": 0.0, "mixed": 0.8}.get(case.mix, 1.0)


def check_engine_output(spec: EngineRun, case: EngineCase) -> None:
    """Call after call of ``case`` until every check has its planned draws (or its time); then the verdicts."""
    __tracebackhide__ = True
    started = time.perf_counter()
    n = case.max_new_tokens
    groups = position_group(n - 1) + 1
    sizes = np.bincount([position_group(t) for t in range(n)], minlength=groups)
    share = expected_sampled(case)
    ratio = DRAFT_LOGITS in spec.engine.capabilities  # the draft/target ratio order needs the draft's logits
    orders = ("id", "probability", "ratio") if ratio else ("id", "probability")
    by_position = (
        PitChecks(
            spec,
            tuple(AT_POSITION[o] for o in orders),
            [position_label(g) for g in range(groups)],
            case.requests * share * sizes,
            case.seed,
        )
        if share > 0
        else None
    )
    by_offset: PitChecks | None = None
    uniforms = make_generator(case.seed ^ 0x2545F491, "cpu")
    tally = Tally()
    token_wise = TOKEN_WISE in spec.engine.capabilities
    while True:
        groupings = [c for c in (by_position, by_offset) if c is not None]
        if any(c.rejected for c in groupings) or (tally.calls >= MIN_CALLS and all(c.done for c in groupings)):
            break
        if tally.calls >= MAX_CALLS:
            break
        reqs = spec.requests(case, tally.calls)
        outputs = spec.generate(reqs.prompts, reqs.params, n, reqs.seed)
        record = spec.pass_record(len(reqs.prompts))
        scored = score(spec, reqs, outputs)
        tally.calls += 1
        tally.requests += len(reqs.prompts)
        tally.tokens += len(scored.tokens)
        judged = require_exact(spec, reqs, scored, tally, case)
        q = draft_rows(spec, scored) if ratio else None
        if q is not None:
            measure_acceptance(scored, q, tally)
        tally.sampled += int(judged.sum())
        if record.tokens_per_pass is not None:
            tally.tokens_per_pass += [c for row in record.tokens_per_pass for c in row]
        if by_position is None or not judged.any():
            continue
        pick = torch.as_tensor(np.flatnonzero(judged))
        probs, tokens = scored.probs[pick], scored.tokens[pick]
        v = torch.rand(len(pick), generator=uniforms, dtype=torch.float64)
        draft = q[pick] if q is not None else None
        values = [pit(probs, tokens, v, order, draft).numpy() for order in orders]
        by_position.add(np.array([position_group(int(t)) for t in scored.position[judged]]), values)
        if token_wise and record.tokens_per_pass is not None:
            offset = np.concatenate([offsets(row)[:n] for row in record.tokens_per_pass])
            if len(offset) != len(scored.tokens):
                spec.require(
                    False,
                    rules.E2E_PASSES,
                    f"tokens_per_pass accounts for {len(offset)} tokens, generate emitted {len(scored.tokens)}",
                )
            if by_offset is None:  # groups fixed by the engine's K in the first call (never by its PITs)
                drafts = record.draft_lengths or record.tokens_per_pass
                width = min(MAX_OFFSET_GROUPS, max(max(row, default=0) for row in drafts) + 1)
                seen = np.bincount(np.minimum(offset, width - 1), minlength=width)
                labels = [f"offset {j}" for j in range(width)]
                labels[-1] += "+"  # later offsets, should a pass ever propose more
                by_offset = PitChecks(
                    spec,
                    tuple(AT_OFFSET[o] for o in orders),
                    labels,
                    np.maximum(seen[:width] * share, 1e-3),
                    case.seed + 1,
                )
            width = len(by_offset.labels)
            by_offset.add(np.minimum(offset[judged], width - 1), values)
    context = (
        f"{case.describe()}; {tally.calls} calls, {tally.requests} requests, {tally.tokens} tokens ({tally.sampled} "
        f"sampled ones in the PIT; {tally.fragile_positions} at a filter's numerical edge left out, "
        f"{tally.ambiguous_tokens} emitted tokens of probability 0 within the 1e-4 ambiguity, {tally.greedy_tokens} "
        f"greedy tokens with {tally.near_ties} near-ties skipped)"
    )
    figure = {
        "e2e": case.describe(),
        "calls": tally.calls,
        "requests": tally.requests,
        "tokens": tally.tokens,
        "ambiguous_tokens": tally.ambiguous_tokens,
        "fragile_positions": tally.fragile_positions,
        "near_ties": tally.near_ties,
        "pit_bins": PIT_BINS,
        "pit": {},
    }
    if tally.tokens_per_pass:
        figure["tokens_per_pass_counts"] = np.bincount(tally.tokens_per_pass).tolist()
    if tally.acceptance_sum:
        figure["acceptance_by_position"] = {str(t): a for t, a in tally.acceptance().items()}
    for grouping in (by_position, by_offset):
        if grouping is None:
            continue
        for check in grouping.checks:
            figure["pit"][check.name] = {"groups": grouping.labels, "counts": check.counts.tolist()}
    spec.record(figure)
    for grouping in (by_position, by_offset):
        if grouping is None:
            continue
        for check in grouping.checks:
            spec.conclude(check, context=context, started=started)
