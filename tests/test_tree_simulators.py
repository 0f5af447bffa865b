"""simulators/tree.py: every exact quantity against an independent route to it (the chain model,
brute force, the Monte Carlo twin, the torch reference), tests at level 1e-6 with fixed seeds."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from spectest.simulators import CostModel, expected_tokens_iid
from spectest.simulators.markov import MarkovChainModel
from spectest.simulators.montecarlo import simulate_tree
from spectest.simulators.tree import (
    SCHEMES,
    drafted_tree_pass,
    expected_tree_pass,
    long_run_tree_tokens_per_pass,
    optimal_tree,
    plan_tree,
    positional_acceptance,
    positional_tree_pass,
    tree_depths,
)

from spectest.cases.toy_models import distribution_pairs, markov_pair
from spectest.cases.trees import TreeCase, build_tree_model, draft_trees
from spectest.cli import main
from spectest.implementations.tree import verify_tree
from spectest.statistics.chisquare import Group, chisquare_groups

LEVEL = 1e-6
SHAPES = [
    np.array([-1, 0, 1, 2, 3]),  # a chain
    np.array([-1, 0, 0, 0, 0]),  # a star
    np.array([-1, 0, 0, 0, 1, 1, 2, 4, 4, -1]),  # unbalanced, an unused slot
]


def markov(seed: int, vocab: int) -> MarkovChainModel:
    target, draft = markov_pair(np.random.default_rng(seed), vocab, "dirichlet", "far")
    return MarkovChainModel(target.table, draft.table)


@pytest.mark.parametrize("drafting", ["iid", "without-replacement"])
def test_a_chain_is_the_markov_chain_model(drafting):
    """A width-one tree under an order-1 Markov pair is the chain: per context and in the long run."""
    model, k = markov(1, 4), 4
    chain = np.arange(-1, k)
    dist, extra = expected_tree_pass(chain, model.target, model.draft, drafting)
    np.testing.assert_allclose(dist.probs, model.tokens_per_pass(k).probs, atol=1e-12)
    np.testing.assert_allclose(extra, model.next_context(k)[:, :-1], atol=1e-12)
    assert long_run_tree_tokens_per_pass(chain, model, drafting) == pytest.approx(model.long_run_tokens_per_pass(k))


@pytest.mark.parametrize("drafting", SCHEMES)
@pytest.mark.parametrize("shape", SHAPES, ids=["chain", "star", "unbalanced"])
def test_context_free_pairs_are_positional(drafting, shape):
    """When p and q do not depend on the context, the exact pass is Sequoia's positional model
    with the rank acceptances of the pair: two routes, one number."""
    rng = np.random.default_rng(2)
    p, q = distribution_pairs(rng, 1, 6, "dirichlet", "far")
    alike = (np.broadcast_to(p[0], (6, 6)), np.broadcast_to(q[0], (6, 6)))
    exact, _ = expected_tree_pass(shape, *alike, drafting)
    positional = positional_tree_pass(shape, positional_acceptance(p[0], q[0], 4, drafting))
    np.testing.assert_allclose(exact.probs[0], positional.probs, atol=1e-12)


def test_positional_chain_is_the_truncated_geometric():
    for a, k in [(0.7, 5), (0.2, 1), (1.0, 3)]:
        assert positional_tree_pass(np.arange(-1, k), [a]).mean == pytest.approx(expected_tokens_iid(a, k))


def fits(observed: np.ndarray, probs: np.ndarray, name: str) -> float:
    return chisquare_groups(name, [Group(np.bincount(observed, minlength=probs.size), probs)], alpha=LEVEL).p_value


@pytest.mark.parametrize("drafting", SCHEMES)
def test_expected_pass_matches_the_monte_carlo_twin(drafting):
    model = markov(3, 4)
    shape = SHAPES[2]
    dist, extra = expected_tree_pass(shape, model.target, model.draft, drafting)
    depth, token = simulate_tree(
        shape, model.target, model.draft, drafting, model.start, 20_000, np.random.default_rng(3)
    )
    assert fits(depth, dist.probs[model.start], "accepted depth") > LEVEL
    assert fits(token, extra[model.start], "extra token") > LEVEL


@pytest.mark.parametrize("drafting", SCHEMES)
def test_reference_verifier_and_harness_drafting_match_the_exact_pass(drafting):
    """The harness's tree drafting plus the torch reference, row by row, against the exact
    expectation over drafting (per depth and token tables), and one drafted tree against
    ``drafted_tree_pass``."""
    case = TreeCase(
        batch=4, nodes=10, max_width=3, max_depth=3, vocab=4, style="random", kinds=(("dirichlet", "far"),), seed=5
    )
    model = build_tree_model(case, drafting, torch.device("cpu"))
    copies = 5000
    trees = draft_trees(model, copies, torch.Generator().manual_seed(6), torch.float64)
    path, _ = verify_tree(
        trees.parents,
        trees.tokens,
        trees.draft_probs,
        trees.target_probs,
        generator=torch.Generator().manual_seed(7),
        drafting=drafting,
    )
    accepted = (path != -1).sum(dim=1).numpy().reshape(copies, case.batch)
    groups = []
    for row in range(case.batch):
        parents = model.parents[row].numpy()
        dist, _ = expected_tree_pass(parents, model.target[row].numpy(), model.draft[row].numpy(), drafting)
        probs = dist.probs[int(model.context[row])]
        groups.append(Group(np.bincount(accepted[:, row], minlength=probs.size), probs, f"row {row} "))
    assert chisquare_groups("reference over drafting", groups, alpha=LEVEL).p_value > LEVEL
    # One drafted tree, verified many times.
    one = [t[:1].repeat(copies, *([1] * (t.dim() - 1))) for t in (trees.parents, trees.tokens)]
    probs = [t[:1].repeat(copies, 1, 1) for t in (trees.draft_probs, trees.target_probs)]
    path, _ = verify_tree(*one, *probs, generator=torch.Generator().manual_seed(8), drafting=drafting)
    exact = drafted_tree_pass(*(t[0].numpy() for t in (*one, *probs)), drafting)
    observed = (path != -1).sum(dim=1).numpy()
    assert fits(observed, exact.tokens.probs, "one drafted tree") > LEVEL


def all_trees(nodes: int):
    """Every parents array of ``nodes`` drafted nodes (node i's parent any earlier node)."""
    for choice in itertools.product(*[range(i) for i in range(1, nodes + 1)]):
        yield np.array([-1, *choice])


@pytest.mark.parametrize("rates", [[0.6, 0.2, 0.1], [0.3, 0.3, 0.3], [0.9], [[0.8, 0.1], [0.4, 0.4], [0.2, 0.1]]])
def test_optimal_tree_beats_every_tree_of_its_budget(rates):
    a = np.asarray(rates[0] if isinstance(rates[0], list) else rates)
    width = a.size
    for budget in range(0, 6):
        for max_depth in (None, 2):
            best = optimal_tree(budget, rates, max_depth=max_depth)
            limit = budget if max_depth is None else max_depth
            brute = max(
                positional_tree_pass(t, rates).mean
                for n in range(budget + 1)
                for t in all_trees(n)
                if max(np.bincount(t[1:], minlength=1), default=0) <= width and tree_depths(t).max() <= limit
            )
            assert best.tokens_per_pass == pytest.approx(brute), (budget, max_depth)
            assert best.nodes <= budget and best.depth <= limit


def test_plan_prefers_a_tree_only_when_siblings_pay():
    wide = plan_tree(16, [0.6, 0.2, 0.1], CostModel(0.05, 0.02))
    assert wide.tree_speedup > wide.chain_speedup and wide.tree.nodes > wide.tree.depth
    narrow = plan_tree(16, [0.7], CostModel(0.05, 0.02))
    assert narrow.tree_speedup == pytest.approx(narrow.chain_speedup)
    assert narrow.tree.nodes == narrow.tree.depth == narrow.chain_k


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="sum"):
        positional_tree_pass(SHAPES[1], [0.7, 0.5])
    with pytest.raises(ValueError, match="parent"):
        tree_depths(np.array([-1, 2, 0]))
    with pytest.raises(ValueError, match="drafting"):
        expected_tree_pass(SHAPES[0], np.eye(3), np.eye(3), "beam")


def test_simulate_tree_cli(capsys):
    assert (
        main(["simulate", "--tree", "--rank-acceptance", "0.6,0.2", "--budget", "6", "--shape", "0,0,1", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "spectest.simulate-tree/1"
    assert out["shape"]["tokens_per_pass"] == pytest.approx(1 + 0.6 + 0.2 + 0.36)
    assert out["tree"]["speedup"] >= out["chain"]["speedup"]
    with pytest.raises(SystemExit):
        main(["simulate", "--tree", "--rank-acceptance", "0.7,0.5"])
    assert "sum to at most 1" in capsys.readouterr().err


def test_long_run_tree_tokens_per_pass_matches_chains_of_passes():
    """Chains of passes (each starts after the previous pass's extra token), started from the
    exact long-run context distribution: each chain's mean tokens per pass is unbiased for the
    long-run value if the pass-to-pass transition is right; a t-test over independent chains."""
    from scipy import stats
    from spectest.simulators.markov import long_run_distribution

    model, shape, drafting = markov(8, 4), SHAPES[2], "without-replacement"
    _, extra = expected_tree_pass(shape, model.target, model.draft, drafting)
    transition = np.zeros((5, 5))
    transition[:, :4] = extra
    contexts = long_run_distribution(transition, model.start)
    rng = np.random.default_rng(9)
    chains, passes = 1000, 15
    context = rng.choice(5, size=chains, p=contexts)
    tokens = np.zeros(chains)
    for _ in range(passes):
        starts = context.copy()
        for c in np.unique(starts):
            rows = np.flatnonzero(starts == c)
            depth, token = simulate_tree(shape, model.target, model.draft, drafting, int(c), rows.size, rng)
            tokens[rows] += depth + 1
            context[rows] = token
    exact = long_run_tree_tokens_per_pass(shape, model, drafting)
    assert stats.ttest_1samp(tokens / passes, exact).pvalue > LEVEL
