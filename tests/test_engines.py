"""Engine adapters and slow implementations: skip cleanly, reach a verdict within the time budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from spectest.resolve import resolve_model
from spectest.statistics.checks import DistributionCheck
from spectest.suite.run import check_allowance
from tests.runner_helpers import run_pytest

REPO = Path(__file__).resolve().parent.parent
GPU_ADAPTERS = ["vllm", "flashinfer", "sglang-tree"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize("name", GPU_ADAPTERS)
def test_gpu_adapters_resolve_and_say_why_they_cannot_run(name):
    model = resolve_model(name)
    assert model.unavailable and ("not installed" in model.unavailable or "CUDA" in model.unavailable)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_unavailable_adapters_skip_every_property_with_the_reason(tmp_path):
    args = ["--spec-model", "vllm", "--spec-model", "flashinfer", "--spec-model", "sglang-tree", "-m", "not spec_speed"]
    run = run_pytest(args, tmp_path)
    assert run.returncode == 0 and run.results, run.output[-2000:]
    assert {o.outcome for o in run.results.values()} == {"skipped"}
    assert all("cannot run here" in o.text for o in run.results.values())
    assert "vllm [logits, ragged-drafts, standard-rejection, strided-inputs] (unavailable:" in run.output


@pytest.mark.cost(25)
def test_slow_per_row_sampler_reaches_a_verdict_within_the_property_budget(tmp_path):
    """transformers' step handles one row per call: the run finishes, passes, and reports the
    weaker effect each cut-short check could still detect, and why it was cut short."""
    pytest.importorskip("transformers")
    run = run_pytest(
        ["--spec-model", "transformers", "--spec-property-seconds", "3", "-k", "every_row or bonus"], tmp_path
    )
    assert run.returncode == 0, run.output[-3000:]
    assert "checks ran below plan on transformers: the implementation's own time in its calls reached" in run.output
    checks = run.document["checks"]
    limited = [c for c in checks if c["time_limited"]]
    assert limited and all(c["draws"] < c["planned_draws"] and c["min_detectable_tv"] > 0.05 for c in limited)
    assert all("reached this property's budget of 3 s" in c["below_plan_because"] for c in limited)
    timings = [f["timing"] for f in run.document["figures"] if "timing" in f]
    assert len(timings) == 2 and all(t["calls_s"] > t["statistics_s"] for t in timings)


@pytest.mark.parametrize("implementation_seconds_per_batch, limited", [(0.0, False), (1.0, True)])
def test_only_the_implementations_own_time_cuts_a_check_short(implementation_seconds_per_batch, limited):
    """Time the implementation did not spend (a busy machine, slow input generation) never counts:
    a check whose implementation took no time runs to plan whatever the wall clock says."""
    spent = [0.0]
    probs = np.full((1, 10), 0.1)
    check = DistributionCheck(
        "slow",
        probs,
        alpha=1e-3,
        tolerance=0.05,
        min_draws=50,
        max_draws=10**6,
        time_budget=0.5,
        spent=lambda: spent[0],
    )
    rng = np.random.default_rng(0)
    while not check.done:
        batch = check.next_batch(10**6)
        spent[0] += implementation_seconds_per_batch
        check.add(rng.multinomial(batch, probs[0])[None, :], batch)
    assert check.result().time_limited == limited
    assert check.draws == (50 if limited else check.planned)


def test_transformers_adapter_leaves_the_global_rng_alone():
    pytest.importorskip("transformers")
    model = resolve_model("transformers")
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    q = torch.full((2, 3, 7), 1 / 7)
    p = torch.softmax(torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(1)), -1)
    model.verify(torch.zeros((2, 3), dtype=torch.int64), q, p, generator=torch.Generator().manual_seed(0))
    assert torch.equal(before, torch.random.get_rng_state())


def test_worked_example_adapter_passes_the_exact_properties(tmp_path):
    model = f"{REPO / 'examples' / 'wrap_my_sampler.py'}:ADAPTER"
    run = run_pytest(
        ["--spec-model", model, "--spec-budget", "quick", "-k", "rejection or inputs or same_generator"], tmp_path
    )
    assert run.returncode == 0 and len(run.results) == 4, run.output[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_gpu_check_says_why_it_cannot_run_without_a_gpu(tmp_path):
    """The prepared GPU check parses, and on a machine without CUDA stops at once, saying why."""
    import subprocess

    script = REPO / ".ci" / "gpu-check"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    done = subprocess.run(
        ["bash", str(script)],
        env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no Python with a CUDA build of torch" in (tmp_path / "status").read_text()


def test_an_expensive_check_of_a_fast_implementation_borrows_but_later_checks_keep_half_a_share():
    """How a property's budget is shared by its checks (spectest.suite.run.check_allowance)."""
    budget, planned = 60.0, 6
    share = budget / planned
    # A fast implementation whose first case is expensive: it may take twice its share.
    assert check_allowance(budget, 0.0, planned, 1) == pytest.approx(2 * share)
    # A slow implementation that uses every allowance: no check gets less than half a share,
    # and the property never spends more than its budget.
    spent, allowances = 0.0, []
    for started in range(1, planned + 1):
        allowances.append(check_allowance(budget, spent, planned, started))
        spent += allowances[-1]
    assert min(allowances) >= share / 2 - 1e-9 and spent <= budget + 1e-9, allowances
    # Cheap earlier checks leave their time to the later ones.
    assert check_allowance(budget, 1.0, planned, 6) == pytest.approx(budget - 1.0)


# SGLang's published example for tree_speculative_sampling_target_only (sgl-kernel's tests): row 0's tree.
SGLANG_PARENTS = [-1, 0, 1, 0, 3, 4]


def test_sglang_tree_tensors_match_its_published_example():
    from spectest.gpu.sglang_tree import sglang_tree_tensors

    index, next_token, next_sibling = sglang_tree_tensors(torch.tensor([SGLANG_PARENTS, SGLANG_PARENTS]))
    assert index.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert next_token[0].tolist() == [1, 2, -1, 4, 5, -1]
    assert next_sibling[0].tolist() == [-1, 3, -1, -1, -1, -1]


def test_sglang_outputs_become_path_and_token():
    """The published example's outputs: row 0 accepts nodes 3, 4, 5 and draws 18 at the leaf; row 1
    (flat rows 6..11) accepts its nodes 4 and 5, then 18."""
    from spectest.gpu.sglang_tree import path_from_sglang

    path, token = path_from_sglang(
        torch.tensor([[0, 3, 4, 5], [6, 10, 11, -1]], dtype=torch.int32),
        torch.tensor([3, 2], dtype=torch.int32),
        torch.tensor([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], dtype=torch.int32),
        nodes=6,
        deepest=3,
    )
    assert path.tolist() == [[3, 4, 5], [4, 5, -1]] and token.tolist() == [18, 18]
    assert path.dtype == token.dtype == torch.int64


def test_sglang_adapter_round_trip_with_a_stand_in_kernel(monkeypatch):
    """A pure-torch stand-in that keeps the kernel's contract (it reads only SGLang's tree tensors,
    writes only its outputs): on a forced path the adapter returns exactly that path and bonus."""
    from spectest.gpu import sglang_tree
    from spectest.implementations.tree import verify_tree
    from spectest.protocol import build_model
    from spectest.tree_protocol import call_verify_tree

    def stand_in(
        *,
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        target_probs,
        draft_probs,
        threshold_single,
        threshold_acc,
        deterministic,
    ):
        b, n = candidates.shape
        parents = torch.full((b, n), -1, dtype=torch.int64)
        for row in range(b):
            for node in range(n):
                child = int(retrive_next_token[row, node])
                while child >= 0:
                    parents[row, child] = node
                    child = int(retrive_next_sibling[row, child])
        path, token = verify_tree(
            parents, candidates.long(), draft_probs, target_probs, generator=torch.Generator(), drafting="top-k"
        )
        flat = torch.where(path >= 0, path + torch.arange(b).unsqueeze(1) * n, -1)
        accept_index.copy_(torch.cat([torch.arange(b).unsqueeze(1) * n, flat], dim=1))
        accept_token_num.copy_((path >= 0).sum(dim=1))
        last = accept_index.long().gather(1, accept_token_num.long().unsqueeze(1)).squeeze(1)
        predicts[last] = token.int()

    monkeypatch.setattr(sglang_tree.SglangTreeSampler, "_kernel", staticmethod(lambda: stand_in))
    parents = torch.tensor([SGLANG_PARENTS, [-1, 0, 0, 1, -1, -1]])
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 0]])
    target = torch.full((2, 6, 8), 0.0)
    for row, chain in enumerate([[(0, 3), (3, 4), (4, 5), (5, None)], [(0, 1), (1, 3), (3, None)]]):
        for node, child in chain:
            target[row, node, tokens[row, child] if child is not None else 7] = 1.0
    target[target.sum(dim=2) == 0] = 1 / 8
    model = build_model("sglang-tree", "test", sglang_tree.SGLANG_TREE, None)
    path, token = call_verify_tree(model, parents, tokens, torch.full_like(target, 1 / 8), target, torch.Generator())
    assert path.tolist() == [[3, 4, 5], [1, 3, -1]] and token.tolist() == [7, 7]
