"""Decoding loops, costed models and the speed benchmark's arithmetic (no wall-clock assertions)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from spectest.simulators import CostModel, break_even_acceptance, speedup

from spectest.implementations.reference import verify
from spectest.protocol import Model
from spectest.sampling import make_generator
from spectest.speed.bench import PhaseFit, PointRound, RoundCosts, SpeedPoint, break_even, round_costs
from spectest.speed.clock import OWN_CLOCK
from spectest.speed.decoding import (
    CostedMarkovLM,
    DecodeResult,
    plain_decode,
    rolled_table,
    speculative_decode,
    uniform_acceptance_pair,
)

REFERENCE = Model("reference", verify, source="reference")
CPU = torch.device("cpu")


def test_costed_model_outputs_exactly_its_table():
    table = np.random.default_rng(0).dirichlet(np.ones(7), size=8)
    model = CostedMarkovLM(table, hidden=32, layers=3, weight_mb=0.5)
    tokens = torch.tensor([[7, 0, 3, 6], [1, 1, 2, 5]])
    assert model.bulk is not None and model.bulk.numel() * 4 == 2**19  # half a megabyte read per forward
    assert torch.equal(model.forward(tokens), torch.as_tensor(table, dtype=torch.float32)[tokens])


@pytest.mark.parametrize("mix", [0.0, 0.3, 1.0])
def test_uniform_acceptance_pair_accepts_equally_everywhere(mix):
    target, draft, acceptance = uniform_acceptance_pair(16, mix, seed=3)
    assert target.shape == draft.shape == (17, 16)
    per_context = torch.minimum(target, draft).double().sum(dim=1)
    assert per_context.numpy() == pytest.approx(np.full(17, acceptance))
    assert torch.allclose(target.sum(1), torch.ones(17)) and torch.allclose(draft.sum(1), torch.ones(17))
    assert not torch.equal(target[0], target[1])  # contexts differ (rotations), acceptance does not


def test_rolled_table_is_a_view_at_large_vocabularies():
    row = np.random.default_rng(0).dirichlet(np.ones(128256))
    table = rolled_table(row)
    assert table.shape == (128257, 128256) and table.untyped_storage().nbytes() == 2 * 128256 * 4
    assert torch.equal(table[5], torch.as_tensor(np.roll(row, -5), dtype=torch.float32))


def test_speculative_decoding_with_the_target_as_draft_emits_k_plus_one_per_pass():
    target, draft, acceptance = uniform_acceptance_pair(16, 0.0, seed=1)
    assert acceptance == pytest.approx(1.0)
    models = [CostedMarkovLM(t, hidden=16, layers=1) for t in (target, draft)]
    result = speculative_decode(
        *models, REFERENCE, batch=3, tokens=50, k=4, start=16, generator=make_generator(0), device=CPU
    )
    assert (result.tokens_per_pass == 5).all() and result.acceptance == 1.0
    assert result.tokens.shape == (3, 50) and ((result.tokens >= 0) & (result.tokens < 16)).all()


def test_plain_decoding_follows_the_first_token_distribution():
    target, _, _ = uniform_acceptance_pair(8, 0.5, seed=2)
    model = CostedMarkovLM(target, hidden=8, layers=1)
    result = plain_decode(model, batch=20_000, tokens=1, start=8, generator=make_generator(1), device=CPU)
    observed = np.bincount(result.tokens[:, 0].numpy(), minlength=8) / 20_000
    assert np.abs(observed - target[8].numpy()).max() < 0.02  # 20k draws: sd < 0.0036 per cell


def test_loops_split_their_time_into_phases_and_stop_after_the_passes_asked():
    target, draft, _ = uniform_acceptance_pair(16, 0.5, seed=1)
    models = [CostedMarkovLM(t, hidden=8, layers=1) for t in (target, draft)]
    spec = speculative_decode(
        *models,
        REFERENCE,
        batch=2,
        tokens=0,
        passes=7,
        k=3,
        start=16,
        generator=make_generator(0),
        device=CPU,
        phases=True,
    )
    assert spec.passes == 7 and spec.tokens_per_pass.shape == (2, 7) and spec.phases.shape == (7, 4)
    assert spec.emitted == int(spec.tokens_per_pass.sum())
    assert (spec.phases > 0).all() and spec.phases.sum() <= spec.seconds
    plain = plain_decode(models[0], batch=2, tokens=5, start=16, generator=make_generator(0), device=CPU, phases=True)
    assert plain.phases.shape == (5, 2) and plain.phases.sum() <= plain.seconds


def test_own_clock_counts_a_sleep_and_names_itself():
    """The own clock charges a sleep to the thread (wall minus run-queue wait), and never runs ahead of wall time.

    Up to five sleeps: a loaded kernel can now and then book part of a sleep as run-queue wait (CI saw 4.5 ms of a
    50 ms sleep once, beside two busy workers), so one sleep counted in full shows the clock counts waits; a clock
    that never does (CPU time) fails all five."""
    counted = []
    for _ in range(5):
        started, wall = OWN_CLOCK(), time.perf_counter()
        time.sleep(0.05)
        elapsed, wall = OWN_CLOCK() - started, time.perf_counter() - wall
        assert elapsed <= wall + 1e-3, f"own clock {elapsed:.4f} s ran ahead of wall time {wall:.4f} s"
        counted.append(elapsed)
        if OWN_CLOCK.counts_waits and elapsed >= 0.049:
            break
    if OWN_CLOCK.counts_waits:  # wall minus run-queue delay: a sleep is the thread's own time
        assert max(counted) >= 0.049, f"no 50 ms sleep of five counted in full: {counted}"
        assert "schedstat" in OWN_CLOCK.name
    else:  # CPU time: a sleep costs nothing
        assert max(counted) < 0.049 and OWN_CLOCK.name == "thread CPU time"


def test_phase_fit_separates_bonus_and_rejection_costs():
    rejected = np.array([0.0, 1.0, 0.0, 1.0, 0.5])
    fit = PhaseFit.fit(2.0 + 3.0 * rejected, rejected)
    assert fit.bonus == pytest.approx(2.0) and fit.reject == pytest.approx(5.0) and fit.at(0.25) == pytest.approx(2.75)
    flat = PhaseFit.fit(np.array([1.0, 3.0]), np.array([1.0, 1.0]))  # r never varies: the mean at both ends
    assert flat.bonus == flat.reject == 2.0


def test_phase_fit_ignores_one_stretched_pass():
    rejected = np.array([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    seconds = 2.0 + 1.0 * rejected
    seconds[0] = 50.0  # a preemption or a page fault stretched one pass
    fit = PhaseFit.fit(seconds, rejected)
    assert fit.bonus == pytest.approx(2.0, rel=0.05) and fit.reject == pytest.approx(3.0, rel=0.05)


@settings(max_examples=200, deadline=None, database=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=12),
    st.lists(st.floats(0.0, 0.05), min_size=2, max_size=12),
)
def test_phase_fit_and_cost_model_never_go_negative_whatever_the_timings(rejected, seconds):
    """However the timings fall (a busy machine made rejected passes look cheaper than free), every
    fitted cost is >= 0 and the cost model's terms are valid: no timing can make the harness raise."""
    size = min(len(rejected), len(seconds))
    r, t = np.array(rejected[:size]), np.array(seconds[:size])
    fit = PhaseFit.fit(t, r)
    assert fit.bonus >= 0 and fit.reject >= 0
    fits = [fit, PhaseFit(fit.reject, fit.bonus), fit, PhaseFit(0.0, fit.bonus)]
    costs = RoundCosts(4, max(1e-6, float(t.mean())), float(t.max()) + 1e-6, *fits, calibration=(0.0, 1.0, 0.0, 2.0))
    for model in (costs.cost_model(), costs.own_cost_model()):  # CostModel validates its terms on creation
        assert model.overhead + model.rejection_overhead >= 0
        assert speedup(0.5, 4, model) > 0


def test_the_own_cost_model_prices_the_implementations_pass_from_its_calibration():
    """Each phase as the implementation's all-accepted chunk timed it, plus what a rejection adds to
    an efficient pass; an efficient pass is the reference's."""
    fits = [PhaseFit(0.004, 0.004), PhaseFit(0.010, 0.010), PhaseFit(0.002, 0.003), PhaseFit(0.001, 0.001)]
    costs = RoundCosts(4, 0.01, 0.012, *fits, calibration=(0.004, 0.011, 0.008, 0.001))
    assert costs.pass_cost(1.0) == pytest.approx(0.018)
    assert costs.own_pass_cost(0.0) == pytest.approx(0.024) and costs.own_pass_cost(1.0) == pytest.approx(0.025)
    own = costs.own_cost_model()
    assert own.overhead == pytest.approx(0.9) and own.rejection_overhead == pytest.approx(0.1)
    assert speedup(1.0, 4, own) == pytest.approx(5 * 0.012 / 0.024)
    assert RoundCosts(4, 0.01, 0.012, *fits).own_pass_cost(1.0) == costs.pass_cost(1.0)  # no calibration


def test_a_round_whose_passes_scatter_beyond_its_timing_noise_is_not_judged():
    fits = [PhaseFit(0.004, 0.004)] * 4
    assert RoundCosts(4, 0.01, 0.012, *fits, fit_residual=0.05, step_noise=0.01).fit_ok
    assert not RoundCosts(4, 0.01, 0.012, *fits, fit_residual=0.3, step_noise=0.01).fit_ok
    assert RoundCosts(4, 0.01, 0.012, *fits, fit_residual=0.3, step_noise=0.2).fit_ok  # noise explains it


def _decode(seconds: float, phases: list[list[float]], counts: list[int], k: int = 4) -> DecodeResult:
    return DecodeResult(
        torch.zeros((1, 1)),
        seconds,
        passes=len(counts),
        tokens_per_pass=torch.tensor([counts]),
        emitted=sum(counts),
        k=k,
        phases=np.array(phases),
    )


def test_round_costs_give_leviathans_terms_from_the_phases():
    plain = _decode(0.012, [[0.01, 0.002]], [1])  # t1 = 10 ms, a plain token 12 ms
    # Two passes: a bonus (L = 5) and a rejection (L = 1); the verify call costs 1 ms more on the rejection.
    reference = _decode(0.0, [[0.004, 0.011, 0.002, 0.001], [0.004, 0.011, 0.003, 0.001]], [5, 1])
    costs = round_costs([plain], [reference], k=4)
    model = costs.cost_model()
    assert model.cost_ratio == pytest.approx(0.1) and model.verify_growth == pytest.approx(0.025)
    assert model.overhead == pytest.approx(0.3) and model.rejection_overhead == pytest.approx(0.1)
    assert model.plain_overhead == pytest.approx(0.2)
    assert costs.pass_cost(1.0) == pytest.approx(0.019) and costs.pass_cost_without_verify(0.0) == pytest.approx(0.016)
    # speedup(a) = E[L](a) (1 + o_plain) / (K c + 1 + d K + o + o_r (1 - a^K)), in seconds the same:
    assert speedup(1.0, 4, model) == pytest.approx(5 * 0.012 / 0.018)


def _point(acceptance: float, speedup_measured: float) -> SpeedPoint:
    point = SpeedPoint(0.0, acceptance)
    point.rounds.append(PointRound(0, 10, 1, 0.0, 1.0, 1.0, 0.5, 10 / speedup_measured, 1.0))
    return point


def test_break_even_interpolates_the_crossing_and_predicts_from_costs():
    points = [_point(0.2, 0.8), _point(0.5, 0.95), _point(0.7, 1.15), _point(0.9, 1.6)]
    even = break_even(points, 4, CostModel(0.2))
    assert even.bracket == (0.5, 0.7)
    assert even.measured == pytest.approx(0.5 + 0.2 * (0.05 / 0.2))
    assert even.predicted == pytest.approx(break_even_acceptance(4, CostModel(0.2)))


def test_bench_cli_json(capsys):
    from spectest.cli import main

    code = main(
        [
            "bench",
            "--mixes",
            "0.2",
            "--tokens",
            "4",
            "--passes",
            "2",
            "--rounds",
            "2",
            "--vocab",
            "64",
            "--target-mb",
            "0.1",
            "--draft-mb",
            "0.01",
            "--json",
        ]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "spectest.bench/2" and document["verifier"] == "reference"
    assert set(document["costs"]) == {"cost_ratio", "verify_growth", "overhead", "rejection_overhead", "plain_overhead"}
    point = document["points"][0]
    assert point["rounds"] == 2 and sum(point["counts"]) == 4 and len(point["model_probs"]) == 5
    assert point["ratio"] > 0 and point["pass_cost_ratio"] > 0 and 0 < point["acceptance"] < 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mixes", "2"], "need comma-separated values in [0, 1]"),
        (["--spec-model", "nope"], "is not a registered name"),
        (["--model", "nope"], "is not a registered name"),  # the old spelling still works
        (["--spec-seed", "-1"], "must be a non-negative integer"),
    ],
)
def test_bench_cli_rejects_bad_arguments(capsys, args, message):
    from spectest.cli import main

    with pytest.raises(SystemExit) as info:
        main(["bench", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err
