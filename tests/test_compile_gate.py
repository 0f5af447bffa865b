"""The compile gate (spectest.gpu.compile_gate): every shipped kernel compiles for sm_80 and sm_90 without a GPU,
and a kernel that does not compile fails it with the compiler's own message.

The Triton kernel that reached an H200 before the gate existed (tests/planted_kernels/triton_chain_unfixed.py,
verbatim) fails here with both errors that GPU run met, one after the other, while Triton's interpreter ran it
in every CI run; a CUDA C++ source with a planted error fails with NVRTC's message; a compiler that crashes
fails only the items its process had not finished. This module sets TRITON_INTERPRET=1 (as tests/test_triton.py
does) before anything compiles: the gate's children must compile regardless.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # what the Triton tests set; the gate's children drop it
pytest.importorskip("triton")

from spectest.gpu import cupy as cupy_kernel
from spectest.gpu.compile_gate import (
    ARCHS,
    DTYPES,
    FAILED,
    OK,
    SPLIT_KERNELS,
    SUITE_BLOCKS,
    VARIANTS,
    covering_items,
    nvrtc_item,
    render,
    run_gate,
    triton_item,
)

REPO = Path(__file__).resolve().parent.parent
PLANTED = REPO / "tests" / "planted_kernels" / "triton_chain_unfixed.py"
# Where the test extra installs NVRTC (cuda-bindings, nvidia-cuda-nvrtc-cu12): there, a skipped item is a failure.
NVRTC_EXPECTED = platform.system() == "Linux" and platform.machine() == "x86_64"
# The unfixed kernel's own parameters (before the fix it took no draft-id strides and one BUG constant).
UNFIXED_SIGNATURE = {
    **{"drafts": "*i64", "q_ptr": "*fp32", "p_ptr": "*fp32", "u_ptr": "*fp32", "v_ptr": "*fp64", "out": "*i64"},
    **{name: "i32" for name in ("vocab", "q_row", "q_pos", "p_row", "p_pos")},
    **{"K": "constexpr", "BLOCK": "constexpr", "BUG": "constexpr"},
}


def unfixed(attr: str) -> object:
    base = triton_item(f"{PLANTED}:{attr}", "correct", "float32", 4, 32000, 90, 1024)
    return replace(base, signature=UNFIXED_SIGNATURE, constexprs={"K": 4, "BLOCK": 1024, "BUG": 0}, divisible=())


def test_every_shipped_kernel_compiles_for_sm80_and_sm90():
    items = covering_items()
    results = run_gate(items, jobs=2)
    assert len(results) == len(items)
    skipped_nvrtc = [r for r in results if r.status == "skipped" and r.label.startswith("nvrtc")]
    if skipped_nvrtc and not NVRTC_EXPECTED:
        pytest.skip(f"no NVRTC on this platform: {skipped_nvrtc[0].message}")
    assert all(r.status == OK for r in results), render([r for r in results if r.status != OK])
    # Coverage: every variant x dtype x architecture through both compilers; K at 1, 4 and 16; every BLOCK.
    for compiler in ("nvrtc", "triton"):
        covered = {(i.variant, i.dtype, i.arch) for i in items if i.compiler == compiler}
        assert covered == {(v, d, a) for v in VARIANTS for d in DTYPES for a in ARCHS}, compiler
    triton = [i for i in items if i.compiler == "triton"]
    assert {i.constexprs["K"] for i in triton} == {1, 4, 16}
    assert {i.constexprs["BLOCK"] for i in triton} == set(SUITE_BLOCKS)
    assert any(i.constexprs.get("d_row") == 1 for i in triton), "K = 1 specialises d_row = 1 as a launch does"
    assert {"vocab", "q_ptr", "p_ptr"} <= {name for i in triton for name in i.divisible}
    split = {(i.kernel, i.variant, i.dtype, i.arch) for i in triton if i.kernel in SPLIT_KERNELS}
    assert split == {
        (s, v, d, a)
        for s in SPLIT_KERNELS
        for v, d in [*((v, "float32") for v in VARIANTS), ("correct", "float64")]
        for a in ARCHS
    }
    # What came out is a real kernel for each architecture: PTX and a cubin of plausible sizes, no spills.
    for result in results:
        assert 10_000 < result.sizes["ptx"] < 2_000_000 and 10_000 < result.sizes["cubin"] < 1_000_000, result
    nvrtc = [r for r in results if r.label.startswith("nvrtc")]
    assert all(0 < r.sizes["registers"] <= 255 for r in nvrtc), [r.sizes for r in nvrtc]
    by_arch = {arch: {r.sizes["cubin"] for r in results if r.label.endswith(f"sm_{arch}")} for arch in ARCHS}
    assert by_arch[80] != by_arch[90], "sm_80 and sm_90 cubins should differ"


def test_the_triton_kernel_that_reached_the_gpu_fails_with_both_of_its_errors():
    """The unfixed kernel, then the same kernel with its first error worked around: the gate meets, on a CPU,
    exactly the two errors the H200 run met."""
    first, second = run_gate([unfixed("_kernel"), unfixed("with_constexpr_globals")], jobs=2)
    assert first.status == FAILED and "Cannot access global variable RESIDUAL_FROM_POSITION_0" in first.message
    assert second.status == FAILED and "Loop-carried variable p has initial type fp32" in second.message, second


def test_a_cuda_source_with_a_planted_error_fails_with_nvrtcs_message(tmp_path):
    source = cupy_kernel.CUDA_SOURCE.read_text()
    planted = tmp_path / "chain_planted.cu"
    assert "const double goal = uniform * total;" in source
    planted.write_text(source.replace("const double goal = uniform * total;", "const double goal = uniform * totl;"))
    bad, good = run_gate(
        [
            nvrtc_item(str(planted), "correct", "bfloat16", 90),
            nvrtc_item(str(cupy_kernel.CUDA_SOURCE), "correct", "bfloat16", 90),
        ],
        jobs=1,
    )
    if bad.status == "skipped" and not NVRTC_EXPECTED:
        pytest.skip(bad.message)
    assert bad.status == FAILED and 'identifier "totl" is undefined' in bad.message, bad
    assert good.status == OK, good  # one item's failure is its own


def test_a_crashing_compiler_fails_the_items_it_had_not_finished(tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import os\n\ndef kernel():\n    os._exit(7)\n")
    items = [triton_item(f"{crash}:kernel", "correct", "float32", 4, 32000, 90, 1024)]
    items += [nvrtc_item(str(cupy_kernel.CUDA_SOURCE), "correct", "float32", 80)]
    crashed, after = run_gate(items, jobs=1)
    assert crashed.status == FAILED and "exit 7" in crashed.message, crashed
    assert after.status == FAILED and "exit 7" in after.message, after


def test_the_gate_runs_as_a_module_and_lists_its_items():
    done = subprocess.run(
        [sys.executable, "-m", "spectest.gpu.compile_gate", "--list"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    listed = done.stdout.splitlines()
    assert len(listed) == len(covering_items()) and "nvrtc chain.cu id_past_v float16 sm_80" in listed
