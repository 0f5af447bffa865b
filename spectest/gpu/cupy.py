"""A fused chain verifier as a CuPy RawKernel, registered as ``reference-cupy``: a CUDA C++ kernel under the gate.

The kernel (``spectest/gpu/cuda/chain.cu``, shipped in the wheel) is the Triton kernel's algorithm
(:mod:`spectest.gpu.chain_inputs`) written for bandwidth: one thread block of 256 threads per row, the K
acceptance tests by one warp (32 positions per ballot), then the one row pair the extra token needs, read once
to sum its weights and once more, tile by tile with a block-wide scan, until the inverse-CDF cell is found; 16-byte
vector loads where the rows are aligned; bf16 and fp16 read as they come and normalised by their row sums; every
sum in float64 (the source says why). NVRTC compiles it through CuPy on first use of each dtype and variant, for
the device at hand (CuPy caches the binary on disk); the compile gate (:mod:`spectest.gpu.compile_gate`)
compiles the same source with the same options for sm_80 and sm_90 without a GPU.

The uniforms come from the caller's generator, drawn with torch exactly as the Triton kernel draws them, so the
two kernels (and tests/chain_emulation.py) emit the same tokens for the same seed. Tensors stay torch tensors:
the launch passes their data pointers (storage offsets included) and the strides of dims 0 and 1, on torch's
current stream. ``BROKEN`` holds the same three deliberately broken variants as the Triton kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from spectest.availability import missing
from spectest.gpu.chain_inputs import BROKEN_VARIANTS, CORRECT, KERNEL_DTYPES, chain_inputs, draw_uniforms
from spectest.protocol import PAD

CUDA_SOURCE = Path(__file__).resolve().parent / "cuda" / "chain.cu"
THREADS = 256  # SPECTEST_THREADS in chain.cu: one block of this many threads per row
# The kernel's element type for each probability dtype (half types as their 16-bit patterns).
ELEMENT_TYPES = {"float32": "float", "float64": "double", "bfloat16": "spectest_bf16", "float16": "spectest_fp16"}
# NVRTC options of every compile of chain.cu (CuPy adds the device's architecture; the gate, sm_80 and sm_90):
# no fused multiply-adds (weights round exactly as the Triton kernel's), no flush of subnormals to zero.
NVRTC_OPTIONS = ("--fmad=false", "--ftz=false")
# The kernel's parameters in order, with their C types (a pointer is 8 bytes).
PARAMETERS = (
    ("drafts", "pointer"),
    ("d_row", "int64"),
    ("d_pos", "int64"),
    ("q", "pointer"),
    ("q_row", "int64"),
    ("q_pos", "int64"),
    ("p", "pointer"),
    ("p_row", "int64"),
    ("p_pos", "int64"),
    ("u", "pointer"),
    ("v", "pointer"),
    ("out", "pointer"),
    ("k", "int32"),
    ("vocab", "int64"),
)


def name_expression(dtype: str, bug: int) -> str:
    """The template instantiation a launch for ``dtype`` probabilities and variant ``bug`` uses."""
    return f"spectest_chain<{ELEMENT_TYPES[dtype]}, {bug}>"


@dataclass(frozen=True)
class Launch:
    """One launch of the kernel: which instantiation, its grid and block, and every argument by name; the tensors
    the pointers point into ride along (alive until the launch is queued; a stand-in launcher reads them)."""

    name_expression: str
    dtype: str
    bug: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arguments: dict[str, int]  # in PARAMETERS' order; pointers as addresses
    device: torch.device
    tensors: dict[str, torch.Tensor]


def plan_launch(
    drafts: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    bug: int,
) -> Launch:
    """The launch for these tensors (``chain_inputs``' output, the uniforms, a contiguous ``out``)."""
    batch, k = drafts.shape
    if not (u.is_contiguous() and v.is_contiguous() and out.is_contiguous()):
        raise ValueError("the uniforms and the output must be contiguous")
    arguments = {
        "drafts": drafts.data_ptr(),
        "d_row": drafts.stride(0),
        "d_pos": drafts.stride(1),
        "q": q.data_ptr(),
        "q_row": q.stride(0),
        "q_pos": q.stride(1),
        "p": p.data_ptr(),
        "p_row": p.stride(0),
        "p_pos": p.stride(1),
        "u": u.data_ptr(),
        "v": v.data_ptr(),
        "out": out.data_ptr(),
        "k": k,
        "vocab": p.shape[-1],
    }
    dtype = str(p.dtype).removeprefix("torch.")
    tensors = {"drafts": drafts, "q": q, "p": p, "u": u, "v": v, "out": out}
    grid, block = (batch, 1, 1), (THREADS, 1, 1)
    return Launch(name_expression(dtype, bug), dtype, bug, grid, block, arguments, drafts.device, tensors)


_MODULES: dict[tuple[str, int], tuple[Any, Any]] = {}  # (name expression, device) -> (RawModule, its RawKernel)


def launch_with_cupy(launch: Launch) -> None:
    """Compile (NVRTC through CuPy, once per instantiation and device) and launch on torch's current stream."""
    if launch.device.type != "cuda":
        raise ValueError(f"reference-cupy launches on CUDA tensors, these are on {launch.device} (--spec-device cuda)")
    import cupy
    import numpy as np

    index = launch.device.index if launch.device.index is not None else torch.cuda.current_device()
    key = (launch.name_expression, index)
    with cupy.cuda.Device(index):
        if key not in _MODULES:
            module = cupy.RawModule(
                code=CUDA_SOURCE.read_text(), options=NVRTC_OPTIONS, name_expressions=(launch.name_expression,)
            )
            _MODULES[key] = (module, module.get_function(launch.name_expression))
        converters = {"pointer": np.uint64, "int64": np.int64, "int32": np.int32}
        arguments = tuple(converters[kind](launch.arguments[name]) for name, kind in PARAMETERS)
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(index).cuda_stream)
        with stream:
            _MODULES[key][1](launch.grid, launch.block, arguments)


class CupyReference:
    """The chain verifier as one CUDA C++ kernel launched through CuPy (see the module docstring)."""

    spectest_capabilities = frozenset({"standard-rejection"})
    spectest_dtypes = KERNEL_DTYPES

    def __init__(self, bug: int = CORRECT, launcher: Callable[[Launch], None] | None = None) -> None:
        self.bug = bug
        self.launcher = launcher  # None: CuPy's; the harness's own tests pass a recorder

    @property
    def spectest_unavailable(self) -> str | None:
        if self.launcher is not None:
            return None
        return missing("cupy", gpu=True, hint="pip install 'spectest[cuda12]' or 'spectest[cuda13]'")

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        drafts, q, p = chain_inputs(draft_token_ids, draft_probs, target_probs)
        batch, k = drafts.shape
        u, v = draw_uniforms(batch, k, p.dtype, generator, drafts.device)
        if batch == 0:
            return torch.full((0, k + 1), PAD, dtype=torch.int64, device=drafts.device)
        out = torch.empty((batch, k + 1), dtype=torch.int64, device=drafts.device)  # the kernel writes every cell
        (self.launcher or launch_with_cupy)(plan_launch(drafts, q, p, u, v, out, self.bug))
        return out


CUPY_REFERENCE = CupyReference()
# Deliberately broken kernels: each must fail the suite.
BROKEN = {name: CupyReference(bug) for name, bug in BROKEN_VARIANTS.items()}
residual_from_position_0 = BROKEN["residual_from_position_0"]
id_past_v = BROKEN["id_past_v"]
uniform_reused = BROKEN["uniform_reused"]
