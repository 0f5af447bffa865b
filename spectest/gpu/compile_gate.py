"""The compile gate: every kernel spectest ships, correct and deliberately broken, compiled for sm_80 and sm_90
ahead of time, with no GPU and no driver.

Nothing else in CI says whether the GPU code compiles: Triton's interpreter, which runs the Triton kernel's
tests on the CPU, accepts kernels its compiler rejects (a module global that is not a ``tl.constexpr``, a
variable that is a scalar in one loop and a block in another: both reached a GPU before this gate existed), and
CuPy compiles only where a driver is. The gate compiles

- the Triton kernel (:mod:`spectest.gpu.triton`) with ``triton.compile(ASTSource(fn, signature, constexprs,
  attrs), target=GPUTarget("cuda", arch, 32))``: the whole pipeline down to ptxas's cubin, specialised as a
  launch on contiguous tensors specialises it (an int equal to 1 becomes a constant; ints divisible by 16 and
  the tensors' 16-byte-aligned pointers get ``tt.divisibility`` 16, on triton >= 3.3; triton 3.2's
  ``ASTSource`` takes ``constants`` and its own attribute descriptor, and compiles without that hint); checked
  with triton 3.2.0, 3.3.1 and 3.9.0;
- the CUDA C++ kernel of :mod:`spectest.gpu.cupy` with NVRTC (``cuda.bindings.nvrtc``; pip ``cuda-bindings``
  and ``nvidia-cuda-nvrtc-cu12``), with the options CuPy compiles it with, to a cubin per architecture.

Every compile runs in a child process (``python -m spectest.gpu.compile_gate --child``) whose environment has
no ``TRITON_INTERPRET`` (under which ``@triton.jit`` gives the interpreter's function; the Triton tests set
it), so a crashing compiler takes down only its child. Coverage (:func:`covering_items`, and why it suffices):

- CUDA C++: every variant x every dtype x sm_80, sm_90. K, V and the strides are runtime arguments of the one
  compiled kernel per instantiation.
- Triton: every variant x every dtype x both architectures at K = 4, V = 32000 (BLOCK 1024, every int
  divisible by 16); every BLOCK the suite can pass (16 to 512; 1024 above) at V = BLOCK - 1 (no int divisible by
  16); K = 1 (d_row = 1 becomes a constant too) and K = 16 (the longest unroll the suite passes) for float32 and
  bfloat16 (the half path has the most code per position). K is the trip count of a ``tl.static_range``: each
  unrolled copy is the same code with its own index, so K = 1, 4 and 16 compiling means every K compiles;
  BLOCK only sizes the tiles (``tl.arange(0, BLOCK)``) of the same loops. ``--full`` compiles every K from 1 to
  16 for every variant and dtype too (for a machine with many cores).

    python -m spectest.gpu.compile_gate [--full] [--arch 80,90] [--jobs N] [--json PATH] [--list]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ARCHS = (80, 90)
TRITON_KERNEL = "spectest.gpu.triton:chain_kernel"
SPLIT_KERNELS = ("spectest.gpu.triton:sums_kernel", "spectest.gpu.triton:search_kernel")
SPLIT_SLICES = 8  # the split kernels' launch the gate compiles: B = 64, V = 32000 on 132 SMs
VARIANTS = {"correct": 0, "residual_from_position_0": 1, "id_past_v": 2, "uniform_reused": 3}
DTYPES = ("float32", "float64", "bfloat16", "float16")
SUITE_BLOCKS = (16, 32, 64, 128, 256, 512, 1024)  # spectest.gpu.triton.block_size over every V
SUITE_LARGEST_K = 16  # spectest.cases.sizes.draft_lengths
OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclass(frozen=True)
class GateItem:
    """One compile: a kernel (``module:attr`` or ``file.py:attr`` of a Triton kernel, or the path of a CUDA C++
    source), for one architecture, with what selects its variant."""

    compiler: str  # "triton" or "nvrtc"
    kernel: str
    arch: int
    variant: str = "correct"
    dtype: str = "float32"
    signature: dict[str, str] = field(default_factory=dict)  # triton: every parameter's type or "constexpr"
    constexprs: dict[str, Any] = field(default_factory=dict)  # triton
    divisible: tuple[str, ...] = ()  # triton: parameters a launch specialises as divisible by 16
    options: dict[str, Any] = field(default_factory=dict)  # triton's compile options
    name_expressions: tuple[str, ...] = ()  # nvrtc
    nvrtc_options: tuple[str, ...] = ()  # nvrtc, the architecture aside
    shape: str = ""  # triton: the launch it is specialised for ("K=4 V=32000 BLOCK=1024")

    @property
    def label(self) -> str:
        source = self.kernel.rpartition("/")[2]
        return " ".join(filter(None, (self.compiler, source, self.variant, self.dtype, self.shape, f"sm_{self.arch}")))


@dataclass
class GateResult:
    label: str
    status: str  # ok, failed, skipped
    seconds: float
    message: str = ""
    sizes: dict[str, int] = field(default_factory=dict)  # bytes of ptx and cubin; registers and spills (nvrtc)


def triton_item(kernel: str, variant: str, dtype: str, k: int, vocab: int, arch: int, block: int) -> GateItem:
    """The Triton kernel as a launch on contiguous [B, K(+1), V] tensors of ``dtype`` specialises it."""
    from spectest.gpu import triton as triton_kernel

    runtime = {"vocab": vocab, "d_row": k, "d_pos": 1, "q_row": k * vocab, "q_pos": vocab}
    runtime |= {"p_row": (k + 1) * vocab, "p_pos": vocab}
    signature = triton_kernel.signature(dtype)
    constexprs: dict[str, Any] = {name: 1 for name, value in runtime.items() if value == 1}
    constexprs |= triton_kernel.constexprs(k, block, VARIANTS[variant], dtype)
    for name in constexprs:
        signature[name] = "constexpr"
    pointers = [name for name, kind in signature.items() if kind.startswith("*")]
    divisible = tuple(pointers + [name for name, value in runtime.items() if value != 1 and value % 16 == 0])
    shape = f"K={k} V={vocab} BLOCK={block}"
    options = dict(triton_kernel.COMPILE_OPTIONS)
    return GateItem("triton", kernel, arch, variant, dtype, signature, constexprs, divisible, options, shape=shape)


def split_items(variant: str, dtype: str, k: int, vocab: int, arch: int, block: int, slices: int) -> list[GateItem]:
    """The split Triton kernels (``chain_sums``, ``chain_search``) as a launch on contiguous tensors specialises them."""
    from spectest.gpu import triton as triton_kernel

    _, slice_cells = triton_kernel.split_launch(slices, vocab, block)
    strides = {"q_row": k * vocab, "q_pos": vocab, "p_row": (k + 1) * vocab, "p_pos": vocab}
    runtimes = (
        {"vocab": vocab, "slice_cells": slice_cells, "d_row": k, "d_pos": 1, **strides},
        {"vocab": vocab, "slice_cells": slice_cells, "parts": slices, **strides},
    )
    flags = triton_kernel.split_constexprs(k, block, VARIANTS[variant], dtype, slices)
    items = []
    signatures = triton_kernel.split_signatures(dtype)
    for kernel, signature, runtime, launched in zip(SPLIT_KERNELS, signatures, runtimes, flags, strict=True):
        constexprs: dict[str, Any] = {name: 1 for name, value in runtime.items() if value == 1}
        constexprs |= launched
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        pointers = [name for name, kind in signature.items() if kind.startswith("*")]
        divisible = tuple(pointers + [name for name, value in runtime.items() if value != 1 and value % 16 == 0])
        shape = f"K={k} V={vocab} BLOCK={block} slices={slices}"
        options = dict(triton_kernel.COMPILE_OPTIONS)
        items.append(
            GateItem("triton", kernel, arch, variant, dtype, signature, constexprs, divisible, options, shape=shape)
        )
    return items


def nvrtc_item(source: str, variant: str, dtype: str, arch: int) -> GateItem:
    """The CUDA C++ kernel's instantiation for ``dtype`` and ``variant``, compiled as CuPy compiles it (plus
    ptxas's report of registers and spills)."""
    from spectest.gpu import cupy as cupy_kernel

    expression = cupy_kernel.name_expression(dtype, VARIANTS[variant])
    options = (*cupy_kernel.NVRTC_OPTIONS, "--ptxas-options=--verbose")
    return GateItem("nvrtc", source, arch, variant, dtype, name_expressions=(expression,), nvrtc_options=options)


def covering_items(archs: Iterable[int] = ARCHS, *, full: bool = False) -> list[GateItem]:
    """Every shipped kernel's compiles (see the module docstring for why this set covers the suite's launches)."""
    from spectest.gpu import cupy as cupy_kernel

    archs = tuple(archs)
    source = str(cupy_kernel.CUDA_SOURCE)
    items = [nvrtc_item(source, v, d, arch) for arch in archs for v in VARIANTS for d in DTYPES]
    ks = range(1, SUITE_LARGEST_K + 1) if full else (4,)
    items += [
        triton_item(TRITON_KERNEL, v, d, k, 32000, arch, 1024)
        for arch in archs
        for k in ks
        for v in VARIANTS
        for d in DTYPES
    ]
    items += [
        triton_item(TRITON_KERNEL, "correct", "float32", 4, block - 1, arch, block)
        for arch in archs
        for block in SUITE_BLOCKS
        if block < 1024
    ]
    # The split kernels (float32 and float64 only): every variant in float32, the correct one in float64.
    split = [(v, "float32") for v in VARIANTS] + [("correct", "float64")]
    items += [
        item for arch in archs for v, d in split for item in split_items(v, d, 4, 32000, arch, 1024, SPLIT_SLICES)
    ]
    if not full:
        items += [
            triton_item(TRITON_KERNEL, "correct", d, k, 1025, arch, 1024)
            for arch in archs
            for k in (1, SUITE_LARGEST_K)
            for d in ("float32", "bfloat16")
        ]
    return items


# --- compiling (in the child) -------------------------------------------------------------------------------


def resolve(kernel: str) -> Any:
    """``module:attr`` or ``path/file.py:attr``."""
    import importlib
    import importlib.util

    where, _, attr = kernel.rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"spectest_gate_{Path(where).stem}", where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, attr)


def compile_triton(item: GateItem) -> GateResult:
    """One Triton compile: the compiler's exception (its message) is the item's failure."""
    started = time.perf_counter()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from triton.runtime.jit import JITFunction
    except ImportError as exc:
        return GateResult(item.label, SKIPPED, 0.0, f"triton is not importable here: {exc}")
    try:
        found = resolve(item.kernel)
        fn = found if isinstance(found, JITFunction) else found()
        names = list(fn.arg_names)
        signature = {name: item.signature[name] for name in names}
        constexprs = {name: value for name, value in item.constexprs.items() if name in names}
        if "constexprs" in inspect.signature(ASTSource).parameters:  # triton >= 3.3
            attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in item.divisible}
            source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        else:  # triton 3.2: constants by name, and its own attribute descriptor (left at no divisibility)
            source = ASTSource(fn=fn, signature=signature, constants=constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", item.arch, 32), options=item.options)
    except Exception as exc:  # the compiler's verdict on the kernel: its message is the result
        return GateResult(item.label, FAILED, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    sizes = {kind: len(compiled.asm[kind]) for kind in ("ptx", "cubin") if kind in compiled.asm}
    return GateResult(item.label, OK, time.perf_counter() - started, "", sizes)


def nvrtc_module() -> Any:
    """cuda-bindings' NVRTC module (``cuda.bindings.nvrtc``, ``cuda.nvrtc`` before 12.6)."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        from cuda import nvrtc  # cuda-python before 12.6
    return nvrtc


def compile_nvrtc(item: GateItem) -> GateResult:
    """One NVRTC compile of a source's name expressions: NVRTC's log is the item's failure; no NVRTC here, a skip."""
    started = time.perf_counter()
    try:
        nvrtc = nvrtc_module()
    except ImportError as exc:
        return GateResult(
            item.label,
            SKIPPED,
            0.0,
            f"NVRTC is not importable ({exc}): pip install cuda-bindings nvidia-cuda-nvrtc-cu12",
        )
    source = Path(item.kernel)

    def check(result: tuple) -> tuple:
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {result[0]}")
        return result[1:]

    try:
        (program,) = check(nvrtc.nvrtcCreateProgram(source.read_bytes(), source.name.encode(), 0, [], []))
    except Exception as exc:  # no libnvrtc (cuda-bindings without nvidia-cuda-nvrtc-cu12): no verdict on the kernel
        return GateResult(item.label, SKIPPED, 0.0, f"NVRTC could not start: {type(exc).__name__}: {exc}")
    try:
        for expression in item.name_expressions:
            check(nvrtc.nvrtcAddNameExpression(program, expression.encode()))
        options = [f"--gpu-architecture=sm_{item.arch}".encode(), *(o.encode() for o in item.nvrtc_options)]
        compiled = nvrtc.nvrtcCompileProgram(program, len(options), options)
        (log_size,) = check(nvrtc.nvrtcGetProgramLogSize(program))
        log = b" " * log_size
        check(nvrtc.nvrtcGetProgramLog(program, log))
        text = log.decode(errors="replace").rstrip("\x00 \n")
        if compiled[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return GateResult(item.label, FAILED, time.perf_counter() - started, text or str(compiled[0]))
        for expression in item.name_expressions:
            check(nvrtc.nvrtcGetLoweredName(program, expression.encode()))
        (ptx,) = check(nvrtc.nvrtcGetPTXSize(program))
        (cubin,) = check(nvrtc.nvrtcGetCUBINSize(program))
    except RuntimeError as exc:  # a name expression NVRTC could not lower, an API call refused
        return GateResult(item.label, FAILED, time.perf_counter() - started, str(exc))
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    sizes = {"ptx": int(ptx), "cubin": int(cubin), **ptxas_report(text)}
    return GateResult(item.label, OK, time.perf_counter() - started, "", sizes)


def ptxas_report(log: str) -> dict[str, int]:
    """Registers and spill bytes of the kernel from ptxas's verbose report (the largest over its functions)."""
    report: dict[str, int] = {}
    for key, pattern in (("registers", r"Used (\d+) registers"), ("spill_bytes", r"(\d+) bytes spill stores")):
        values = [int(value) for value in re.findall(pattern, log)]
        if values:
            report[key] = max(values)
    return report


def compile_item(item: GateItem) -> GateResult:
    return compile_triton(item) if item.compiler == "triton" else compile_nvrtc(item)


def child_main(given: Path, taken: Path) -> int:
    """Compile the items in ``given`` (JSON), appending one result line to ``taken`` as each finishes (so that a
    crash loses only the item it happened in)."""
    import warnings

    warnings.filterwarnings("ignore")  # a compiler's deprecation chatter is no verdict
    with open(taken, "a") as results:
        for raw in json.loads(given.read_text()):
            for key in ("name_expressions", "nvrtc_options", "divisible"):
                raw[key] = tuple(raw[key])
            results.write(json.dumps(asdict(compile_item(GateItem(**raw)))) + "\n")
            results.flush()
    return 0


# --- running (in the parent) --------------------------------------------------------------------------------


def clean_environment(cache: str | None) -> dict[str, str]:
    """This process's environment without the Triton interpreter's switch (and with ``cache`` for Triton's)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if cache is not None:
        env["TRITON_CACHE_DIR"] = cache
    return env


def run_gate(
    items: list[GateItem], *, jobs: int = 2, timeout: float = 900, triton_cache: str | None = None
) -> list[GateResult]:
    """Compile ``items`` in ``jobs`` child processes side by side; one result per item, in order. A child that
    crashes or times out fails the items it had not finished, with its exit status and its stderr's tail."""
    jobs = max(1, min(jobs, len(items)))
    shares = [list(range(first, len(items), jobs)) for first in range(jobs)]  # item indices, round robin
    results: list[GateResult | None] = [None] * len(items)
    with tempfile.TemporaryDirectory() as folder:
        children = []
        for number, share in enumerate(shares):
            given, taken = Path(folder, f"items{number}.json"), Path(folder, f"results{number}.jsonl")
            given.write_text(json.dumps([asdict(items[i]) for i in share]))
            errors = open(Path(folder, f"stderr{number}"), "w+")  # a file: a chatty compiler never blocks
            command = [sys.executable, "-m", "spectest.gpu.compile_gate", "--child", str(given), str(taken)]
            child = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=errors, env=clean_environment(triton_cache)
            )
            children.append((child, share, taken, errors))
        deadline = time.monotonic() + timeout
        for child, share, taken, errors in children:
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            errors.seek(0)
            err = errors.read()
            errors.close()
            lines = taken.read_text().splitlines() if taken.exists() else []
            done = [GateResult(**json.loads(line)) for line in lines if line.startswith("{")]
            for index, result in zip(share, done, strict=False):  # done may stop short: a crash
                results[index] = result
            for index in share[len(done) :]:
                crash = f"the compiler's process ended (exit {child.returncode}) before this item:\n{err[-3000:]}"
                results[index] = GateResult(items[index].label, FAILED, 0.0, crash)
    return [result for result in results if result is not None]


def summary(results: list[GateResult], seconds: float) -> str:
    """One line: how many compiled, failed and were skipped."""
    counts = {status: sum(r.status == status for r in results) for status in (OK, FAILED, SKIPPED)}
    return (
        f"compile gate: {counts[OK]} compiled, {counts[FAILED]} failed, {counts[SKIPPED]} skipped "
        f"({len(results)} items, {seconds:.1f} s)"
    )


def render(results: list[GateResult]) -> str:
    """One line per result, and the compiler's message under each that did not compile."""
    lines = []
    for result in results:
        sizes = " ".join(f"{key}={value}" for key, value in result.sizes.items())
        lines.append(f"{result.status:7} {result.seconds:5.2f}s  {result.label}  {sizes}")
        if result.status != OK:
            lines += [f"        {line}" for line in result.message.splitlines()[:40]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("ITEMS", "RESULTS"), help=argparse.SUPPRESS)
    parser.add_argument("--arch", default=",".join(map(str, ARCHS)), help="compute capabilities (default 80,90)")
    parser.add_argument("--full", action="store_true", help="every K from 1 to 16 for every variant and dtype")
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 16), help="compiler processes")
    parser.add_argument("--json", default=None, help="write every item's result here")
    parser.add_argument("--list", action="store_true", help="print the items without compiling")
    parser.add_argument("--fresh", action="store_true", help="compile with an empty Triton cache")
    args = parser.parse_args(argv)
    if args.child:
        return child_main(Path(args.child[0]), Path(args.child[1]))
    items = covering_items([int(a) for a in args.arch.split(",")], full=args.full)
    if args.list:
        print("\n".join(item.label for item in items))
        return 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        results = run_gate(items, jobs=args.jobs, triton_cache=cache if args.fresh else None)
    seconds = time.perf_counter() - started
    print(render(results))
    print(summary(results, seconds))
    if args.json:
        Path(args.json).write_text(json.dumps({"seconds": seconds, "results": [asdict(r) for r in results]}, indent=1))
    return 1 if any(r.status == FAILED for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
