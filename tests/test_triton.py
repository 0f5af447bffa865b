"""The fused Triton kernel under the gate, run by Triton's CPU interpreter (no GPU needed).

The interpreter runs each program in Python (milliseconds each), so these tests use one small
case replicated over up to 1500 rows: the per-position distributions of the correct kernel must
match the target exactly (chi-square through the harness's engine at 1e-4, TV 0.1 at power 0.99), and
each deliberately broken kernel must fail: residual from position 0 and the acceptance uniform
reused statistically (the e-process stops them after a few hundred rows), an id past V through
the exact output contract. Beside the statistics, an exact check: for the same inputs and uniforms the
kernel emits exactly what tests/chain_emulation.py's algorithm emits, every variant, every dtype it
declares (bf16 and fp16 normalised by their row sums), strided and unaligned rows, an empty residual, ids
outside V (the CUDA kernel of reference-cupy is held to the same emulation in tests/test_cupy.py, which
makes the two kernels agree token for token). With CUDA the same tests run the compiled kernel on CUDA
tensors; the whole suite runs on it too: ``pytest --spec-model reference-triton --spec-device cuda``.
Whether it compiles for a GPU at all is tests/test_compile_gate.py's question: the interpreter runs
kernels the compiler rejects.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is imported: set it first
pytest.importorskip("triton")

from spectest.protocol import PAD, ContractViolation, Model, call_verify
from spectest.sampling import RepeatedCategorical, make_generator
from spectest.statistics.checks import DistributionCheck
from spectest.suite.positions import reach_probabilities
from tests.chain_emulation import cases_for, emulate_chain, kernel_case

ROWS, K, V = 1500, 3, 12
BATCH = 250  # rows per kernel call: the checks look after each, and a broken kernel stops early
ALPHA = 1e-4
TOLERANCE = 0.1  # TV every check detects with power 0.99 (the reused uniform moves about that much)
# On a GPU machine the same kernel runs on CUDA tensors (Triton compiles it); otherwise the interpreter.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def case() -> tuple[np.ndarray, np.ndarray]:
    """Distinct p and q at every position, zeros in p, and draft/target ratios far from 1."""
    rng = np.random.default_rng(0)
    target = rng.dirichlet(np.full(V, 0.4), size=K + 1)
    target[:, :2] = 0.0
    target /= target.sum(-1, keepdims=True)
    draft = 0.3 * target[:K] + 0.7 * rng.dirichlet(np.ones(V), size=K)
    return target, draft


def run_kernel(name: str, rows: int, seed: int) -> np.ndarray:
    from spectest.gpu import triton as triton_reference

    kernel = triton_reference.TRITON_REFERENCE if name == "correct" else triton_reference.BROKEN[name]
    target, draft = case()
    p = torch.as_tensor(target, dtype=torch.float32, device=DEVICE).repeat(rows, 1, 1)
    q = torch.as_tensor(draft, dtype=torch.float32, device=DEVICE).repeat(rows, 1, 1)
    drafter = RepeatedCategorical(torch.as_tensor(draft, device=DEVICE))
    drafts = drafter.sample(rows, make_generator(seed, DEVICE)).reshape(rows, K)
    emitted = call_verify(Model(f"triton:{name}", kernel.verify), drafts, q, p, make_generator(seed + 1, DEVICE))
    return emitted.cpu().numpy()


def exactness(name: str):
    """The per-position check of ``name``'s kernel, sampled in batches of BATCH rows up to ROWS:
    the anytime-valid e-process stops a broken kernel after a few batches."""
    target, draft = case()
    check = DistributionCheck(
        "triton per-position",
        target,
        alpha=ALPHA,
        tolerance=TOLERANCE,
        min_draws=BATCH,
        max_draws=ROWS,
        reach=reach_probabilities(target[None], draft[None])[0],
    )
    while not check.done:
        rows = check.next_batch(BATCH)
        emitted = run_kernel(name, rows, seed=check.draws)
        counts = np.zeros((K + 1, V), dtype=np.int64)
        for slot in range(K + 1):
            tokens = emitted[:, slot]
            counts[slot] = np.bincount(tokens[tokens != PAD], minlength=V)
        check.add(counts, rows)
        if check.impossible() is not None:
            break
    return check.result(), check.impossible()


def test_triton_kernel_is_exact():
    result, impossible = exactness("correct")
    assert impossible is None and result.passed and result.draws == result.planned_draws, result.summary()


@pytest.mark.parametrize("bug", ["residual_from_position_0", "uniform_reused"])
def test_broken_triton_kernels_fail_the_distribution_check(bug):
    result, impossible = exactness(bug)
    assert impossible is not None or not result.passed, f"{bug} passed:\n{result.summary()}"


def test_triton_kernel_with_an_id_past_v_breaks_the_contract():
    with pytest.raises(ContractViolation, match="ids lie in \\[0, V\\)"):
        run_kernel("id_past_v", BATCH, seed=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_triton_kernel_emits_what_the_algorithm_emits(dtype):
    from spectest.gpu import triton as triton_reference

    assert str(dtype).removeprefix("torch.") in triton_reference.TRITON_REFERENCE.spectest_dtypes
    for bug, cases in cases_for(dtype).items():
        for number, (batch, k, vocab, layout, kind) in enumerate(cases):
            case = kernel_case(
                batch, k, vocab, dtype, seed=100 + 10 * bug + number, layout=layout, kind=kind, device=DEVICE
            )
            model = triton_reference.TritonReference(bug)
            got = model.verify(case.drafts, case.q, case.p, generator=make_generator(case.seed, DEVICE)).cpu().numpy()
            want = emulate_chain(case.drafts, case.q, case.p, case.u, case.v, bug)
            assert np.array_equal(got, want), f"variant {bug}, {layout} {kind}:\n{got}\nexpected\n{want}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_split_triton_kernels_emit_what_the_algorithm_emits(dtype):
    """The split kernels (a program per row and slice for the sums, a program per row for the search) on every
    variant's cases, at slices of 2 and 6 tiles of 16 cells and at 2 slices of whole 1024-cell tiles (fewer tiles than
    slices asked: one slice a tile): the same tokens as the algorithm, as the one-program kernel emits."""
    from spectest.gpu import triton as triton_reference

    for bug, cases in cases_for(dtype).items():
        for number, (batch, k, vocab, layout, kind) in enumerate(cases):
            case = kernel_case(
                batch, k, vocab, dtype, seed=100 + 10 * bug + number, layout=layout, kind=kind, device=DEVICE
            )
            want = emulate_chain(case.drafts, case.q, case.p, case.u, case.v, bug)
            for block, slices in ((16, 3), (16, 7), (1024, 2)):
                model = triton_reference.TritonReference(bug, block=block, slices=slices)
                generator = make_generator(case.seed, DEVICE)
                got = model.verify(case.drafts, case.q, case.p, generator=generator).cpu().numpy()
                assert np.array_equal(got, want), f"variant {bug}, {layout} {kind}, {slices} slices:\n{got}\n{want}"


def test_split_launches_cut_rows_into_whole_tiles_and_the_interpreter_takes_one_program():
    from spectest.gpu.triton import slice_count, split_launch

    assert split_launch(3, 1500, 16) == (3, 512)  # 94 tiles: 32 a slice, the last one shorter
    assert split_launch(7, 37, 16) == (3, 16)  # 3 tiles: one a slice, no empty slice
    assert split_launch(8, 32000, 1024) == (8, 4096)
    assert slice_count(64, 32000, 1024, torch.device("cpu")) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_split_search_past_the_last_slice_keeps_to_a_cell_with_weight(dtype):
    """Uniforms of 1 (past any draw's: a goal a float64 rounding can reach) put every row's goal at its total: the search
    finds no slice whose running sum passes it and falls back to the last slice with weight, whose sweep ends at a
    cell with weight; never -1 or a cell past V."""
    from spectest.gpu import triton as triton_reference

    case = kernel_case(6, 3, 1500, dtype, seed=7, layout="contiguous", kind="dirichlet", device=DEVICE)
    model = triton_reference.TritonReference(block=16, slices=3)
    out = torch.full((6, 4), PAD, dtype=torch.int64, device=DEVICE)
    u = case.u
    model.split(
        case.drafts, case.q, case.p, u, torch.ones_like(case.v), out, 16, *triton_reference.split_launch(3, 1500, 16)
    )
    out = out.cpu()
    p, q = case.p.cpu().double(), case.q.cpu().double()
    for row in range(6):
        n = int((out[row] != PAD).sum()) - 1
        token = int(out[row, n])
        assert 0 <= token < 1500, (row, out[row])
        weight = p[row, n, token] - (q[row, n, token] if n < 3 else 0)
        assert weight > 0, (row, n, token, weight)
