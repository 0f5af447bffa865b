"""The exact output contract: every rule is enforced and names the implementation."""

from __future__ import annotations

import pytest
import torch

from spectest.protocol import ContractViolation, Model, call_verify

DRAFTS = torch.tensor([[1, 2, 3], [0, 0, 0]])
Q = torch.full((2, 3, 5), 0.2)
P = torch.full((2, 4, 5), 0.2)


def returning(value):
    return Model("fake", lambda d, q, p, *, generator: value)


@pytest.mark.parametrize(
    "output, rule",
    [
        ([[1, -1, -1, -1]] * 2, "returns a tensor"),
        (torch.zeros((2, 3), dtype=torch.int64), "output shape is [B, K+1]"),
        (torch.zeros((2, 4), dtype=torch.int32), "output dtype is int64"),
        (torch.tensor([[1, 5, -1, -1], [0, -1, -1, -1]]), "ids lie in [0, V) or are -1 padding"),
        (torch.tensor([[1, -2, -1, -1], [0, -1, -1, -1]]), "ids lie in [0, V) or are -1 padding"),
        (torch.tensor([[-1, -1, -1, -1], [0, -1, -1, -1]]), "tokens then -1 padding, at least one token"),
        (torch.tensor([[1, -1, 4, -1], [0, -1, -1, -1]]), "tokens then -1 padding, at least one token"),
        (torch.tensor([[1, 4, 3, -1], [0, -1, -1, -1]]), "accepted tokens are the draft prefix"),
    ],
)
def test_each_rule_is_enforced(output, rule):
    with pytest.raises(ContractViolation) as info:
        call_verify(returning(output), DRAFTS, Q, P, torch.Generator())
    assert info.value.rule == rule and "[fake]" in str(info.value)


def test_valid_outputs_pass():
    ok = torch.tensor([[1, 2, 3, 4], [4, -1, -1, -1]])
    assert call_verify(returning(ok), DRAFTS, Q, P, torch.Generator()) is ok


def test_exceptions_are_reported_with_the_inputs():
    def broken(d, q, p, *, generator):
        raise RuntimeError("CUDA error: illegal memory access")

    with pytest.raises(ContractViolation, match=r"\[boom\] broke rule 'does not raise': verify\(B=2, K=3, V=5"):
        call_verify(Model("boom", broken), DRAFTS, Q, P, torch.Generator())
