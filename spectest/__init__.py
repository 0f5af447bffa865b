"""spectest: pytest-style correctness and speed harness for speculative decoding.

The top level stays import-light (the pytest plugin loads in every pytest run); the public
names below are imported on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "reference_verify": ("spectest.reference", "verify"),
    "check_verifier": ("spectest.api", "check_verifier"),
    "resolve_model": ("spectest.resolve", "resolve_model"),
    "ContractViolation": ("spectest.protocol", "ContractViolation"),
    "Verifier": ("spectest.protocol", "Verifier"),
    "MarkovChain": ("spectest.models", "MarkovChain"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'spectest' has no attribute {name!r}")
