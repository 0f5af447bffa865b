"""Measured speedups agree with the tokens-per-pass model and its break-even threshold.

A sweep on costed models (exact outputs, a decoder's costs: weight reads plus per-position
arithmetic, V = 32000, a batch of rows) from a draft equal to the target to a uniform one, in
rounds: at every point, plain decoding, the reference's speculative decoding (the loop's costs)
and the implementation's, interleaved, on a clock that other processes cannot steal from, plus
one chunk of the implementation with every draft accepted (its own verify cost, measured
without the acceptance under test; see :mod:`spectest.speed.bench`). Deselect with
``-m "not spec_speed"``.

Verdicts, per point, each a sign test over rounds (distribution-free; see
:class:`spectest.statistics.chisquare.SignTest`) at the property's share of the run's alpha:

* agreement (``rules.SPEEDUP_AGREES``): the measured speedup falls more than SPEED_MARGIN short
  of the speedup the model predicts with the implementation's *own* costs, in most rounds. A
  verifier whose cost grows with rejections, or that wastes accepted drafts, measures below its
  own model; a verifier that is exact and merely slow everywhere follows it, and passes;
* floor (``rules.PASS_COST_FLOOR``): a pass costs less than it would with a *free* verifier,
  divided by SPEED_MARGIN (no implementation can; the model's accounting would be wrong);
* efficiency gate (``rules.EFFICIENT_PASS``, only when asked: ``--spec-speed-gate RATIO`` or the
  model's ``spectest_speed_gate``): a pass costs more than RATIO times an efficient pass (the
  reference's verify in the same loop).

How the implementation compares with an efficient pass is measured and reported either way. A
machine too noisy to time, or whose rounds the cost fit cannot price, gets a skip with its
figures, never a failure.
"""

from __future__ import annotations

import numpy as np
import pytest
from spectest.simulators import break_even_acceptance, expected_tokens_iid

from spectest import rules
from spectest.speed.bench import (
    AGREEMENT_MISSES,
    SPEED_MARGIN,
    BenchConfig,
    SpeedBench,
    break_even,
    point_record,
    reference_model,
)
from spectest.speed.clock import NOISE_LIMIT
from spectest.statistics.chisquare import SignTest

MIXES = (0.0, 0.4, 0.7, 1.0)  # acceptance about 1.0, 0.77, 0.6, 0.43: both sides of break-even
# Four rows and 16 passes per chunk: a round's speedup is measured to about 5-10% (one row's 6
# passes scatter by 20% and more), so a correct implementation is decided in a few rounds; a 48 MB
# target makes a pass memory-bound enough that the sweep straddles break-even (about 0.62).
CONFIG = {"batch": 4, "passes": 6, "model_passes": 16, "target_mb": 48.0}
# Rounds the cost fit could not price (see spectest.speed.bench.RoundCosts.fit_ok) are left out;
# past this many, and more than the rounds it could price, the property skips with its figures.
POOR_FIT_ROUNDS = 6


def _describe(bench: SpeedBench, config: BenchConfig, gate: float | None) -> str:
    costs, own = bench.pooled_costs(), bench.pooled_costs(own=True)
    own_even = break_even_acceptance(config.k, own)
    table = "\n".join(
        f"  a={p.acceptance_exact:.3f}: speedup {p.speedup_measured:.3f}x measured, {p.speedup_own:.3f}x with its own "
        f"costs (x{p.agreement:.3f}), {p.speedup_predicted:.3f}x for an efficient pass; pass "
        f"{1e3 * np.median([r.pass_cost for r in p.judged]):.2f} ms measured, "
        f"{1e3 * np.median([r.model_pass_cost for r in p.judged]):.2f} ms efficient (x{p.pass_cost_ratio:.3f}); "
        f"{len(p.judged)} rounds"
        for p in bench.points
    )
    return (
        f"speculative decoding at K={config.k}, V={config.vocab}, batch {config.batch}, timed on {bench.clock.name}; "
        f"efficient pass: c={costs.cost_ratio:.3f}, d={costs.verify_growth:.3f}, o={costs.overhead:.3f}, "
        f"o_reject={costs.rejection_overhead:+.3f}, o_plain={costs.plain_overhead:.3f}; its own verify: "
        f"o={own.overhead:.3f}, o_reject={own.rejection_overhead:+.3f}; break-even a*="
        f"{'never' if own_even is None else format(own_even, '.3f')} with its own costs; "
        f"efficiency gate: {'x' + format(gate, 'g') if gate else 'off (measured only)'}\n{table}"
    )


def _record(spec, bench: SpeedBench, config: BenchConfig, gate: float | None) -> None:
    costs, own = bench.pooled_costs(), bench.pooled_costs(own=True)
    even = break_even(bench.points, config.k, costs)
    best = max(bench.points, key=lambda p: p.acceptance_exact)
    spec.record(
        {
            "k": config.k,
            "batch": config.batch,
            "clock": bench.clock.name,
            "speed_points": [point_record(p, config.k, costs) for p in bench.points],
            "costs": {name: getattr(costs, name) for name in costs.__dataclass_fields__},
            "own_costs": {name: getattr(own, name) for name in own.__dataclass_fields__},
            "break_even_predicted": even.predicted,
            "break_even_own": break_even_acceptance(config.k, own),
            "break_even_measured": even.measured,
            "speed_efficiency": {
                "acceptance": best.acceptance_exact,
                "pass_cost_ratio": best.pass_cost_ratio,
                "speedup_measured": best.speedup_measured,
                "speedup_efficient": best.speedup_predicted,
            },
            "speed_gate": gate,
            "rounds": bench.rounds_run,
            "poor_fit_rounds": bench.poor_fits,
        }
    )


@pytest.mark.spec_speed
@pytest.mark.spec_property(examples=1, checks=1, cost=5)
def test_measured_speedup_follows_the_model(spec) -> None:
    if getattr(spec.model.verify, "spectest_chain_view", False):
        pytest.skip(
            f"{spec.model.name} is a tree verifier: the chain speed model does not describe a tree's pass "
            "(its chain view is held to exactness only)"
        )
    if spec.model.interpreted:
        pytest.skip(
            f"{spec.model.name} runs Triton kernels in Triton's interpreter here: a pass costs what the interpreter "
            "costs, which says nothing of the kernel's speed (time it on a GPU)"
        )
    if spec.lossy:
        pytest.skip(
            f"{spec.model.name} runs in lossy mode: the speed model predicts a pass from standard rejection "
            "sampling's acceptance, and a lossy rule accepts at its own rate (its tokens per call are reported "
            "beside its measured TV)"
        )
    config = BenchConfig(device=str(spec.device), seed=spec.session.seed % 1000, **CONFIG)
    bench = SpeedBench(spec.model, reference_model(), config, MIXES, timeout=spec.session.timeout)
    spread = bench.timing_spread()
    if spread > NOISE_LIMIT:
        pytest.skip(
            f"machine too noisy to time: identical target steps spread {spread:.0%} of their median on "
            f"{bench.clock.name} (limit {NOISE_LIMIT:.0%})"
        )
    gate = spec.session.speed_gate_for(spec.model)
    bench.warm_up()
    level = spec.alpha / ((3 if gate else 2) * len(MIXES))  # Bonferroni over points and tests
    agree = [SignTest.plan(level, misses=AGREEMENT_MISSES) for _ in MIXES]
    floor = [SignTest.plan(level) for _ in MIXES]
    efficient = [SignTest.plan(level) for _ in MIXES] if gate else []
    tests = [agree, floor, *([efficient] if gate else [])]
    while live := [i for i in range(len(MIXES)) if not all(t[i].decided for t in tests)]:
        results = bench.run_round(live)
        if bench.poor_fits >= POOR_FIT_ROUNDS and bench.poor_fits > bench.rounds_run - bench.poor_fits:
            _record(spec, bench, config, gate)
            pytest.skip(
                f"the cost model could not price a pass on this machine: in {bench.poor_fits} of {bench.rounds_run} "
                f"rounds the reference's passes scattered around the fitted costs by more than the round's timing "
                f"noise allows (see spectest.speed.bench.RoundCosts.fit_ok)\n{_describe(bench, config, gate)}"
            )
        if not results[0].fit_ok:
            continue
        for i, result in zip(live, results, strict=True):
            agree[i].add(result.agreement * SPEED_MARGIN < 1)
            floor[i].add(result.pass_cost * SPEED_MARGIN < result.free_verify_pass_cost)
            if gate:
                efficient[i].add(result.cost_ratio * gate < 1)
    _record(spec, bench, config, gate)
    context = _describe(bench, config, gate)
    for i, point in enumerate(bench.points):
        where = f"at acceptance {point.acceptance_exact:.3f}"
        spec.require(
            not agree[i].rejected,
            rules.SPEEDUP_AGREES,
            f"{where} the measured speedup fell more than {SPEED_MARGIN}x short of the model with the "
            f"implementation's own costs in {agree[i].hits} of {agree[i].seen} rounds: {point.speedup_measured:.3f}x "
            f"measured against {point.speedup_own:.3f}x predicted (x{point.agreement:.3f}); tokens per pass "
            f"{point.tokens_per_pass:.3f} against the chain's {expected_tokens_iid(point.acceptance_exact, config.k):.3f}; "
            f"sign test p = {agree[i].p_value:.2g} <= {level:.2g}. Its cost grows with rejections or it wastes "
            f"accepted drafts\n{context}",
        )
        spec.require(
            not floor[i].rejected,
            rules.PASS_COST_FLOOR,
            f"{where} a pass cost less than the model with a free verifier (divided by {SPEED_MARGIN}) in "
            f"{floor[i].hits} of {floor[i].seen} rounds; sign test p = {floor[i].p_value:.2g} <= {level:.2g}\n{context}",
        )
        if gate:
            spec.require(
                not efficient[i].rejected,
                rules.EFFICIENT_PASS,
                f"{where} a pass cost more than x{gate:g} an efficient pass in {efficient[i].hits} of "
                f"{efficient[i].seen} rounds: x{point.pass_cost_ratio:.3f} of an efficient pass (median); spec "
                f"decoding pays {point.speedup_measured:.3f}x here instead of {point.speedup_predicted:.3f}x; "
                f"sign test p = {efficient[i].p_value:.2g} <= {level:.2g}\n{context}",
            )
