"""spectest.gpu.launch_once, the one call compute-sanitizer watches in .ci/gpu-check: it runs a registered model or
``module:attr`` on its inputs (here on the CPU), and holds the output to the chain protocol's exact rules."""

from __future__ import annotations

import subprocess
import sys

import torch

from spectest.gpu.launch_once import broken_rules, inputs


def test_it_runs_a_registered_model_once_and_checks_the_output():
    command = [sys.executable, "-m", "spectest.gpu.launch_once", "reference", "3", "4", "1025", "bfloat16"]
    done = subprocess.run(
        [*command, "--layout", "padded", "--device", "cpu"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "exact rules hold" in done.stdout, done.stdout + done.stderr


def test_padded_inputs_are_unaligned_strided_views():
    drafts, q, p = inputs(2, 3, 10, torch.bfloat16, "padded", seed=0, device=torch.device("cpu"))
    assert p.storage_offset() == 3 and p.stride() == (7 * 15, 15, 1) and q.stride() == (6 * 15, 15, 1)
    assert torch.allclose(p.float().sum(-1), torch.ones(2, 4), atol=0.02) and drafts.shape == (2, 3)


def test_each_broken_rule_is_named():
    drafts = torch.tensor([[4, 5, 6], [7, 8, 9]])
    assert broken_rules(torch.tensor([[4, 5, 1, -1], [3, -1, -1, -1]]), drafts, 10) == []
    assert "not the drafts" in broken_rules(torch.tensor([[4, 9, 1, -1], [3, -1, -1, -1]]), drafts, 10)[0]
    assert "outside [0, 10)" in broken_rules(torch.tensor([[4, 5, 10, -1], [3, -1, -1, -1]]), drafts, 10)[0]
    assert "tokens then -1s" in broken_rules(torch.tensor([[4, -1, 1, -1], [3, -1, -1, -1]]), drafts, 10)[0]
    assert "expected (2, 4) int64" in broken_rules(torch.zeros(2, 3, dtype=torch.int64), drafts, 10)[0]
