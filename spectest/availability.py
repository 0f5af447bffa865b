"""Why an implementation or engine cannot run here: one guard for every optional package and for CUDA.

Every adapter of an optional library (transformers, FlashInfer, vLLM, SGLang, Triton, CuPy, OpenVINO GenAI,
llama.cpp, MLX-LM) answers ``spectest_unavailable`` from here, so the reasons read alike and nothing is imported
to ask: a package is looked up (``importlib.util.find_spec``), never imported, and torch only when CUDA is asked
about.
"""

from __future__ import annotations

import importlib.util


def missing(package: str, *, gpu: bool = False) -> str | None:
    """Why an adapter of ``package`` cannot run here (the package, or a CUDA GPU when ``gpu``), or None."""
    if importlib.util.find_spec(package) is None:
        return f"the '{package}' package is not installed"
    if gpu and not cuda_available():
        return f"'{package}' needs a CUDA GPU and none is available"
    return None


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch imported only here, when asked)."""
    import torch

    return bool(torch.cuda.is_available())
