"""simulators/: published values reproduced exactly; every analytic quantity cross-checked against
the Monte Carlo twin with a goodness-of-fit or t-test at level 1e-6 (fixed seeds)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from spectest.simulators import (
    CostModel,
    acceptance_for_speedup,
    acceptance_probability,
    break_even_acceptance,
    expected_tokens_iid,
    operations_factor,
    optimal_k,
    speedup,
    tokens_per_pass,
    tokens_per_pass_iid,
)
from spectest.simulators.markov import (
    MarkovChainModel,
    brute_force_prefix_bound,
    context_free_prefix_bound,
    long_run_distribution,
)
from spectest.simulators.montecarlo import simulate_iid, simulate_markov, simulate_positions

from spectest.cases.toy_models import markov_pair
from spectest.statistics.chisquare import Group, chisquare_groups

LEVEL = 1e-6


def markov_model(seed: int, vocab: int, target_kind: str = "dirichlet", draft_kind: str = "far") -> MarkovChainModel:
    target, draft = markov_pair(np.random.default_rng(seed), vocab, target_kind, draft_kind)
    return MarkovChainModel(target.table, draft.table)


# Published values (Leviathan et al. 2023).


def test_table_1_speed_and_operations():
    assert speedup(0.9, 10, CostModel(0.0)) == pytest.approx(6.86, abs=0.005)
    assert operations_factor(0.9, 10, 0.0) == pytest.approx(1.60, abs=0.005)


def test_theorem_3_8_example():
    assert speedup(0.75, 7, CostModel(0.02)) == pytest.approx(3.157, abs=5e-4)


def test_break_even_golden_ratio():
    assert break_even_acceptance(2, CostModel(0.5)) == pytest.approx((math.sqrt(5) - 1) / 2, abs=1e-7)


def test_tokens_per_pass_moments():
    dist = tokens_per_pass_iid(0.8, 5)
    assert dist.mean == pytest.approx(3.68928, abs=1e-5)
    assert dist.variance == pytest.approx(3.86409, abs=1e-5)
    assert dist.probs[-1] == pytest.approx(0.32768, abs=1e-5)


@settings(max_examples=60)
@given(st.integers(1, 8), st.floats(0.01, 2.0))
def test_break_even_rule(k, c):
    """At a*: sum_{i=1..K} a^i / K = c, and the speedup is exactly 1."""
    cost = CostModel(c)
    a = break_even_acceptance(k, cost)
    if c > 1.0:  # a draft step dearer than a target step never pays
        assert a is None
        return
    assert sum(a**i for i in range(1, k + 1)) / k == pytest.approx(c, rel=1e-9)
    assert speedup(a, k, cost) == pytest.approx(1.0, rel=1e-9)
    assert 1.0 > speedup(max(0.0, a - 1e-3), k, cost)
    if a < 1.0:  # at c = 1 only perfect acceptance breaks even
        assert speedup(min(1.0, a + 1e-3), k, cost) > 1.0


@settings(max_examples=60)
@given(st.floats(0.0, 1.0), st.integers(1, 12), st.floats(0, 1), st.floats(0, 0.5), st.floats(0, 0.5))
def test_position_dependent_matches_iid_and_sums_to_one(alpha, k, c, d, o):
    iid = tokens_per_pass_iid(alpha, k)
    assert iid.probs.sum() == pytest.approx(1.0)
    assert iid.mean == pytest.approx((k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha))
    cost = CostModel(c, d, o)
    assert speedup(alpha, k, cost) == pytest.approx(iid.mean / (k * c + 1 + d * k + o))


@pytest.mark.parametrize(
    "cost", [CostModel(0.1, 0.02), CostModel(0.1, 0.02, 0.3, 0.4, 0.2), CostModel(0.1, 0, 0.3, -0.2)]
)
def test_acceptance_for_speedup_inverts_speedup(cost):
    for target in (1.2, 2.0, 3.0):
        a = acceptance_for_speedup(target, 6, cost)
        assert speedup(a, 6, cost) == pytest.approx(target, rel=1e-9)
    assert acceptance_for_speedup(100.0, 6, cost) is None


def test_rejection_and_plain_overheads():
    """A pass ends in a rejection with probability 1 - a^K and then costs o_r more; plain tokens cost 1 + o_plain."""
    cost = CostModel(0.1, 0.05, overhead=0.3, rejection_overhead=0.2, plain_overhead=0.25)
    a, k = 0.7, 4
    expected = expected_tokens_iid(a, k) * 1.25 / (k * 0.1 + 1 + 0.05 * k + 0.3 + 0.2 * (1 - a**k))
    assert speedup(a, k, cost) == pytest.approx(expected)
    assert speedup(1.0, k, cost) == pytest.approx(5 * 1.25 / (k * 0.1 + 1 + 0.05 * k + 0.3))  # no rejections
    assert break_even_acceptance(k, cost) < break_even_acceptance(k, CostModel(0.1, 0.05, 0.5, 0.0, 0.25))
    with pytest.raises(ValueError, match="rejection_overhead must be finite"):
        CostModel(0.1, overhead=0.1, rejection_overhead=-0.2)


def test_optimal_k_is_the_argmax():
    cost = CostModel(0.05, 0.01)
    k, best = optimal_k(0.8, cost, max_k=30)
    assert best == max(speedup(0.8, j, cost) for j in range(1, 31)) == speedup(0.8, k, cost)
    assert optimal_k(0.1, CostModel(0.5)) == (0, 1.0)  # speculation never pays


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="acceptance rate must lie in"):
        speedup(1.5, 3, CostModel(0.1))
    with pytest.raises(ValueError, match="cost_ratio must be a finite number >= 0"):
        CostModel(-1)


# Monte Carlo cross-checks.


def fits(samples: np.ndarray, probs: np.ndarray) -> float:
    counts = np.bincount(samples - 1, minlength=probs.size)
    return chisquare_groups("twin", [Group(counts, probs)], alpha=LEVEL).p_value


def test_iid_distribution_matches_monte_carlo():
    rng = np.random.default_rng(1)
    for alpha, k in [(0.8, 5), (0.3, 3), (0.95, 12)]:
        assert fits(simulate_iid(alpha, k, 200_000, rng), tokens_per_pass_iid(alpha, k).probs) > LEVEL


def test_position_dependent_distribution_matches_monte_carlo():
    rng = np.random.default_rng(2)
    acceptance = [0.9, 0.5, 0.99, 0.2, 0.7]
    assert fits(simulate_positions(acceptance, 200_000, rng), tokens_per_pass(acceptance).probs) > LEVEL


def test_markov_pass_distribution_matches_monte_carlo():
    model = markov_model(3, 4)
    k = 4
    starts, emitted = simulate_markov(model, k, chains=4000, passes=30, rng=np.random.default_rng(3))
    exact = model.tokens_per_pass(k).probs
    groups = [
        Group(np.bincount(emitted[starts == c] - 1, minlength=k + 1), exact[c], f"context {c} ")
        for c in range(model.vocab_size + 1)
    ]
    assert chisquare_groups("markov twin", groups, alpha=LEVEL).p_value > LEVEL


def test_markov_long_run_tokens_per_pass_matches_monte_carlo():
    """Chains started from the exact long-run context distribution: each chain's mean tokens
    per pass is unbiased for the long-run value; a t-test over independent chains."""
    model = markov_model(4, 5, "peaky", "close")
    k = 3
    contexts = model.long_run_contexts(k)
    rng = np.random.default_rng(4)
    start = rng.choice(contexts.size, size=3000, p=contexts)
    _, emitted = simulate_markov(model, k, chains=3000, passes=40, rng=rng, start=start)
    exact = model.long_run_tokens_per_pass(k)
    assert stats.ttest_1samp(emitted.mean(axis=1), exact).pvalue > LEVEL


def test_long_run_distribution_handles_reducible_chains():
    # start -> {1} (closed) w.p. 0.25, -> {2, 3} (closed, periodic) w.p. 0.75
    transition = np.array([[0, 0.25, 0.75, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=float)
    assert long_run_distribution(transition, 0) == pytest.approx([0, 0.25, 0.375, 0.375])


def test_prefix_bound_is_exact_and_standard_sampling_respects_it():
    model = markov_model(5, 3, "sparse", "far")
    for j in (1, 2, 3):
        bound = model.prefix_match_bound(j)
        assert bound == pytest.approx(brute_force_prefix_bound(model, j))
        # Standard rejection sampling accepts the first j drafts with P(L >= j + 1), never more.
        standard = model.tokens_per_pass(j).probs[model.start, j:].sum()
        assert standard <= bound + 1e-12


def test_context_free_prefix_bound_by_enumeration():
    rng = np.random.default_rng(6)
    target, draft = rng.dirichlet(np.ones(3), size=3), rng.dirichlet(np.ones(3), size=2)
    brute = sum(
        min(np.prod([target[i, s[i]] for i in range(2)]), np.prod([draft[i, s[i]] for i in range(2)]))
        for s in itertools.product(range(3), repeat=2)
    )
    assert context_free_prefix_bound(target, draft, 2) == pytest.approx(brute)
    assert context_free_prefix_bound(target, draft, 1) == pytest.approx(acceptance_probability(target[0], draft[0]))


def test_exact_markov_model_handles_v64_k8():
    """The DP at V = 64, K = 8 (its speed is a figure for `python -m timeit`, not a timed test)."""
    model = markov_model(7, 64, "dirichlet", "close")
    per_context = model.tokens_per_pass(8).probs
    assert per_context.shape == (65, 9) and np.allclose(per_context.sum(axis=1), 1)
    assert 1 < model.long_run_tokens_per_pass(8) < 9


def test_reference_through_the_real_loop_matches_the_exact_long_run():
    """Rows start from the exact long-run context distribution, so every pass's expected tokens
    equal the long-run value; each row's mean over its first P passes is unbiased (t-test)."""
    import torch

    from spectest.implementations.reference import verify
    from spectest.protocol import Model
    from spectest.sampling import make_generator
    from spectest.suite.loop import generate

    target, draft = markov_pair(np.random.default_rng(8), 4, "peaky", "close")
    model = MarkovChainModel(target.table, draft.table)
    k, rows, length = 3, 3000, 60
    contexts = model.long_run_contexts(k)
    start = torch.as_tensor(np.random.default_rng(9).choice(contexts.size, size=rows, p=contexts))
    run = generate(
        Model("reference", verify),
        target,
        draft,
        n_sequences=rows,
        length=length,
        k=k,
        draft_generator=make_generator(1),
        verify_generator=make_generator(2),
        device=torch.device("cpu"),
        initial_contexts=start,
    )
    passes = length // (k + 1)  # every row makes at least this many passes
    order = torch.argsort(run.pass_rows, stable=True)
    sorted_rows = run.pass_rows[order]
    first_of_row = torch.searchsorted(sorted_rows, torch.arange(rows))
    rank = torch.arange(sorted_rows.numel()) - first_of_row[sorted_rows]
    keep = rank < passes
    per_row = run.tokens_per_pass[order][keep].view(rows, passes).double().mean(dim=1).numpy()
    assert stats.ttest_1samp(per_row, model.long_run_tokens_per_pass(k)).pvalue > LEVEL


def test_simulate_cli_json_is_stable(capsys):
    import json

    from spectest.cli import main

    assert main(["simulate", "--acceptance", "0.8", "--k", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "spectest.simulate/2"
    assert set(out) == {
        "schema",
        "inputs",
        "tokens_per_pass",
        "speedup",
        "operations_factor",
        "break_even_acceptance",
        "optimal_k",
    }
    assert out["inputs"]["acceptance"] == 0.8 and out["inputs"]["k"] == 5 and set(out["optimal_k"]) == {"k", "speedup"}
    # The old spellings still work, with the same answer.
    assert main(["simulate", "--alpha", "0.8", "--gamma", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == out
    assert out["tokens_per_pass"]["mean"] == pytest.approx(3.68928, abs=1e-5)
    assert out["tokens_per_pass"]["distribution"]["6"] == pytest.approx(0.32768, abs=1e-5)
    assert main(["simulate", "--breakeven-table", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["schema"] == "spectest.breakeven/2" and [row["k"] for row in table["rows"]] == list(range(1, 9))
    assert table["rows"][1]["break_even"][table["cost_ratios"].index(0.5)] == pytest.approx(0.6180340, abs=1e-7)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--acceptance", "1.5"], "argument --acceptance/--alpha: must lie in [0, 1], got 1.5"),
        (["--acceptance", "0.5", "--cost-ratio", "-1"], "argument --cost-ratio: must be a finite number >= 0, got -1"),
        (["--acceptance", "0.5", "--k", "0"], "argument --k/--gamma: must be an integer >= 1, got 0"),
        ([], "simulate needs --acceptance (or --breakeven-table)"),
    ],
)
def test_simulate_cli_rejects_bad_arguments(capsys, args, message):
    from spectest.cli import main

    with pytest.raises(SystemExit) as info:
        main(["simulate", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
