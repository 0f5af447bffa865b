"""The exact output contract: every rule is enforced and names the implementation."""

from __future__ import annotations

import pytest
import torch

from spectest.protocol import ContractViolation, Model, build_model, call_verify

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


# Counters (spectest_counters): DRAFTS/Q/P with the output below emit 3 drafts in row 0 and none in row 1.
COUNTED = torch.tensor([[1, 2, 3, 4], [4, -1, -1, -1]])


def counting(counters, output=COUNTED):
    return Model("counts", lambda d, q, p, *, generator: output, counters=lambda: counters)


@pytest.mark.parametrize(
    "counters",
    [
        {"emitted_drafts": torch.tensor([3, 0])},
        {"emitted_drafts": torch.tensor([3, 0], dtype=torch.int32), "accepted_drafts": torch.tensor([3, 0])},
        {"emitted_drafts": torch.tensor([3, 0]), "accepted_drafts": torch.tensor([3, 3], dtype=torch.int32)},
        None,  # the call reported no counters
    ],
)
def test_counters_that_agree_with_the_output_pass(counters):
    assert call_verify(counting(counters), DRAFTS, Q, P, torch.Generator()) is COUNTED


@pytest.mark.parametrize(
    "counters, rule, detail",
    [
        (
            {"emitted_drafts": torch.tensor([3, 1])},
            "the emitted-drafts counter equals the accepted prefix the output shows",
            "row 1: the counter says 1 drafts emitted, the output shows 0: [4, -1, -1, -1]",
        ),
        (
            {"emitted_drafts": torch.tensor([4, 0])},  # counting the extra token as a draft
            "the emitted-drafts counter equals the accepted prefix the output shows",
            "row 0: the counter says 4 drafts emitted, the output shows 3",
        ),
        (
            {"emitted_drafts": torch.tensor([3, 0]), "accepted_drafts": torch.tensor([2, 0])},
            "the accepted-drafts counter lies between the emitted drafts and the row's draft count",
            "row 0: the counter says 2 drafts accepted, but the output shows 3 emitted and the row carries 3",
        ),
        (
            {"emitted_drafts": torch.tensor([3, 0]), "accepted_drafts": torch.tensor([3, 4])},
            "the accepted-drafts counter lies between the emitted drafts and the row's draft count",
            "row 1: the counter says 4 drafts accepted",
        ),
        (
            {"accepted_drafts": torch.tensor([3, 0])},
            "spectest_counters returns int [B] tensors",
            "got ['accepted_drafts']",
        ),
        ({"emitted_drafts": torch.tensor([3, 0]), "emitted": torch.tensor([3, 0])}, "spectest_counters returns", "got"),
        (
            {"emitted_drafts": torch.tensor([3.0, 0.0])},
            "spectest_counters returns",
            "'emitted_drafts' is (2,) torch.float32",
        ),
        ({"emitted_drafts": torch.tensor([3])}, "spectest_counters returns", "'emitted_drafts' is (1,) torch.int64"),
        ({"emitted_drafts": [3, 0]}, "spectest_counters returns", "'emitted_drafts' is list"),
        (torch.tensor([3, 0]), "spectest_counters returns", "got Tensor"),
    ],
)
def test_counters_that_disagree_with_the_output_break_a_counter_rule(counters, rule, detail):
    with pytest.raises(ContractViolation) as info:
        call_verify(counting(counters), DRAFTS, Q, P, torch.Generator())
    assert info.value.rule.startswith(rule) and detail in info.value.detail and "[counts]" in str(info.value)


def test_a_ragged_rows_accepted_counter_is_bounded_by_its_own_drafts():
    """With num_draft_tokens, a row carrying 1 draft cannot have 2 accepted (it emitted 1 token, no draft)."""
    model = Model(
        "counts",
        lambda d, q, p, *, generator, num_draft_tokens: COUNTED,
        counters=lambda: {"emitted_drafts": torch.tensor([3, 0]), "accepted_drafts": torch.tensor([3, 2])},
    )
    with pytest.raises(ContractViolation, match=r"row 1: the counter says 2 drafts accepted.*carries 1"):
        call_verify(model, DRAFTS, Q, P, torch.Generator(), num_draft_tokens=torch.tensor([3, 1]))


def test_a_counters_method_that_raises_is_the_implementations_failure():
    def broken():
        raise RuntimeError("counter buffer freed")

    model = Model("counts", lambda d, q, p, *, generator: COUNTED, counters=broken)
    with pytest.raises(ContractViolation, match="broke rule 'does not raise': spectest_counters\\(B=2, K=3"):
        call_verify(model, DRAFTS, Q, P, torch.Generator())


def test_counters_are_discovered_from_the_model_object_and_absent_otherwise():
    class Counting:
        def verify(self, d, q, p, *, generator):
            return COUNTED

        def spectest_counters(self):
            return {"emitted_drafts": torch.tensor([3, 0])}

    counting_model = build_model("c", "c", Counting(), Counting().verify)
    plain = build_model("p", "p", returning(COUNTED).verify, returning(COUNTED).verify)
    assert "counters" in counting_model.capabilities and counting_model.counters is not None
    assert "counters" not in plain.capabilities and plain.counters is None
