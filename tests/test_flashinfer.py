"""The FlashInfer adapter (``spectest.gpu.flashinfer``) driven through CPU stand-ins of each FlashInfer shape.

``tests/stand_ins/flashinfer`` is ``flashinfer.sampling.chain_speculative_sampling`` in plain torch, exact, with
FlashInfer's signatures (0.5; 0.6 and 0.7, which share one) and counters. In process, a fixture makes it the
installed ``flashinfer`` and picks its shape; through the plugin, ``PYTHONPATH`` and
``SPECTEST_FLASHINFER_STAND_IN`` do, and ``tests/stand_ins/flashinfer_on_cpu.py`` is the adapter without its
CUDA requirement. Every verdict through the plugin is read from the results file.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from spectest import rules
from spectest.gpu.flashinfer import FLASHINFER, FlashInferSampler, UnsupportedSignature
from spectest.protocol import COUNTERS, ContractViolation, Model, build_model, call_verify
from tests.runner_helpers import run_pytest

STAND_INS = Path(__file__).resolve().parent / "stand_ins"
ON_CPU = f"{STAND_INS / 'flashinfer_on_cpu.py'}:FLASHINFER"
ON_CPU_NAME = "flashinfer_on_cpu.py:FLASHINFER"
WORKING_SHAPES = ["0.5", "0.6", "0.7", "seed-offset-only", "bare-tensor"]


@pytest.fixture
def flashinfer_shape(monkeypatch) -> Iterator[Callable[[str], ModuleType]]:
    """``use(shape)``: the CPU stand-in becomes the installed ``flashinfer`` (whatever was imported before is
    put back afterwards), its ``chain_speculative_sampling`` the named shape; returns its sampling module."""
    saved = {name: sys.modules.pop(name) for name in ("flashinfer", "flashinfer.sampling") if name in sys.modules}
    monkeypatch.syspath_prepend(str(STAND_INS))
    try:
        sampling = importlib.import_module("flashinfer.sampling")
        assert Path(sampling.__file__).is_relative_to(STAND_INS), "a real flashinfer shadows the stand-in"

        def use(shape: str) -> ModuleType:
            monkeypatch.setattr(sampling, "chain_speculative_sampling", sampling.SHAPES[shape])
            return sampling

        yield use
    finally:
        for name in ("flashinfer", "flashinfer.sampling"):
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def adapter_model(adapter: FlashInferSampler) -> Model:
    return build_model("flashinfer-stand-in", "flashinfer-stand-in", adapter, adapter.verify)


def random_case(seed: int, batch: int = 16, k: int = 4, vocab: int = 9) -> tuple[torch.Tensor, ...]:
    """Drafts sampled from q, float64 q and p with some near-equal rows (so rows accept to every depth)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen, dtype=torch.float64), -1)
    p[: batch // 2, :k] = 0.9 * q[: batch // 2] + 0.1 * p[: batch // 2, :k]
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(batch, k)
    return drafts, q, p


def forced_case(k: int = 4, vocab: int = 6) -> tuple[torch.Tensor, ...]:
    """Row 0 accepts every draft (p = q = one-hot) and its bonus row is one-hot on token 5; row 1's third draft
    has p = 0, so it is rejected there and the correction is forced to token 4; its other drafts have p = q."""
    drafts = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    q = torch.nn.functional.one_hot(drafts, vocab).double()
    p = torch.zeros(2, k + 1, vocab, dtype=torch.float64)
    p[:, :k] = q
    p[1, 2] = torch.nn.functional.one_hot(torch.tensor(4), vocab).double()
    p[:, k, 5] = 1.0
    return drafts, q, p


@pytest.mark.parametrize("shape", WORKING_SHAPES)
def test_each_flashinfer_shape_gives_the_chain_output_and_counters_that_agree(flashinfer_shape, shape):
    """Through every shape the adapter returns int64 [B, K + 1] with the -1 padding kept, exactly the forced
    chain, and the counters FlashInfer's kernel gives: the emitted prefix, and the accepted drafts (row 1's
    rejected draft has p = 0, so no fresh uniform can pass it, and its later drafts have p = q)."""
    flashinfer_shape(shape)
    adapter = FlashInferSampler(requires_cuda=False)
    model = adapter_model(adapter)
    assert model.unavailable is None and COUNTERS in model.capabilities
    drafts, q, p = forced_case()
    out = call_verify(model, drafts, q, p, torch.Generator().manual_seed(0))
    assert out.dtype == torch.int64 and out.shape == (2, 5)
    assert out.tolist() == [[0, 1, 2, 3, 5], [3, 2, 4, -1, -1]]
    counters = adapter.spectest_counters()
    assert counters["emitted_drafts"].tolist() == [4, 2]
    assert counters["accepted_drafts"].tolist() == [4, 3]


@pytest.mark.parametrize("shape", WORKING_SHAPES)
def test_random_calls_pass_the_counters_check_and_replay_from_the_generator(flashinfer_shape, shape):
    """On random rows the contract's counters check passes call after call (the counters are zeroed for each
    call, not carried over), and the same generator state gives the same output and counters, including through
    the seed and offset the adapter draws for a function that takes no generator."""
    flashinfer_shape(shape)
    adapter = FlashInferSampler(requires_cuda=False)
    model = adapter_model(adapter)
    drafts, q, p = random_case(1)
    gen = torch.Generator().manual_seed(7)
    runs = []
    for _ in range(3):
        state = gen.get_state()
        first = call_verify(model, drafts, q, p, gen)
        counters = {name: t.clone() for name, t in adapter.spectest_counters().items()}
        gen.set_state(state)
        again = call_verify(model, drafts, q, p, gen)
        assert torch.equal(first, again)
        assert all(torch.equal(t, adapter.spectest_counters()[name]) for name, t in counters.items())
        runs.append(first)
    emitted = (runs[0] != -1).sum(1) - 1
    assert 0 < int(emitted.sum()) < emitted.numel() * 4, "the case should mix rejections and full acceptance"
    assert not all(torch.equal(runs[0], r) for r in runs[1:]), "successive calls should draw afresh"


def test_the_adapter_hands_flashinfer_its_own_conventions(flashinfer_shape, monkeypatch):
    """What the installed function receives: float32 contiguous probabilities (from strided float64 ones), int32
    drafts, zeroed int32 counters and the harness's generator itself."""
    sampling = flashinfer_shape("0.6")
    real = sampling.chain_speculative_sampling
    seen: list[dict] = []

    def chain_speculative_sampling(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num=None,
        maybe_output_emitted_draft_token_num=None,
        deterministic=True,
        generator=None,
        seed=None,
        offset=None,
    ):
        counters = (maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num)
        seen.append(
            {
                "probs": (draft_probs, target_probs),
                "ids": draft_token_ids,
                "counters": [t.clone() for t in counters],
                "randomness": (generator, seed, offset),
            }
        )
        return real(draft_probs, draft_token_ids, target_probs, *counters, deterministic, generator, seed, offset)

    monkeypatch.setattr(sampling, "chain_speculative_sampling", chain_speculative_sampling)
    drafts, q, p = random_case(2)
    strided = q.transpose(0, 1).contiguous().transpose(0, 1)
    gen = torch.Generator().manual_seed(3)
    FlashInferSampler(requires_cuda=False).verify(drafts, strided, p, generator=gen)
    (call,) = seen
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in call["probs"])
    assert call["ids"].dtype == torch.int32
    assert all(t.dtype == torch.int32 and t.shape == (16,) and not t.any() for t in call["counters"])
    assert call["randomness"][0] is gen and call["randomness"][1:] == (None, None)


def test_a_function_without_a_generator_gets_a_seed_and_offset_drawn_from_the_harness_generator(
    flashinfer_shape, monkeypatch
):
    sampling = flashinfer_shape("seed-offset-only")
    seen = []
    real = sampling.chain_speculative_sampling

    def chain_speculative_sampling(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num=None,
        maybe_output_emitted_draft_token_num=None,
        deterministic=True,
        seed=None,
        offset=None,
    ):
        seen.append((seed, offset))
        return real(draft_probs, draft_token_ids, target_probs, seed=seed, offset=offset)

    monkeypatch.setattr(sampling, "chain_speculative_sampling", chain_speculative_sampling)
    drafts, q, p = random_case(3)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    FlashInferSampler(requires_cuda=False).verify(drafts, q, p, generator=gen)
    assert not torch.equal(gen.get_state(), state), "the seed and offset must be drawn from the harness's generator"
    expected = torch.randint(0, 2**62, (2,), generator=torch.Generator().manual_seed(5)).tolist()
    assert [list(s) for s in seen] == [expected]


def test_a_doctored_emitted_counter_is_caught_row_by_row(flashinfer_shape):
    """The stand-in whose emitted counter is one too many on even rows (its tokens exact): the contract fails
    it by the counter rule, naming the row, the count and what the output shows."""
    flashinfer_shape("doctored-emitted")
    model = adapter_model(FlashInferSampler(requires_cuda=False))
    drafts, q, p = forced_case()
    with pytest.raises(ContractViolation) as info:
        call_verify(model, drafts, q, p, torch.Generator().manual_seed(0))
    assert info.value.rule == rules.COUNTED_EMITTED_DRAFTS
    assert "row 0: the counter says 5 drafts emitted, the output shows 4" in info.value.detail


def test_int64_counters_would_stay_zero_which_the_check_catches(flashinfer_shape, monkeypatch):
    """Why the adapter hands FlashInfer int32 counters: its kernel adds to their .int(), a copy for any other dtype,
    and the wrapper returns the tensors it was handed, so int64 counters come back zero; the check catches that."""
    flashinfer_shape("0.7")
    monkeypatch.setattr("spectest.gpu.flashinfer.COUNTER_DTYPE", torch.int64)
    model = adapter_model(FlashInferSampler(requires_cuda=False))
    drafts, q, p = forced_case()
    with pytest.raises(ContractViolation) as info:
        call_verify(model, drafts, q, p, torch.Generator().manual_seed(0))
    assert info.value.rule == rules.COUNTED_EMITTED_DRAFTS
    assert "row 0: the counter says 0 drafts emitted, the output shows 4" in info.value.detail


@pytest.mark.parametrize(
    "shape, named",
    [
        ("renamed-argument", "does not start with draft_probs, draft_token_ids, target_probs"),
        ("required-argument", "requires 'num_speculative_tokens', which the adapter does not supply"),
        ("no-generator", "takes neither generator= nor seed= and offset="),
    ],
)
def test_a_signature_the_adapter_cannot_drive_makes_it_unavailable_naming_the_mismatch(flashinfer_shape, shape, named):
    """An API change is named before any call: the model is unavailable (every property skips with the reason,
    the installed signature shown), and a direct call raises the same message, never a TypeError from inside."""
    flashinfer_shape(shape)
    adapter = FlashInferSampler(requires_cuda=False)
    reason = adapter_model(adapter).unavailable
    assert reason and named in reason and "chain_speculative_sampling(draft_probs" in reason
    drafts, q, p = forced_case()
    with pytest.raises(UnsupportedSignature, match=named):
        adapter.verify(drafts, q, p, generator=torch.Generator())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_the_registered_adapter_still_requires_cuda_with_a_flashinfer_installed(flashinfer_shape):
    flashinfer_shape("0.7")
    assert FLASHINFER.spectest_unavailable.startswith("'flashinfer' needs a CUDA GPU and none is available")
    assert FlashInferSampler(requires_cuda=False).spectest_unavailable is None


def stand_in_environment(shape: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(STAND_INS), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SPECTEST_FLASHINFER_STAND_IN": shape}


# The chain properties a chain verifier without logits, proposals, trees, blocks or ragged rows runs, but the one
# at V = 32000-256000 (20 s on CPU, and it exercises the stand-in's torch, not a kernel's tiles) and the speed
# property (it would time the stand-in).
CHAIN_PROPERTIES = [
    "test_sequences_follow_the_target",
    "test_every_row_and_position_is_exact",
    "test_rejection_discards_every_later_position",
    "test_all_accepted_then_bonus_from_its_own_row",
    "test_same_generator_state_gives_same_output",
    "test_inputs_are_not_modified",
    "test_tokens_per_call_follow_the_chain_model",
    "test_markov_tokens_per_pass_follow_the_exact_model",
]


def test_the_suite_passes_the_adapter_on_the_latest_flashinfer_signature(tmp_path):
    """The whole suite through the plugin at the quick budget, on the adapter over the exact stand-in with the
    latest FlashInfer's signature: every chain property passes (its counters checked after every call) and the rest
    skip for a capability the adapter lacks."""
    run = suite_on_stand_in(tmp_path, "0.7", ["-k", "not large_vocabularies"])
    passed = {prop for (model, prop), o in run.results.items() if o.outcome == "passed" and model == ON_CPU_NAME}
    assert passed == set(CHAIN_PROPERTIES), run.output[-3000:]
    header = next(line for line in run.output.splitlines() if "models:" in line)
    assert f"{ON_CPU_NAME} [counters, standard-rejection, strided-inputs]" in header


# What a signature changes is how the adapter hands FlashInfer its randomness: the per-position property sees every
# token the calls emit, and the same-generator one whether the seed and offset the adapter draws replay.
SIGNATURE_PROPERTIES = ["test_every_row_and_position_is_exact", "test_same_generator_state_gives_same_output"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["0.5", "seed-offset-only"])
def test_the_adapter_passes_on_the_other_flashinfer_signatures(tmp_path, shape):
    """0.5 takes a generator and no seed or offset; "seed-offset-only" takes the seed and offset the adapter draws
    and no generator: the two properties a signature can break pass on each (the whole suite runs on 0.7)."""
    run = suite_on_stand_in(tmp_path, shape, ["-k", " or ".join(SIGNATURE_PROPERTIES)])
    passed = {prop for (model, prop), o in run.results.items() if o.outcome == "passed" and model == ON_CPU_NAME}
    assert passed == set(SIGNATURE_PROPERTIES), run.output[-3000:]


def suite_on_stand_in(tmp_path, shape: str, selection: list[str]):
    """The suite (``selection`` of it) on the adapter over the stand-in with FlashInfer's ``shape``, at the quick
    budget: it exits 0 and every property passes or skips."""
    options = ["--spec-budget", "quick", "-m", "not spec_speed", "--spec-no-shrink", *selection]
    run = run_pytest(["--spec-model", ON_CPU, *options, "-n", "0"], tmp_path, env=stand_in_environment(shape))
    assert run.returncode == 0, run.output[-3000:]
    assert all(o.outcome in ("passed", "skipped") for o in run.results.values()), run.output[-3000:]
    return run


def test_a_doctored_counter_fails_the_suite_by_the_counter_rule(tmp_path):
    """The stand-in whose tokens are exact but whose emitted counter is off by one on even rows fails each
    property it reaches by the counter rule, read from the results file, and the harness never crashes."""
    chosen = ["test_rejection_discards_every_later_position", "test_every_row_and_position_is_exact"]
    run = run_pytest(
        ["--spec-model", ON_CPU, "--spec-budget", "quick", "-n", "0", "--spec-no-shrink", "-k", " or ".join(chosen)],
        tmp_path,
        env=stand_in_environment("doctored-emitted"),
    )
    assert {prop for _, prop in run.results} == set(chosen), run.output[-3000:]
    for prop in chosen:
        outcome = run.results[(ON_CPU_NAME, prop)]
        assert outcome.outcome == "failed", run.explain(ON_CPU_NAME, prop)
        failure = outcome.failure or {}
        assert (failure.get("kind"), failure.get("rule")) == ("rule", rules.COUNTED_EMITTED_DRAFTS), run.explain(
            ON_CPU_NAME, prop
        )
    assert run.returncode == 1 and not run.document["harness_errors"], run.output[-3000:]
