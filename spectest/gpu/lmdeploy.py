"""LMDeploy's rejection samplers (PyTorch engine, 0.18) as ``--spec-model`` models, nothing in them replaced:

* ``lmdeploy``: its CUDA backend's ``CudaRejectionSamplingImpl`` (``pytorch/backends/cuda/rejection_sampling.py``)
  and the three Triton kernels it launches (``pytorch/kernels/cuda/rejection_sampling.py``: the recovered tokens by
  the exponential race, then the acceptance test, then the output and its counts);
* ``lmdeploy-torch``: the portable twin its default backend runs (``DefaultRejectionSamplingImpl``,
  ``pytorch/backends/default/rejection_sampling.py``), pure PyTorch.

Both take the processed target logits of the K draft positions (``log p``: LMDeploy applies its own softmax), the
drafts, the draft probabilities and the bonus token its ``FusedLogitsProcessor`` sampled from the last position
(the adapter draws it from p[:, K] with the harness's generator: that step is the engine's sampler, not the
rejection sampler). Their uniforms and exponentials come from torch's global RNG, which the adapter seeds from the
harness's generator inside ``torch.random.fork_rng``. Their counters (``num_rejected_tokens``) are held to the
output exactly.

Importing ``lmdeploy`` imports its whole engine (its ``__init__`` pulls the pipeline, the server and their
dependencies). So the three files are loaded from the installed distribution alone (``pip install --no-deps
lmdeploy==0.18.0``), and their one import from the engine's package, ``lmdeploy.pytorch.backends.rejection_sampling``
(the constant ``PLACEHOLDER_TOKEN_ID`` and the abstract ``RejectionSamplingImpl`` the two implementations subclass),
is a stand-in for the duration of the load: :func:`stand_in` builds it from that file's own definitions, executed
without the file's one relative import (``from .base import BuildSpec``, the engine's build machinery). The
kernels' module sees the implementation file's import of it as that loaded module. Without a GPU the Triton kernels
run in Triton's interpreter, batched (:mod:`spectest.gpu.interpreter`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from spectest.availability import cuda_available
from spectest.gpu.engine_kernels import EngineKernels
from spectest.gpu.interpreter import describe_kernels
from spectest.sampling import global_rng_from, sample_categorical

FILES = {
    "interface": ("pytorch", "backends", "rejection_sampling.py"),
    "kernels": ("pytorch", "kernels", "cuda", "rejection_sampling.py"),
    "triton": ("pytorch", "backends", "cuda", "rejection_sampling.py"),
    "torch": ("pytorch", "backends", "default", "rejection_sampling.py"),
}
NAMES = {  # the modules' names inside LMDeploy (their imports name them so)
    "interface": "lmdeploy.pytorch.backends.rejection_sampling",
    "kernels": "lmdeploy.pytorch.kernels.cuda.rejection_sampling",
    "triton": "lmdeploy.pytorch.backends.cuda.rejection_sampling",
    "torch": "lmdeploy.pytorch.backends.default.rejection_sampling",
}
KERNELS = ("_rejection_greedy_sample_kernel", "_rejection_random_sample_kernel", "_sample_recovered_tokens_kernel")
_LOADED: dict[str, Any] = {}


def _path(part: str) -> Path:
    found = importlib.util.find_spec("lmdeploy")
    for root in list(found.submodule_search_locations or []) if found else []:
        path = Path(root).joinpath(*FILES[part])
        if path.is_file():
            return path
    raise ModuleNotFoundError(f"this LMDeploy has no {'/'.join(FILES[part])}")


def stand_in() -> types.ModuleType:
    """``lmdeploy.pytorch.backends.rejection_sampling`` as the installed file defines it, less its import of the
    engine's build machinery (``from .base import BuildSpec``, which only its ``RejectionSamplingBuildSpec`` uses)."""
    path = _path("interface")
    tree = ast.parse(path.read_text())
    tree.body = [node for node in tree.body if not (isinstance(node, ast.ImportFrom) and node.level)]
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ClassDef) and any(ast.unparse(b).startswith("BuildSpec") for b in node.bases))
    ]
    module = types.ModuleType(NAMES["interface"])
    module.__file__ = str(path)
    exec(compile(tree, str(path), "exec"), module.__dict__)
    if getattr(module, "PLACEHOLDER_TOKEN_ID", None) != -1 or not hasattr(module, "RejectionSamplingImpl"):
        raise ModuleNotFoundError("this LMDeploy's backends/rejection_sampling.py is not the one this adapter knows")
    return module


@contextlib.contextmanager
def _standing_in(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` importable by their LMDeploy names (with empty parent packages) while inside, then gone."""
    names = list(modules)
    for name in names:
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            if parent not in modules:
                package = types.ModuleType(parent)
                package.__path__ = []
                modules[parent] = package
    previous = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, module in previous.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _exec(part: str, path: Path) -> types.ModuleType:
    name = NAMES[part]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_lmdeploy(part: str) -> Any:
    """LMDeploy's ``triton`` (CUDA backend, with its kernels) or ``torch`` (default backend) implementation module."""
    if part in _LOADED:
        return _LOADED[part]
    if part == "triton" and not cuda_available():
        from spectest.gpu.interpreter import arrange_triton

        arrange_triton("lmdeploy")
    interface = _LOADED.get("interface") or stand_in()
    _LOADED["interface"] = interface
    modules: dict[str, types.ModuleType] = {NAMES["interface"]: interface}
    if part == "triton":
        path = _path("kernels")
        with _standing_in(dict(modules)):
            kernels = _exec("kernels", path)
        _LOADED["kernels"] = kernels
        modules[NAMES["kernels"]] = kernels
    path = _path(part)
    with _standing_in(modules):
        _LOADED[part] = _exec(part, path)
    return _LOADED[part]


class LmdeployRejectionSampler(EngineKernels):
    """LMDeploy's rejection sampler of one backend (see the module docstring)."""

    spectest_capabilities = frozenset({"standard-rejection"})
    hint = "pip install --no-deps lmdeploy==0.18.0"
    backend = "triton"

    def __init__(self, name: str) -> None:
        self.name = name
        self._rejected: torch.Tensor | None = None
        self._k = 0

    @property
    def packages(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("lmdeploy", "triton") if self.backend == "triton" else ("lmdeploy",)

    def load(self) -> Any:
        return load_lmdeploy(self.backend)

    @property
    def spectest_interpreted(self) -> bool:
        return self.backend == "triton" and super().spectest_interpreted

    @property
    def spectest_description(self) -> str | None:
        if self.backend != "triton":
            return "LMDeploy's DefaultRejectionSamplingImpl (PyTorch)"
        load_lmdeploy("triton")
        return describe_kernels("lmdeploy", "LMDeploy", _LOADED["kernels"], KERNELS)

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        module = load_lmdeploy(self.backend)
        implementation = (
            module.CudaRejectionSamplingImpl() if self.backend == "triton" else module.DefaultRejectionSamplingImpl()
        )
        k = draft_token_ids.shape[1]
        bonus = sample_categorical(target_probs[:, k], generator)
        logits = target_probs[:, :k].double().log().float()  # LMDeploy applies its own softmax (exp(-inf) = 0)
        with global_rng_from(generator):
            output, rejected, _ = implementation.forward(
                logits,
                draft_token_ids.contiguous(),
                bonus,
                is_greedy=None,
                draft_probs=draft_probs.to(torch.float32).contiguous(),
            )
        self._rejected, self._k = rejected, k
        return output.to(torch.int64)

    def spectest_counters(self) -> dict[str, torch.Tensor] | None:
        """``num_rejected_tokens`` as drafts emitted: of the K + 1 slots, those not rejected, less the extra token."""
        if self._rejected is None:
            return None
        return {"emitted_drafts": self._k - self._rejected.to(torch.int64)}


class LmdeployTorch(LmdeployRejectionSampler):
    backend = "torch"


LMDEPLOY = LmdeployRejectionSampler("lmdeploy")
LMDEPLOY_TORCH = LmdeployTorch("lmdeploy-torch")
