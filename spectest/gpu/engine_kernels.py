"""What every adapter of an engine's own Triton kernels declares alike (vLLM V1 and V2, SGLang, LMDeploy).

An adapter names the packages it needs, the pip hint that installs them and how it loads the engine's kernels;
this base answers ``spectest_unavailable`` from those (a missing package, a version without the kernel file, or a
load that refuses, each as its one-line reason) and ``spectest_interpreted`` (no GPU here: the kernels run in
Triton's interpreter, batched).
"""

from __future__ import annotations

from typing import Any

from spectest.availability import cuda_available, missing


class EngineKernels:
    """Base of the engine-kernel adapters (see the module docstring)."""

    packages: tuple[str, ...] = ("triton",)  # what must be installed (found without importing it)
    hint: str = ""  # how to install them, shown with the reason

    def load(self) -> Any:
        """Import the engine's kernels (raises ModuleNotFoundError where this version has none, RuntimeError where
        the load refuses)."""
        raise NotImplementedError

    def absent(self, exc: ModuleNotFoundError) -> str:
        """Why this installed version cannot serve, from the load's ModuleNotFoundError."""
        return str(exc)

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing(*self.packages, hint=self.hint or None)
        if reason is not None:
            return reason
        try:
            self.load()
        except ModuleNotFoundError as exc:
            return self.absent(exc)
        except RuntimeError as exc:
            return str(exc)
        return None

    @property
    def spectest_interpreted(self) -> bool:
        """Whether its kernels run in Triton's interpreter here (no GPU)."""
        return not cuda_available()
