"""EAGLE 1.2.1's tree sampler from its wheel (spectest/implementations/eagle.py), gated as published.

* Exact: with a one-hot target at every node the sampler's path is determined (accept the child whose token the
  target names, reject the others), so the adapter's translation of spectest's trees into EAGLE's (node order,
  parent groups, sibling ranks, conditional draft probabilities) is checked token for token on random trees.
* Slow: at temperature 1 the sampler passes the tree properties (the control); at temperature 0.7, as EAGLE runs
  it, the sequences through tree passes fail, by the rule its bonus breaks (the token after a fully accepted path
  comes from the raw logits; tests/engines/repro/eagle_bonus_temperature.py shows it without spectest).

The wheel runs where it is installed (``pip install --no-deps eagle-llm==1.2.1``: .ci/run does).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from spectest import rules
from spectest.cases.trees import tree_shape
from tests.runner_helpers import run_pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("eagle") is None, reason="eagle-llm is not installed (pip install --no-deps eagle-llm)"
)


def followed(parents: list[int], tokens: list[int], named: list[int]) -> tuple[list[int], int]:
    """The path and extra token when the target at node n puts all its mass on ``named[n]``: from the root, step
    to the first child whose token is named, until none is; the extra token is the one named there."""
    node, path = 0, []
    while True:
        children = [i for i, parent in enumerate(parents) if i > 0 and parent == node]
        hit = [child for child in children if tokens[child] == named[node]]
        if not hit:
            return path, named[node]
        node = hit[0]
        path.append(node)


@pytest.mark.parametrize("style", ["random", "star", "chain"])
def test_one_hot_targets_are_followed_down_every_tree(style: str) -> None:
    from spectest.implementations.eagle import EAGLE

    rng = np.random.default_rng(5)
    b, n, v = 64, 12, 4
    parents = torch.from_numpy(np.stack([tree_shape(rng, n, 3, 4, style) for _ in range(b)]))
    q = torch.from_numpy(rng.dirichlet(np.ones(v), size=(b, n))).to(torch.float32) * 0.98 + 0.02 / v
    named = torch.from_numpy(rng.integers(v, size=(b, n)))
    tokens = torch.zeros((b, n), dtype=torch.int64)
    for row in range(b):  # siblings drawn without replacement: distinct tokens under each parent
        for parent in range(n):
            children = [i for i in range(1, n) if int(parents[row, i]) == parent]
            if children:
                tokens[row, children] = torch.from_numpy(rng.permutation(v)[: len(children)])
    p = torch.nn.functional.one_hot(named, v).to(torch.float32)
    path, token = EAGLE.verify_tree(parents, tokens, q, p, generator=torch.Generator().manual_seed(3))
    for row in range(b):
        want_path, want_token = followed(parents[row].tolist(), tokens[row].tolist(), named[row].tolist())
        got = [int(x) for x in path[row] if x >= 0]
        assert (got, int(token[row])) == (want_path, want_token), f"row {row}: parents {parents[row].tolist()}"


@pytest.mark.slow
@pytest.mark.cost(200)
def test_eagle_is_exact_at_temperature_1_and_its_bonus_is_not_at_0_7(tmp_path) -> None:
    common = ["--spec-budget", "quick", "--spec-seed", "1", "--spec-no-shrink"]
    (tmp_path / "t1").mkdir()
    (tmp_path / "t07").mkdir()
    control = run_pytest(
        ["--spec-model", "eagle", *common, "-k", "test_tree_sequences or test_tree_tokens_per_pass"], tmp_path / "t1"
    )
    assert control.returncode == 0, control.output[-3000:]
    assert "eagle-llm's evaluate_posterior (the EAGLE-1 sampler), temperature 1" in control.output
    assert {o.outcome for o in control.results.values()} == {"passed"}, control.output[-3000:]
    finding = run_pytest(["--spec-model", "eagle-temperature", *common, "-k", "test_tree_sequences"], tmp_path / "t07")
    outcome = finding.results[("eagle-temperature", "test_tree_sequences_follow_the_target")]
    assert outcome.outcome == "failed" and outcome.failure["rule"] == rules.TREE_JOINT, finding.output[-3000:]
