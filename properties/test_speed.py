"""Measured speedups agree with the tokens-per-pass model and its break-even threshold.

A sweep on costed models (exact outputs, a decoder's costs: weight reads plus per-position
arithmetic, V = 32000) from a draft equal to the target to a uniform one, in rounds: at every
point, plain decoding, the reference's speculative decoding (whose phases give the model's
costs, see :mod:`spectest.speed.bench`) and the implementation's, interleaved, on a clock that other
processes cannot steal from. Deselect with ``-m "not spec_speed"``.

Verdicts, per point, each a sign test over rounds (distribution-free; see
:class:`spectest.engine.stats.SignTest`) at the property's share of the run's alpha:

* too slow: the implementation's pass costs more than SPEED_MARGIN times the model's pass with
  efficient (reference) verification, in most rounds;
* too fast: it costs less than a pass with a *free* verifier, divided by SPEED_MARGIN (no
  implementation can; the model's accounting would be wrong).

A correct, efficient implementation sits at ratio 1 and is decided after a round or two; one
whose passes cost 1.5x the model fails every time. Tokens per pass are the acceptance
properties' business (``test_tokens_per_call_follow_the_chain_model``): the speedup reported
here uses the measured tokens, the model the exact acceptance.
"""

from __future__ import annotations

import numpy as np
import pytest

from spectest import rules
from spectest.engine.stats import SignTest
from spectest.speed.bench import SPEED_MARGIN, BenchConfig, SpeedBench, break_even, point_record, reference_model

MIXES = (0.0, 0.4, 0.7, 1.0)  # acceptance about 1.0, 0.77, 0.6, 0.43: both sides of break-even
# A machine where identical target steps spread more than this (interquartile range over the
# median, on the own-time clock) cannot be timed; the property says so after a second.
NOISE_LIMIT = 0.5


@pytest.mark.spec_speed
@pytest.mark.spec_property(examples=1, checks=1)
def test_measured_speedup_follows_the_model(spec) -> None:
    if getattr(spec.model.verify, "spectest_chain_view", False):
        pytest.skip(
            f"{spec.model.name} is a tree verifier: the chain speed model does not describe a tree's pass "
            "(its chain view is held to exactness only)"
        )
    if spec.lossy:
        pytest.skip(
            f"{spec.model.name} runs in lossy mode: the speed model predicts a pass from standard rejection "
            "sampling's acceptance, and a lossy rule accepts at its own rate (its tokens per call are reported "
            "beside its measured TV)"
        )
    config = BenchConfig(device=str(spec.device), seed=spec.session.seed % 1000)
    bench = SpeedBench(spec.model, reference_model(), config, MIXES, timeout=spec.session.timeout)
    spread = bench.timing_spread()
    if spread > NOISE_LIMIT:
        pytest.skip(
            f"machine too noisy to time: identical target steps spread {spread:.0%} of their median on "
            f"{bench.clock.name} (limit {NOISE_LIMIT:.0%})"
        )
    bench.warm_up()
    level = spec.alpha / (2 * len(MIXES))  # Bonferroni over points and the two sides
    slow = [SignTest.plan(level) for _ in MIXES]
    fast = [SignTest.plan(level) for _ in MIXES]
    while live := [i for i in range(len(MIXES)) if not (slow[i].decided and fast[i].decided)]:
        for i, result in zip(live, bench.run_round(live), strict=True):
            slow[i].add(result.cost_ratio * SPEED_MARGIN < 1)
            fast[i].add(result.pass_cost * SPEED_MARGIN < result.free_verify_pass_cost)
    costs = bench.pooled_costs()
    even = break_even(bench.points, config.k, costs)
    spec.record(
        {
            "k": config.k,
            "clock": bench.clock.name,
            "speed_points": [point_record(p, config.k, costs) for p in bench.points],
            "costs": {name: getattr(costs, name) for name in costs.__dataclass_fields__},
            "break_even_predicted": even.predicted,
            "break_even_measured": even.measured,
        }
    )
    table = "\n".join(
        f"  a={p.acceptance_exact:.3f}: pass {1e3 * np.median([r.pass_cost for r in p.rounds]):.2f} ms measured, "
        f"{1e3 * np.median([r.model_pass_cost for r in p.rounds]):.2f} ms model (model/measured "
        f"{p.pass_cost_ratio:.3f}); speedup {p.speedup_measured:.3f}x measured, {p.speedup_predicted:.3f}x model; "
        f"{len(p.rounds)} rounds"
        for p in bench.points
    )
    context = (
        f"speculative decoding at K={config.k}, V={config.vocab}, {config.tokens} tokens per chunk, timed on "
        f"{bench.clock.name}; costs c={costs.cost_ratio:.3f}, d={costs.verify_growth:.3f}, o={costs.overhead:.3f}, "
        f"o_reject={costs.rejection_overhead:+.3f}, o_plain={costs.plain_overhead:.3f}; break-even a*="
        f"{even.predicted if even.predicted is None else round(even.predicted, 3)} predicted, "
        f"{even.measured if even.measured is None else round(even.measured, 3)} measured\n{table}"
    )
    for point, too_slow, too_fast in zip(bench.points, slow, fast, strict=True):
        spec.require(
            not too_slow.rejected,
            rules.PASS_COST,
            f"at acceptance {point.acceptance_exact:.3f} a pass cost more than {SPEED_MARGIN}x the model's (efficient "
            f"verification) in {too_slow.hits} of {too_slow.seen} rounds: model/measured "
            f"{point.pass_cost_ratio:.3f} (median), speedup {point.speedup_measured:.3f}x instead of "
            f"{point.speedup_predicted:.3f}x; sign test p = {too_slow.p_value:.2g} <= {level:.2g}\n{context}",
        )
        spec.require(
            not too_fast.rejected,
            rules.PASS_COST_FLOOR,
            f"at acceptance {point.acceptance_exact:.3f} a pass cost less than the model with a free verifier "
            f"(divided by {SPEED_MARGIN}) in {too_fast.hits} of {too_fast.seen} rounds; sign test p = "
            f"{too_fast.p_value:.2g} <= {level:.2g}\n{context}",
        )
