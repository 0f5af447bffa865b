"""Why an implementation or engine cannot run here: one guard for every optional package and for CUDA.

Every adapter of an optional library (transformers, FlashInfer, vLLM, SGLang, Triton, CuPy, OpenVINO GenAI,
llama.cpp, MLX-LM) answers ``spectest_unavailable`` from here, so the reasons read alike and nothing is imported
to ask: a package is looked up (``importlib.util.find_spec`` of its top-level name), never imported, and torch
only when CUDA is asked about. An adapter adds what only it knows as a ``hint`` (the pip extra that installs its
packages, what a package is needed for).
"""

from __future__ import annotations

import importlib.util
import shutil


def missing(*packages: str, gpu: bool = False, hint: str | None = None) -> str | None:
    """Why an adapter of ``packages`` cannot run here (a package not installed, or no CUDA GPU when ``gpu``), or
    None. ``hint`` is added in parentheses to either reason."""
    if not packages:
        raise ValueError("missing() needs at least one package name")
    absent = [package for package in packages if importlib.util.find_spec(package.split(".")[0]) is None]
    if absent:
        return with_hint(not_installed(absent), hint)
    if gpu and not cuda_available():
        return with_hint(f"'{packages[0]}' needs a CUDA GPU and none is available", hint)
    return None


def not_installed(packages: list[str]) -> str:
    """ "the 'a' package is not installed", "the 'a' and 'b' packages are not installed", ..."""
    names = [f"'{package}'" for package in packages]
    if len(names) == 1:
        return f"the {names[0]} package is not installed"
    return f"the {', '.join(names[:-1])} and {names[-1]} packages are not installed"


def with_hint(reason: str, hint: str | None) -> str:
    return reason if not hint else f"{reason} ({hint})"


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch imported only here, when asked)."""
    import torch

    return bool(torch.cuda.is_available())


def compiler_missing() -> str | None:
    """Why ``torch.compile`` cannot build CPU code here (no C++ compiler on the PATH: Inductor's CPU backend compiles
    C++), or None."""
    if any(shutil.which(name) for name in ("c++", "g++", "clang++")):
        return None
    return "no C++ compiler on the PATH (c++, g++ or clang++), which torch.compile's CPU backend needs"
