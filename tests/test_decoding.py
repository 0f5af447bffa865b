"""Decoding loops, costed models and the speed benchmark's arithmetic (no wall-clock assertions)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from simulators import CostModel, break_even_acceptance
from spectest.bench import BenchConfig, SweepPoint, break_even, run_point
from spectest.decoding import CostedMarkovLM, plain_decode, speculative_decode, uniform_acceptance_pair
from spectest.protocol import Model
from spectest.reference import verify
from spectest.sampling import make_generator

REFERENCE = Model("reference", verify, source="reference")
CPU = torch.device("cpu")


def test_costed_model_outputs_exactly_its_table():
    table = np.random.default_rng(0).dirichlet(np.ones(7), size=8)
    model = CostedMarkovLM(table, hidden=32, layers=3)
    tokens = torch.tensor([[7, 0, 3, 6], [1, 1, 2, 5]])
    assert torch.equal(model.forward(tokens), torch.as_tensor(table, dtype=torch.float32)[tokens])


@pytest.mark.parametrize("mix", [0.0, 0.3, 1.0])
def test_uniform_acceptance_pair_accepts_equally_everywhere(mix):
    target, draft, acceptance = uniform_acceptance_pair(16, mix, seed=3)
    per_context = np.minimum(target, draft).sum(axis=1)
    assert per_context == pytest.approx(np.full(17, acceptance))
    assert np.allclose(target.sum(1), 1) and np.allclose(draft.sum(1), 1)


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
    assert np.abs(observed - target[8]).max() < 0.02  # 20k draws: sd < 0.0036 per cell


def test_run_point_reports_consistent_figures():
    config = BenchConfig(vocab=16, target_hidden=64, draft_hidden=16, layers=2, k=3, tokens=60, repeats=3)
    point = run_point(REFERENCE, config, mix=0.3)
    assert sum(point.tokens_per_pass_counts) > 0 and len(point.tokens_per_pass_counts) == 4
    assert point.costs["cost_ratio"] > 0 and point.speedup_measured > 0
    assert point.ratio == pytest.approx(point.speedup_measured / point.speedup_predicted)


def _point(acceptance: float, speedup: float) -> SweepPoint:
    costs = {"cost_ratio": 0.2, "verify_growth": 0.0, "overhead": 0.0, "plain_overhead": 0.0, "pass_cost": 4 * 0.2 + 1}
    return SweepPoint(0.0, acceptance, acceptance, 1.0, 1.0, speedup, 1.0, costs, [1])


def test_break_even_interpolates_the_crossing_and_predicts_from_costs():
    points = [_point(0.2, 0.8), _point(0.5, 0.95), _point(0.7, 1.15), _point(0.9, 1.6)]
    even = break_even(points, k=4)
    assert even.bracket == (0.5, 0.7)
    assert even.measured == pytest.approx(0.5 + 0.2 * (0.05 / 0.2))
    assert even.predicted == pytest.approx(break_even_acceptance(4, CostModel(0.2)))


def test_bench_cli_json(capsys):
    from spectest.cli import main

    code = main(["bench", "--mixes", "0.2", "--tokens", "30", "--target-hidden", "32", "--draft-hidden", "8",
                 "--layers", "1", "--vocab", "8", "--json"])  # fmt: skip
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "spectest.bench/1" and document["verifier"] == "reference"
    assert set(document["points"][0]) >= {
        "acceptance_measured",
        "speedup_measured",
        "speedup_predicted",
        "ratio",
        "costs",
    }


@pytest.mark.parametrize("args, message", [(["--mixes", "2"], "need comma-separated values in [0, 1]"),
                                           (["--model", "nope"], "is not a registered name")])  # fmt: skip
def test_bench_cli_rejects_bad_arguments(capsys, args, message):
    from spectest.cli import main

    with pytest.raises(SystemExit) as info:
        main(["bench", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err
