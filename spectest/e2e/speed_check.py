"""The end-to-end speed property's rounds (see :mod:`spectest.e2e.speed` for the model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from spectest import rules
from spectest.e2e.cases import EngineCase
from spectest.e2e.output import draft_rows, score
from spectest.e2e.pass_counts import realized_acceptance
from spectest.e2e.passes import drafting_passes
from spectest.e2e.protocol import TOKEN_WISE
from spectest.e2e.speed import PARTS, EngineRound, EngineSpeed, median_time, time_parts, timed
from spectest.simulators.text import expected_passes
from spectest.speed.bench import AGREEMENT_MISSES, SPEED_MARGIN
from spectest.speed.clock import NOISE_LIMIT, OWN_CLOCK, single_threaded, timing_noise
from spectest.statistics.chisquare import SignTest

if TYPE_CHECKING:
    from spectest.e2e.protocol import PassRecord
    from spectest.e2e.run import EngineRun

SHORT_RATE = 0.95  # the alternative the speed property's power is stated against: rounds short 19 times in 20


def expected_tokens_per_pass(spec: EngineRun, reqs, outputs, k: int, by_position: dict[int, list[float]]) -> float:
    """Tokens per pass the chain predicts along the engine's own output: per token the probability r_t
    that it came from an accepted draft, given the token y_t it emitted, and the expected passes of each
    request over them (the renewal chain of :mod:`spectest.simulators.text`: no i.i.d. assumption, the
    last passes cut by the end). Under standard rejection r_t = min(p_t, q_t)(y_t) / p_t(y_t); an engine
    that samples the target and keeps a draft while it equals the sample (not ``standard-rejection``) emits
    the target's sample y_t either way and kept the draft when the draft drew it too: r_t = q_t(y_t). So an
    engine is held to its own acceptance rule (the tokens-per-pass property measures its efficiency)."""
    scored = score(spec, reqs, outputs)
    q = draft_rows(spec, scored)
    token_wise = TOKEN_WISE in spec.engine.capabilities
    acceptance = (scored.acceptance(q) if token_wise else scored.token_match(q)).numpy()
    for t in np.unique(scored.position):
        by_position.setdefault(int(t), []).extend(acceptance[scored.position == t].tolist())
    realized = realized_acceptance(scored, q, token_wise)
    # An engine whose prompt pass samples the first token (``prefill``) counts the passes after it; a
    # 1-token request's fixed cost holds the prompt's pass.
    skip = 1 if spec.engine.first_token == "prefill" else 0
    rows = [realized[scored.request == r][skip:] for r in range(len(outputs))]
    passes = sum(expected_passes(row, k) for row in rows if row.size)
    return len(scored.tokens) / max(passes, 1e-12)


def check_engine_speed(spec: EngineRun, case: EngineCase) -> None:
    """Rounds until the sign test decides; then the verdict, with the figures either way."""
    __tracebackhide__ = True
    engine = spec.engine.engine
    make_components = getattr(engine, "spectest_components", None)
    if not callable(make_components):
        why = getattr(engine, "spectest_components_unavailable", None)
        pytest.skip(
            f"{spec.engine.name} exposes no spectest_components (one pass's parts to time){f': {why}' if why else ''}"
        )
    first = spec.requests(case, 0)
    prompt, one = first.prompts[:1], first.params.take(torch.tensor([0]))
    components = make_components(prompt[0], one)
    missing = [name for name in PARTS if name not in components]
    if missing:
        pytest.skip(f"{spec.engine.name}'s spectest_components lacks {missing}")
    clock = engine_clock(engine)
    with single_threaded():
        noise = timing_noise(components["target"], clock=clock)
    if noise > NOISE_LIMIT:
        pytest.skip(
            f"machine too noisy to time: identical target passes spread {noise:.0%} of their median ({clock.name})"
        )
    test = SignTest.plan(spec.alpha, misses=AGREEMENT_MISSES)
    speed: EngineSpeed | None = None
    acceptance_at: dict[int, list[float]] = {}  # sum_x min(p_t, q_t) by position, over the rounds
    while not test.decided:
        label = len(speed.rounds) if speed else 0
        reqs = spec.requests(case, label + 1)
        n = case.max_new_tokens

        def spec_run(reqs=reqs, n=n):
            return spec.generate(reqs.prompts, reqs.params, n, reqs.seed)

        def plain_run(reqs=reqs, n=n):
            return spec.plain_generate(reqs.prompts, reqs.params, n, reqs.seed)

        with single_threaded():
            if label % 2 == 0:
                t_spec, outputs, record = _timed_spec(spec, spec_run, len(reqs.prompts), clock)
                t_plain = timed(plain_run, clock)
            else:
                t_plain = timed(plain_run, clock)
                t_spec, outputs, record = _timed_spec(spec, spec_run, len(reqs.prompts), clock)
            costs = {**time_parts(components, clock=clock), **one_token_requests(spec, prompt, one, clock)}
        totals = pass_totals(record, spec.engine.first_token)
        if totals is None:
            pytest.skip(
                f"{spec.engine.name} reports neither tokens_per_pass and draft_lengths nor pass_counts with a "
                f"fixed K (pass_counts: {record.counts})"
            )
        k, passes = totals
        if speed is None:
            speed = EngineSpeed(k=k)
        result = EngineRound(
            spec_seconds=t_spec,
            plain_seconds=t_plain,
            tokens=sum(len(o) for o in outputs),
            passes=passes,
            expected_tokens_per_pass=expected_tokens_per_pass(spec, reqs, outputs, k, acceptance_at),
            costs=costs,
            requests=len(reqs.prompts),
        )
        speed.rounds.append(result)
        test.add(result.measured * SPEED_MARGIN < result.predicted)
    assert speed is not None
    low, high = speed.interval("measured")
    plow, phigh = speed.interval("predicted")
    best = speed.optimal_k(speed.mean_acceptance())
    figure = speed.as_record() | {
        "measured_interval": [low, high],
        "predicted_interval": [plow, phigh],
        "optimal_k": best[0],
        "optimal_speedup": best[1],
        "acceptance_by_position": {str(t): float(np.mean(v)) for t, v in sorted(acceptance_at.items())},
        "clock": clock.name,
        # the plan, and its power against an engine whose rounds fall short 19 times in 20 (a wasteful loop)
        "sign_test": {"rounds": test.rounds, "needed": test.needed, "power": test.power(SHORT_RATE)},
    }
    spec.record({"e2e_speed": figure, "e2e": case.describe()})
    summary = (
        f"{case.describe()}, K={speed.k}, {len(speed.rounds)} rounds on {clock.name}: speedup "
        f"{speed.median('measured'):.3f}x measured [{low:.3f}, {high:.3f}], {speed.median('predicted'):.3f}x predicted "
        f"[{plow:.3f}, {phigh:.3f}]; tokens per pass {np.median(figure['tokens_per_pass_measured']):.3f} measured, "
        f"{speed.median('expected_tokens_per_pass'):.3f} predicted from the measured acceptance; a pass costs {1e3 * speed.median_pass():.2f} ms by its parts "
        f"(draft {1e3 * speed.median_cost('draft'):.2f}, target {1e3 * speed.median_cost('target'):.2f}, verify "
        f"{1e3 * speed.median_cost('verify'):.2f}, loop {1e3 * speed.median_cost('loop', 0.0):.2f}) and {1e3 * speed.median('unexplained_per_pass'):.2f} ms more that "
        f"no part explains; a plain token {1e3 * speed.median_cost('plain_step'):.2f} ms; break-even acceptance "
        f"{_fmt(speed.break_even())}, optimal K {best[0]} ({best[1]:.3f}x)"
    )
    spec.require(
        not test.rejected,
        rules.E2E_SPEEDUP_AGREES,
        f"the measured speedup fell more than {SPEED_MARGIN}x short of the model's in {test.hits} of {test.seen} "
        f"rounds (sign test p = {test.p_value:.2g} <= {spec.alpha:.2g}): {summary}",
    )


def pass_totals(record: PassRecord, first_token: str = "drafted") -> tuple[int, int] | None:
    """K and the call's target passes after the prompts', from what the engine reported: per pass (an
    instrumented loop: the longest draft is K; a ``prefill`` engine's prompt pass left out, as its counters
    leave it out), or as counters with a fixed K (passes with drafts and the drafts they verified, as vLLM
    counts them); None when it reported neither."""
    if record.tokens_per_pass is not None and record.draft_lengths is not None:
        k = max(max(row, default=0) for row in record.draft_lengths)
        return k, sum(len(drafting_passes(row, first_token)) for row in record.tokens_per_pass)
    counts = record.counts
    if counts and counts["passes"] and counts["draft_tokens"] % counts["passes"] == 0:
        return counts["draft_tokens"] // counts["passes"], counts["passes"]
    return None


def _fmt(value: float | None) -> str:
    return "none (never pays)" if value is None else f"{value:.3f}"


def engine_clock(engine: object) -> Callable[[], float]:
    """The clock an engine's speed is measured on: its own (``spectest_clock``: an engine in a process of
    its own brings its process's CPU time) or this thread's own time (:data:`OWN_CLOCK`)."""
    clock = getattr(engine, "spectest_clock", None)
    return clock if callable(clock) else OWN_CLOCK


def _timed_spec(spec: EngineRun, run, prompts: int, clock: Callable[[], float]):
    started = clock()
    outputs = run()
    seconds = clock() - started
    return seconds, outputs, spec.pass_record(prompts)


def one_token_requests(
    spec: EngineRun, prompt: list[list[int]], params, clock: Callable[[], float]
) -> dict[str, float]:
    """A 1-token request's seconds in plain decoding and with speculation (medians of three), timed
    through the engine itself on one prompt: with the round's own plain decoding they give a plain
    step and each request's fixed cost (:class:`spectest.e2e.speed.EngineRound`)."""
    return {
        "plain_one": median_time(lambda: spec.plain_generate(prompt, params, 1, 0), clock=clock),
        "spec_one": median_time(lambda: spec.generate(prompt, params, 1, 0), clock=clock),
    }
