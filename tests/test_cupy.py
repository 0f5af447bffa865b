"""reference-cupy (spectest.gpu.cupy): its host wrapper's launches, and its CUDA kernel, held to the algorithm.

Without a GPU: every launch the wrapper plans passes each tensor as it is (pointers at storage offsets, the
strides of dims 0 and 1) to the instantiation of its dtype and variant; inputs outside the protocol are refused
before anything launches; the uniforms are the Triton kernel's. The kernel itself runs on the CPU
(tests/cuda_on_cpu: every CUDA thread a thread, built with AddressSanitizer, and with ThreadSanitizer for
shared-memory races) through the wrapper, and must emit exactly what tests/chain_emulation.py's algorithm
emits for the same uniforms, every dtype, every variant, strided and unaligned rows, an empty residual, ids
outside V, K past one ballot, rows of several tiles. With CuPy and a GPU the compiled kernel must do the same,
and agree with the Triton kernel token for token.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from spectest.gpu import cupy as cupy_kernel
from spectest.gpu import triton as triton_kernel
from spectest.gpu.chain_inputs import (
    BROKEN_VARIANTS,
    CORRECT,
    UNIFORM_REUSED,
)
from spectest.gpu.cupy import PARAMETERS, THREADS, CupyReference, Launch, launch_with_cupy, plan_launch
from spectest.sampling import make_generator
from tests.chain_emulation import cases_for, emulate_chain, kernel_case
from tests.cuda_on_cpu import build_driver, compiler, cpu_launcher
from tests.runner_helpers import once_per_run

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
ON_GPU = torch.cuda.is_available() and cupy_kernel.CUPY_REFERENCE.spectest_unavailable is None


class Recorder:
    """A launcher that records each launch and writes -1s where the kernel would write tokens."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []

    def __call__(self, launch: Launch) -> None:
        self.launches.append(launch)
        launch.tensors["out"].fill_(-1)


@pytest.fixture(scope="session")
def address_driver(tmp_path_factory):
    if compiler() is None:
        pytest.skip("no C++ compiler to build the CUDA-on-CPU driver with")
    return once_per_run(tmp_path_factory, "cuda_on_cpu_address", lambda folder: build_driver(folder, "address"))


@pytest.mark.parametrize("layout", ["contiguous", "padded", "every_other_row"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_launch_passes_the_tensors_as_they_are(dtype, layout):
    case = kernel_case(3, 4, 33, dtype, seed=1, layout=layout)
    recorder = Recorder()
    out = CupyReference(UNIFORM_REUSED, launcher=recorder).verify(
        case.drafts, case.q, case.p, generator=make_generator(1)
    )
    (launch,) = recorder.launches
    name = str(dtype).removeprefix("torch.")
    assert launch.name_expression == f"spectest_chain<{cupy_kernel.ELEMENT_TYPES[name]}, {UNIFORM_REUSED}>"
    assert (launch.grid, launch.block) == ((3, 1, 1), (THREADS, 1, 1))
    arguments = launch.arguments
    assert list(arguments) == [parameter for parameter, _ in PARAMETERS]
    for key, tensor in (("d", case.drafts), ("q", case.q), ("p", case.p)):
        assert arguments[key if key != "d" else "drafts"] == tensor.data_ptr(), "a view is passed, never a copy"
        assert (arguments[f"{key}_row"], arguments[f"{key}_pos"]) == tensor.stride()[:2]
    assert (arguments["k"], arguments["vocab"]) == (4, 33)
    assert arguments["out"] == out.data_ptr() and out.shape == (3, 5) and out.dtype == torch.int64
    u, v = launch.tensors["u"], launch.tensors["v"]
    assert arguments["u"] == u.data_ptr() and u.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert arguments["v"] == v.data_ptr() and v.dtype == torch.float64 and v.shape == (3,)


def test_a_strided_vocabulary_is_copied_and_the_copy_passed():
    case = kernel_case(2, 3, 40, torch.float32, seed=2)
    q, p = case.q.transpose(1, 2).contiguous().transpose(1, 2), case.p.transpose(1, 2).contiguous().transpose(1, 2)
    recorder = Recorder()
    CupyReference(launcher=recorder).verify(case.drafts, q, p, generator=make_generator(2))
    (launch,) = recorder.launches
    assert launch.tensors["p"].stride(-1) == 1 and launch.arguments["p"] != p.data_ptr()
    assert torch.equal(launch.tensors["p"], p) and launch.arguments["p_pos"] == 40


def test_the_kernels_parameters_are_the_ones_the_launch_passes():
    """The CUDA source's parameter list, read from chain.cu, is PARAMETERS (names, order, C types)."""
    source = cupy_kernel.CUDA_SOURCE.read_text()
    declaration = source[source.index("spectest_chain(") + len("spectest_chain(") :].split(")")[0]
    found = []
    for parameter in " ".join(declaration.split()).split(", "):
        ctype, name = parameter.replace("__restrict__", "").rsplit(None, 1)
        kind = "pointer" if "*" in ctype else {"long long": "int64", "int": "int32"}[ctype.strip()]
        found.append((name, kind))
    assert found == list(PARAMETERS)
    assert re.search(rf"#define SPECTEST_THREADS {THREADS}\b", source)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d, q, p: (d.unsqueeze(0), q, p),
        lambda d, q, p: (d, q[:, :-1], p),
        lambda d, q, p: (d, q, p[..., :-1]),
        lambda d, q, p: (d, q.double(), p),
        lambda d, q, p: (d, q.to(torch.int32), p.to(torch.int32)),
        lambda d, q, p: (d.float(), q, p),
    ],
    ids=["ids-3d", "q-short", "p-narrow", "mixed-dtypes", "integer-probs", "float-ids"],
)
def test_inputs_outside_the_protocol_are_refused_before_any_launch(mangle):
    case = kernel_case(2, 3, 20, torch.float32, seed=3)
    recorder = Recorder()
    with pytest.raises(ValueError):
        CupyReference(launcher=recorder).verify(*mangle(case.drafts, case.q, case.p), generator=make_generator(3))
    assert recorder.launches == []


def test_cpu_tensors_never_reach_cupy():
    case = kernel_case(2, 3, 20, torch.float32, seed=4)
    launch = plan_launch(case.drafts, case.q, case.p, case.u, case.v, torch.empty(2, 4, dtype=torch.int64), CORRECT)
    with pytest.raises(ValueError, match="--spec-device cuda"):
        launch_with_cupy(launch)


def test_an_empty_batch_launches_nothing():
    recorder = Recorder()
    empty = torch.zeros(0, 3, 10)
    out = CupyReference(launcher=recorder).verify(
        torch.zeros(0, 2, dtype=torch.int64), empty[:, :2], empty, generator=make_generator(0)
    )
    assert out.shape == (0, 3) and recorder.launches == []


def test_it_says_why_it_cannot_run_and_how_to_install_it():
    reason = cupy_kernel.CUPY_REFERENCE.spectest_unavailable
    if torch.cuda.is_available() and reason is None:
        pytest.skip("CuPy and a GPU are here")
    assert reason is not None and ("'cupy' package is not installed" in reason or "CUDA GPU" in reason), reason
    assert "spectest[cuda12]" in reason and "spectest[cuda13]" in reason


def test_it_draws_the_triton_kernels_uniforms_from_the_callers_generator():
    """u then v from the caller's generator, in the order spectest.gpu.chain_inputs.draw_uniforms draws them for
    both kernels (tests/test_triton.py holds the Triton kernel to the emulation on those draws), and nothing else."""
    case = kernel_case(5, 4, 30, torch.bfloat16, seed=5)
    recorder = Recorder()
    generator = make_generator(55)
    CupyReference(launcher=recorder).verify(case.drafts, case.q, case.p, generator=generator)
    expected = make_generator(55)  # the order both kernels draw in: u [B, K], then v [B] (float64)
    u = torch.rand((5, 4), generator=expected, dtype=torch.float32)
    v = torch.rand((5,), generator=expected, dtype=torch.float64)
    assert torch.equal(recorder.launches[0].tensors["u"], u) and torch.equal(recorder.launches[0].tensors["v"], v)
    assert torch.equal(generator.get_state(), expected.get_state()), "it draws nothing else"


def test_the_broken_variants_are_the_triton_kernels_ones():
    assert set(cupy_kernel.BROKEN) == set(triton_kernel.BROKEN) == set(BROKEN_VARIANTS)
    for name, bug in BROKEN_VARIANTS.items():
        assert getattr(cupy_kernel, name) is cupy_kernel.BROKEN[name] and cupy_kernel.BROKEN[name].bug == bug
    assert cupy_kernel.CUPY_REFERENCE.bug == CORRECT
    assert cupy_kernel.CUPY_REFERENCE.spectest_dtypes == ("float32", "float64", "bfloat16", "float16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cuda_kernel_on_the_cpu_emits_what_the_algorithm_emits(dtype, address_driver, tmp_path):
    for bug, cases in cases_for(dtype).items():
        for number, (batch, k, vocab, layout, kind) in enumerate(cases):
            case = kernel_case(batch, k, vocab, dtype, seed=100 + 10 * bug + number, layout=layout, kind=kind)
            model = CupyReference(bug, launcher=cpu_launcher(address_driver, tmp_path))
            got = model.verify(case.drafts, case.q, case.p, generator=make_generator(case.seed)).numpy()
            want = emulate_chain(case.drafts, case.q, case.p, case.u, case.v, bug)
            assert np.array_equal(got, want), f"variant {bug}, {layout} {kind}:\n{got}\nexpected\n{want}"


@pytest.mark.cost(20)
def test_the_cuda_kernel_on_the_cpu_has_no_shared_memory_race(tmp_path_factory, tmp_path):
    """ThreadSanitizer over the kernel's block: several tiles (every barrier of the scan), two ballots, the
    half-precision row sums, an empty residual's second sweep."""
    if compiler() is None:
        pytest.skip("no C++ compiler to build the CUDA-on-CPU driver with")
    driver = once_per_run(tmp_path_factory, "cuda_on_cpu_thread", lambda folder: build_driver(folder, "thread"))
    for batch, k, vocab, dtype, kind in [
        (2, 2, 9000, torch.float32, "dirichlet"),
        (2, 33, 40, torch.bfloat16, "half_of_q"),
    ]:
        case = kernel_case(batch, k, vocab, dtype, seed=7, kind=kind)
        got = CupyReference(launcher=cpu_launcher(driver, tmp_path)).verify(
            case.drafts, case.q, case.p, generator=make_generator(case.seed)
        )
        assert np.array_equal(got.numpy(), emulate_chain(case.drafts, case.q, case.p, case.u, case.v, CORRECT))


def test_fp16_is_widened_exactly_off_the_device(address_driver, tmp_path):
    """chain.cu's fp16 conversion where no cvt.f32.f16 instruction is (the CPU runs): every bit pattern, as torch."""
    import subprocess

    table = tmp_path / "fp16.bin"
    subprocess.run([str(address_driver), "fp16-table", str(table)], check=True, timeout=60)
    widened = torch.from_numpy(np.fromfile(table, dtype=np.float32))
    expected = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    expected = torch.cat([expected[32768:], expected[:32768]])  # bit patterns 0..65535 in order
    nan = expected.isnan()
    assert torch.equal(widened.isnan(), nan) and torch.equal(
        widened[~nan].view(torch.int32), expected[~nan].view(torch.int32)
    )


@pytest.mark.skipif(not ON_GPU, reason="needs CuPy and a CUDA GPU (.ci/gpu-check runs this on one)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_compiled_kernel_emits_what_the_algorithm_emits(dtype):
    for bug in (CORRECT, *BROKEN_VARIANTS.values()):
        for layout, vocab in (("contiguous", 32000), ("padded", 1025), ("every_other_row", 129)):
            case = kernel_case(256, 5, vocab, dtype, seed=bug, layout=layout, device="cuda")
            model = CupyReference(bug)
            got = model.verify(case.drafts, case.q, case.p, generator=make_generator(case.seed, "cuda")).cpu().numpy()
            want = emulate_chain(case.drafts, case.q, case.p, case.u, case.v, bug)
            assert np.array_equal(got, want), f"variant {bug}, {layout}: {np.argwhere(got != want)[:5]}"


@pytest.mark.skipif(not ON_GPU, reason="needs CuPy and a CUDA GPU (.ci/gpu-check runs this on one)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cupy_and_triton_kernels_agree_token_for_token(dtype):
    case = kernel_case(2048, 4, 32000, dtype, seed=11, device="cuda")
    tokens = [
        model.verify(case.drafts, case.q, case.p, generator=make_generator(12, "cuda")).cpu()
        for model in (cupy_kernel.CUPY_REFERENCE, triton_kernel.TRITON_REFERENCE)
    ]
    assert torch.equal(*tokens), (tokens[0] != tokens[1]).nonzero()[:5]
