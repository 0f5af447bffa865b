"""The batched interpreter (spectest.gpu.interpreter, spectest.gpu.predication) against Triton's own, program by
program: for the same launch every output byte must be the same. Kernels that part their programs every way a
kernel can (tests/interpreter_kernels.py), the samplers' tile loops, reductions and scans of 2-D blocks along either
axis, a name bound to blocks of two shapes, tiles far wider than the vocabulary (tailed blocks), an atomic (which
runs program by program), and spectest's own Triton
chain verifier in every variant. Also: how many groups the programs ran in (a launch that agrees everywhere is one),
and the interpreter's arrangement (TRITON_INTERPRET set before triton is imported, or a usage error naming it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is imported: set it first
pytest.importorskip("triton")

from spectest.gpu import interpreter
from tests.interpreter_kernels import kernels

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="compares interpreters: CPU tensors only")


@pytest.fixture
def batched() -> Iterator[None]:
    was = interpreter.installed()
    interpreter.install()
    try:
        yield
    finally:
        if not was:
            interpreter.uninstall()


def both(launch: Callable[[], list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``launch()``'s outputs program by program (Triton's interpreter) and batched."""
    with interpreter.program_by_program():
        plain = launch()
    interpreter.install()
    return plain, launch()


def assert_same(plain: list[torch.Tensor], batched: list[torch.Tensor]) -> None:
    for a, b in zip(plain, batched, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.view(torch.uint8).equal(b.view(torch.uint8)), f"differ at {(a != b).nonzero()[:5].tolist()}"


def test_every_way_programs_part_gives_each_program_its_own_result(batched) -> None:
    k = kernels()
    rng = np.random.default_rng(0)
    n_programs = 40
    x = torch.tensor(rng.random(n_programs), dtype=torch.float32)
    n = torch.tensor(rng.integers(0, 6, n_programs), dtype=torch.int32)

    def launch() -> list[torch.Tensor]:
        out = torch.full((n_programs * 5,), -7.0)
        ints = torch.full((n_programs * 5,), -7, dtype=torch.int32)
        k.branches[(n_programs,)](x, n, out, ints)
        return [out, ints]

    plain, batched_out = both(launch)
    assert_same(plain, batched_out)
    assert len(set(batched_out[1][0::5].tolist())) == 3  # all three branches were taken


@pytest.mark.parametrize("vocab", [5, 64, 100, 200])
def test_tile_loops_of_samplers_match(batched, vocab: int) -> None:
    k = kernels()
    rng = np.random.default_rng(vocab)
    rows = 48
    p = rng.dirichlet(np.full(vocab, 0.3), size=rows).astype(np.float32)
    q = rng.dirichlet(np.full(vocab, 0.3), size=rows).astype(np.float32)
    p[:4] = q[:4]  # rows whose residual is empty: the search falls through to V - 1
    tensors = [torch.from_numpy(a) for a in (p, q, rng.exponential(size=(rows, vocab)).astype(np.float32))]
    u = torch.from_numpy(rng.random(rows).astype(np.float32))

    def launch() -> list[torch.Tensor]:
        out = torch.full((rows * 2,), -1, dtype=torch.int32)
        k.tiles[(rows,)](*tensors, u, out, vocab, BLOCK=32)
        return [out]

    assert_same(*both(launch))


def test_block_reductions_and_scans_match(batched) -> None:
    k = kernels()
    rng = np.random.default_rng(1)
    m, n, programs = 8, 16, 12
    x = torch.from_numpy(rng.standard_normal((programs, m, n)).astype(np.float32))
    x[3, 2, 5] = x[3].max() + 1  # one clear maximum
    x[4] = x[4, 0, 0]  # ties everywhere: the first index

    def launch() -> list[torch.Tensor]:
        out = torch.zeros(programs * (2 * m + 2 * n + 4))
        k.blocks[(programs,)](x, out, M=m, N=n)
        return [out]

    assert_same(*both(launch))


def test_a_name_bound_to_two_shapes_is_split_only_when_read(batched) -> None:
    k = kernels()
    x = torch.tensor([0.1, 0.3, 0.6, 0.9, 0.2, 0.7], dtype=torch.float32)

    def launch() -> list[torch.Tensor]:
        out = torch.zeros(12)
        k.shapes[(6,)](x, out)
        return [out]

    before = interpreter.LAUNCHES.groups
    plain, batched_out = both(launch)
    assert_same(plain, batched_out)
    assert interpreter.LAUNCHES.groups - before == 3  # one group, split in two where `other` is read


@pytest.mark.parametrize(("vocab", "tiles"), [(5, 1), (20, 1), (0, 1), (64, 1), (300, 2)])
def test_tiles_wider_than_the_vocabulary_match_bit_for_bit(batched, monkeypatch, vocab: int, tiles: int) -> None:
    """Loads whose lanes past the vocabulary hold the fill are kept as a tail (spectest.gpu.tails): every output,
    NaN and -0 included, is the interpreter's own; and the tail was taken, not built whole at the load."""
    from spectest.gpu import tails

    k = kernels()
    rng = np.random.default_rng(vocab)
    rows, block, width = 24, 256, 15
    x = rng.standard_normal(max(1, rows * vocab)).astype(np.float32)
    if vocab:
        x[3] = np.nan  # a NaN among the live lanes of row 0
        x[vocab + 1] = -0.0
    x = torch.from_numpy(x)
    fill = torch.from_numpy(rng.standard_normal(rows).astype(np.float32))
    made = []
    monkeypatch.setattr(tails, "tailed", lambda *args: made.append(1) or tails.tailed_class()(*args))
    monkeypatch.setattr(interpreter, "SHARED_ROW", 8)  # groups keep to one tile from 8 rows on, not 256

    def launch() -> list[torch.Tensor]:
        out = torch.full((rows * tiles * (width + block),), -7.0)
        ints = torch.full((rows * tiles * 4,), -7, dtype=torch.int32)
        k.wide[(rows, tiles)](x, fill, out, ints, vocab, BLOCK=block, OUT=width)
        return [out, ints]

    assert_same(*both(launch))
    assert made, "no load kept its fill as a tail"


def test_tailed_blocks_of_different_live_lengths_combine(batched) -> None:
    k = kernels()
    x = torch.from_numpy(np.random.default_rng(3).random(24 * 5).astype(np.float32))

    def launch() -> list[torch.Tensor]:
        out = torch.zeros(24)
        k.lengths[(24,)](x, out, 5, BLOCK=256)
        return [out]

    assert_same(*both(launch))


def test_an_atomic_runs_program_by_program_with_the_same_result(batched) -> None:
    k = kernels()
    x = torch.tensor([0.1, 0.6, 0.9, 0.2], dtype=torch.float32)

    def launch() -> list[torch.Tensor]:
        count, out = torch.zeros(1, dtype=torch.int32), torch.zeros(4)
        k.counting[(4,)](x, count, out)
        return [count, out]

    before = dict(interpreter.LAUNCHES.fallbacks)
    plain, batched_out = both(launch)
    assert_same(plain, batched_out)
    assert batched_out[0].item() == 2  # the undone batched attempt left no count behind
    assert interpreter.LAUNCHES.fallbacks.get("atomic_rmw", 0) == before.get("atomic_rmw", 0) + 1


@pytest.mark.parametrize("variant", ["correct", "residual_from_position_0", "id_past_v", "uniform_reused"])
def test_spectest_triton_kernel_matches_in_every_variant(batched, variant: str) -> None:
    from spectest.gpu import triton as triton_reference

    kernel = triton_reference.TRITON_REFERENCE if variant == "correct" else triton_reference.BROKEN[variant]
    rng = np.random.default_rng(2)
    rows, k, vocab = 32, 3, 300  # two tiles of 256
    p = torch.from_numpy(rng.dirichlet(np.full(vocab, 0.2), size=(rows, k + 1)))
    q = torch.from_numpy(rng.dirichlet(np.full(vocab, 0.2), size=(rows, k)))
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=torch.Generator().manual_seed(0)).view(rows, k)

    def launch() -> list[torch.Tensor]:
        return [kernel.verify(drafts, q, p, generator=torch.Generator().manual_seed(3))]

    before = interpreter.LAUNCHES.groups
    assert_same(*both(launch))
    assert interpreter.LAUNCHES.groups - before <= 2  # one launch, its programs in one group (two for the split)


def test_loops_of_each_programs_own_length_stay_batched(batched) -> None:
    """A loop pass that every enabled program takes merges nothing: a name bound to a Python value before the loop
    and to a block in it is no conflict there (it was, and the launch fell back to running program by program)."""
    k = kernels()
    rng = np.random.default_rng(2)
    rows, drafts = 200, 5
    n = torch.from_numpy(rng.integers(0, drafts + 1, rows).astype(np.int32))
    x = torch.from_numpy(rng.random(rows * drafts).astype(np.float32))

    def launch() -> list[torch.Tensor]:
        out = torch.full((rows * 2,), -1.0)
        k.ragged[(rows,)](n, x, out, K=drafts)
        return [out]

    fallbacks, groups = sum(interpreter.LAUNCHES.fallbacks.values()), interpreter.LAUNCHES.groups
    plain, batched_out = both(launch)
    assert_same(plain, batched_out)
    assert sum(interpreter.LAUNCHES.fallbacks.values()) == fallbacks
    # Split once where the programs with no drafts read their names (Python values for them, blocks for the rest),
    # and at most once more each where a loop's blocks conflict with the names' values before it.
    assert interpreter.LAUNCHES.groups - groups <= 2 * (drafts + 2), interpreter.LAUNCHES.summary()


def test_a_launch_whose_programs_agree_runs_as_one_group(batched) -> None:
    k = kernels()
    x = torch.full((64,), 0.9)
    n = torch.full((64,), 2, dtype=torch.int32)
    before = interpreter.LAUNCHES.groups
    k.branches[(64,)](x, n, torch.zeros(320), torch.zeros(320, dtype=torch.int32))
    assert interpreter.LAUNCHES.groups - before == 1


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


def test_triton_imported_without_the_interpreter_is_said_in_one_line() -> None:
    result = run_python(
        "import triton.language\n"
        "from spectest.gpu.interpreter import arrange_triton, InterpreterUnavailable\n"
        "try:\n    arrange_triton('my kernel')\nexcept InterpreterUnavailable as exc:\n    print(exc)\n"
    )
    assert "set TRITON_INTERPRET=1 in the environment" in result.stdout, result.stderr


def test_the_interpreter_switched_off_is_said_in_one_line() -> None:
    result = run_python(
        "from spectest.gpu.interpreter import arrange_triton, InterpreterUnavailable\n"
        "try:\n    arrange_triton('my kernel')\nexcept InterpreterUnavailable as exc:\n    print(exc)\n",
        TRITON_INTERPRET="0",
    )
    assert "TRITON_INTERPRET=0 turns it off" in result.stdout, result.stderr
