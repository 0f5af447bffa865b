"""The end-to-end speed property (spectest.e2e.speed, spectest.e2e.speed_check): transformers' loop passes and a
loop that runs its target thrice fails; counters and per-pass records feed the model alike; a round's plain side
is its own plain decoding.
"""

from __future__ import annotations

import pytest

from spectest import rules
from spectest.e2e.protocol import build_engine, call_generate
from spectest.sampling_params import SamplingParams
from tests.engines import ENGINES, SLOW, select_properties
from tests.runner_helpers import run_pytest


@pytest.mark.slow
@pytest.mark.alone
def test_the_speed_property_passes_transformers_and_fails_a_loop_that_runs_the_target_thrice(tmp_path):
    """With --spec-e2e-speed: the unpatched transformers-assisted, reporting only as vLLM's counters do (what a real
    engine gives), passes (its speedup follows the model with its own measured parts); the loop that runs its target
    three times per pass, reporting the same way, fails by the agreement rule (it only adds an unused target call to
    transformers-assisted's, so its output is exact; test_a_loop_that_keeps_one_token_per_pass_stays_exact shows the
    other slow loop's). A per-pass record gives the model what the counters give
    (test_counters_and_per_pass_records_feed_the_speed_model_alike), so the same loop reporting per pass is not run
    again here, where every second is one test at a time."""
    pytest.importorskip("transformers")
    speed = "test_engine_speedup_follows_its_model"
    counted, thrice = "slow_transformers.py:transformers_assisted_counted", "slow_transformers.py:target_thrice_counted"
    engines = [f"{SLOW}:transformers_assisted_counted", f"{SLOW}:target_thrice_counted"]
    selection = select_properties({"transformers_assisted_counted": [speed], "target_thrice_counted": [speed]})
    # At --spec-alpha 0.01 the sign test needs fewer rounds (the level is explicit): every round of the thrice loop
    # falls short, so it fails the same way, and the correct loops' rounds fall short far less often than half.
    options = ["--spec-e2e-speed", "-n", "0", "--spec-budget", "quick", "--spec-alpha", "0.01", "-k", selection]
    run = run_pytest(
        [*[a for e in engines for a in ("--spec-engine", e)], *options],
        tmp_path,
        timeout=1800,
    )
    assert set(run.results) == {(counted, speed), (thrice, speed)}, run.output[-3000:]
    assert run.results[(counted, speed)].outcome == "passed", run.explain(counted, speed)
    outcome = run.results[(thrice, speed)]
    assert outcome.failure == {"kind": "rule", "rule": rules.E2E_SPEEDUP_AGREES}, run.explain(thrice, speed)


@pytest.mark.slow
@pytest.mark.cost(110)
def test_a_loop_that_keeps_one_token_per_pass_stays_exact(tmp_path):
    """The loop that keeps one token per pass (test_a_loop_that_throws_accepted_drafts_away_fails_tokens_per_pass
    fails it by its tokens per pass) passes the output property: its bug costs speed only. It times nothing, so it
    runs beside the other slow tests, not in the timing tests' quiet tier (about a minute and a half)."""
    pytest.importorskip("transformers")
    output, one = "test_engine_output_follows_the_target", "slow_transformers.py:keeps_one_token_per_pass"
    selection = select_properties({"keeps_one_token_per_pass": [output]})
    run = run_pytest(
        ["--spec-engine", f"{SLOW}:keeps_one_token_per_pass", "-n", "0", "--spec-budget", "quick", "-k", selection],
        tmp_path,
        timeout=1800,
    )
    assert set(run.results) == {(one, output)}, run.output[-3000:]
    assert run.results[(one, output)].outcome == "passed", run.explain(one, output)


def test_counters_and_per_pass_records_feed_the_speed_model_alike():
    """The speed property takes K and the target passes from a per-pass record (an instrumented loop) or
    from counters (vLLM's: passes and drafts); one call of transformers-assisted, reporting either way,
    gives it the same K and passes, so a loop the slow test fails while it reports counters fails the same
    way reporting per pass."""
    pytest.importorskip("transformers")
    import importlib.util

    from spectest.e2e.speed_check import pass_totals

    spec = importlib.util.spec_from_file_location("spectest_meta_slow_engines", ENGINES / "slow_transformers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    counted = module.CountedLikeVllm(module.TRANSFORMERS_ASSISTED)
    params = SamplingParams.build(3, temperature=[1.0, 0.7, 1.3], seed=[1, 2, 3])
    totals = []
    for obj in (module.TRANSFORMERS_ASSISTED, counted):
        engine = build_engine("engine", "engine", obj)
        call_generate(engine, [[5, 6, 7], [8, 9], [10]], params, 12, seed=4, timeout=300)
        record = engine.pass_record(3)
        totals.append(pass_totals(record))
    assert totals[0] == totals[1] and totals[0][0] == module.TRANSFORMERS_ASSISTED.k and totals[0][1] >= 3, totals
    assert record.tokens_per_pass is None and record.counts is not None, record


def test_a_speed_rounds_plain_side_is_its_own_plain_decoding():
    """The end-to-end speed model predicts the speculative run from its passes' parts and holds it to the
    round's own plain decoding: a plain step is what the round's tokens cost beyond its 1-token requests,
    so a 1-token call timed 1 ms long (its median of three caught an interruption) moves the prediction
    about 1% and a correct round stays within the 10% margin; a loop that runs its target twice more per
    pass falls short. (The plain side had been modelled from a 9-token call less a 1-token call, over 8:
    1 ms too much there moved every round's prediction 7%, and a CI machine failed a correct loop so.)"""
    from spectest.e2e.speed import EngineRound
    from spectest.speed.bench import SPEED_MARGIN

    ms = 1e-3
    parts = {"draft": 4 * ms, "target": 0.9 * ms, "verify": 0.2 * ms, "target_step": 0.7 * ms}
    requests, tokens, tokens_per_pass = 16, 256, 2.0
    step, plain_fixed, spec_fixed = 0.95 * ms, 2.5 * ms, 2.3 * ms
    plain_seconds = requests * plain_fixed + tokens * step
    pass_cost = sum(parts.values()) - parts["target_step"] + (step - parts["target_step"])
    passes = int(tokens / tokens_per_pass)
    exact_spec = requests * spec_fixed + passes * pass_cost

    def round_of(spec_seconds: float, plain_one: float = plain_fixed + step) -> EngineRound:
        costs = {**parts, "plain_one": plain_one, "spec_one": spec_fixed + step}
        return EngineRound(spec_seconds, plain_seconds, tokens, requests, passes, tokens_per_pass, costs)

    exact = round_of(exact_spec)
    assert exact.costs["plain_step"] == pytest.approx(step) and exact.costs["loop"] == pytest.approx(0.25 * ms)
    assert exact.costs["plain_fixed"] == pytest.approx(plain_fixed) and exact.costs["spec_fixed"] == pytest.approx(
        spec_fixed
    )
    assert exact.predicted == pytest.approx(exact.measured) and exact.unexplained_per_pass == pytest.approx(
        0, abs=1e-12
    )
    late = round_of(exact_spec, plain_one=plain_fixed + step + 1 * ms)
    assert abs(late.predicted / exact.predicted - 1) < 0.015, (late.predicted, exact.predicted)
    assert not late.measured * SPEED_MARGIN < late.predicted
    thrice = round_of(exact_spec + passes * 2 * parts["target"])
    assert thrice.measured * SPEED_MARGIN < thrice.predicted, (thrice.measured, thrice.predicted)
    assert thrice.unexplained_per_pass == pytest.approx(2 * parts["target"])
