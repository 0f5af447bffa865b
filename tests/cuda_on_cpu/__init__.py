"""The CUDA kernel of ``reference-cupy`` run on the CPU: build the driver, hand it a launch, read its output.

``cuda_on_cpu.h`` supplies just enough CUDA for ``spectest/gpu/cuda/chain.cu`` to compile as C++ (every CUDA
thread a std::thread, barriers for ``__syncthreads`` and warp shuffles); ``chain_driver.cpp`` launches it on
inputs from files exactly as :mod:`spectest.gpu.cupy` launches it on a GPU (pointers at the tensors' storage
offsets, the strides of dims 0 and 1). Built with AddressSanitizer (reads outside any input) or
ThreadSanitizer (shared-memory races), it is the CPU's stand-in for ``compute-sanitizer``'s memcheck and
racecheck, which need a GPU.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from spectest.gpu.cupy import THREADS, Launch, plan_launch

HERE = Path(__file__).resolve().parent
KERNEL_FOLDER = HERE.parent.parent / "spectest" / "gpu" / "cuda"
SANITIZERS = {
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
    "thread": ["-fsanitize=thread"],
}


def compiler() -> str | None:
    return shutil.which("g++") or shutil.which("clang++")


def build_driver(folder: Path, sanitizer: str = "address") -> Path:
    """The driver, compiled into ``folder`` with ``sanitizer`` (about 15 s with g++ on one core)."""
    binary = folder / f"chain_driver_{sanitizer}"
    command = [
        compiler() or "g++",
        "-std=c++20",
        "-O1",
        "-g",
        "-ffp-contract=off",  # products and differences round on their own, as on the GPU
        "-fno-strict-aliasing",  # the vector loads read the rows through uint4
        "-pthread",
        *SANITIZERS[sanitizer],
        "-I",
        str(KERNEL_FOLDER),
        "-I",
        str(HERE),
        str(HERE / "chain_driver.cpp"),
        "-o",
        str(binary),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building the CUDA-on-CPU driver failed:\n{done.stderr[-4000:]}")
    return binary


def storage_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's whole storage as raw bytes (bf16 and fp16 as their 16-bit patterns)."""
    storage = torch.empty(0, dtype=tensor.dtype).set_(tensor.untyped_storage())
    return storage.cpu().view(torch.int16 if tensor.element_size() == 2 else storage.dtype).numpy().tobytes()


def offset_into_storage(launch: Launch, name: str) -> int:
    """Where the launch's pointer ``name`` points, in elements from the start of its tensor's storage."""
    tensor = launch.tensors[name]
    delta = launch.arguments[name] - tensor.untyped_storage().data_ptr()
    if delta % tensor.element_size() != 0 or not 0 <= delta < max(1, tensor.untyped_storage().nbytes()):
        raise ValueError(f"the launch's {name} pointer is not inside its tensor's storage")
    return delta // tensor.element_size()


def run_launch(driver: Path, folder: Path, launch: Launch, timeout: float = 300) -> None:
    """Run ``launch`` (as spectest.gpu.cupy planned it for CPU tensors) on the CPU: the kernel gets the storages
    and exactly the launch's offsets, strides, K and V, and its output lands in the launch's ``out`` tensor."""
    if launch.block != (THREADS, 1, 1) or launch.grid[1:] != (1, 1):
        raise ValueError(
            f"the driver runs blocks of {THREADS} threads on a 1-D grid, not {launch.block} x {launch.grid}"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("drafts", "q", "p", "u", "v"):
        (folder / f"{name}.bin").write_bytes(storage_bytes(launch.tensors[name]))
    offsets = {name: offset_into_storage(launch, name) for name in ("drafts", "q", "p", "u", "v")}
    if offsets["u"] or offsets["v"]:
        raise ValueError("the uniforms are passed as whole tensors")
    arguments = launch.arguments
    command = [driver, launch.dtype, launch.bug, launch.grid[0], arguments["k"], arguments["vocab"], folder]
    command += [offsets["q"], arguments["q_row"], arguments["q_pos"], offsets["p"], arguments["p_row"]]
    command += [arguments["p_pos"], offsets["drafts"], arguments["d_row"], arguments["d_pos"]]
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        report = done.stderr if len(done.stderr) < 8000 else done.stderr[:4000] + "\n...\n" + done.stderr[-4000:]
        raise RuntimeError(f"the kernel failed on the CPU (exit {done.returncode}):\n{report}")
    batch, k = launch.grid[0], arguments["k"]
    out = np.fromfile(folder / "out.bin", dtype=np.int64).reshape(batch, k + 1)
    launch.tensors["out"].copy_(torch.from_numpy(out))


def cpu_launcher(driver: Path, folder: Path) -> Callable[[Launch], None]:
    """A launcher for ``CupyReference(launcher=...)`` that runs each launch on the CPU."""
    return lambda launch: run_launch(driver, folder, launch)


def run_on_cpu(driver: Path, folder: Path, drafts, q, p, u, v, bug: int) -> np.ndarray:
    """int64 [B, K + 1]: the kernel's output for these tensors and uniforms, launched as reference-cupy would."""
    batch, k = drafts.shape
    out = torch.empty((batch, k + 1), dtype=torch.int64)
    run_launch(driver, folder, plan_launch(drafts, q, p, u, v, out, bug))
    return out.numpy()
