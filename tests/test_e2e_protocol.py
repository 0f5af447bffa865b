"""The engine protocol and its contract (spectest.e2e.protocol): every broken call names the rule it breaks."""

from __future__ import annotations

import pytest
import torch

from spectest import rules
from spectest.e2e.protocol import EngineModel, build_engine, call_generate, call_logits
from spectest.protocol import ContractViolation
from spectest.sampling_params import SamplingParams


class _Fake:
    vocab_size = 5

    def __init__(self, out, logits=None):
        self.out, self.logits = out, logits

    def generate(self, prompts, params, max_new_tokens, seed):
        if isinstance(self.out, Exception):
            raise self.out
        return self.out

    def target_logits(self, sequences):
        return self.logits


@pytest.mark.parametrize(
    "out, rule",
    [
        ([[1, 2]], rules.E2E_OUTPUT),  # one token short: stopped early
        ([[1, 2, 9]], rules.E2E_OUTPUT),  # id out of range
        ([[1, 2, 3], [1, 2, 3]], rules.E2E_OUTPUT),  # one output too many
        (ZeroDivisionError("boom"), rules.DOES_NOT_RAISE),
    ],
)
def test_the_engine_contract_names_the_rule_broken(out, rule):
    engine = build_engine("fake", "fake", _Fake(out))
    with pytest.raises(ContractViolation) as caught:
        call_generate(engine, [[0]], SamplingParams.build(1), 3, 0)
    assert caught.value.rule == rule and "fake" in str(caught.value)


def test_nan_logits_break_the_contract():
    engine = build_engine("fake", "fake", _Fake([[1]], torch.full((1, 2, 5), float("nan"))))
    with pytest.raises(ContractViolation, match="NaN"):
        call_logits(engine, "target", [[0, 1]])


def test_an_object_without_the_protocol_is_refused():
    with pytest.raises(ValueError, match="needs a generate method"):
        build_engine("x", "x", object())
    assert isinstance(build_engine("fake", "fake", _Fake([[1]])), EngineModel)


def test_an_engine_whose_vocab_size_raises_breaks_the_protocol_not_the_harness():
    class NoVocab(_Fake):
        @property
        def vocab_size(self):
            raise OSError("checkpoint missing")

    engine = build_engine("fake", "fake", NoVocab([[1]]))
    with pytest.raises(ContractViolation, match=r"vocab_size.*raised OSError: checkpoint missing") as caught:
        call_generate(engine, [[0]], SamplingParams.build(1), 1, 0)
    assert caught.value.rule == rules.DOES_NOT_RAISE
