"""spectest: pytest-style correctness and speed harness for speculative decoding.

What users need, imported on first use (the top level stays import-light: the pytest plugin
loads in every pytest run):

* ``check_verifier(verify, ...)``: the whole suite as a library call;
* ``resolve_model(spec)``, ``Model``, ``ModelSpecError``: a ``--spec-model`` value, resolved;
* ``ContractViolation``, ``Verifier``, ``SamplingParams``: the protocol;
* ``REFERENCE``: the reference implementation (registered ``reference``), every capability;
* ``strategies``: Hypothesis strategies for users' own tests; ``rules``: every rule and check name.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "check_verifier": ("spectest.api", "check_verifier"),
    "resolve_model": ("spectest.resolve", "resolve_model"),
    "Model": ("spectest.protocol", "Model"),
    "ModelSpecError": ("spectest.resolve", "ModelSpecError"),
    "ContractViolation": ("spectest.protocol", "ContractViolation"),
    "Verifier": ("spectest.protocol", "Verifier"),
    "SamplingParams": ("spectest.sampling_params", "SamplingParams"),
    "REFERENCE": ("spectest.implementations.sampler", "REFERENCE"),
    "strategies": ("spectest.strategies", None),
    "rules": ("spectest.rules", None),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attr = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'spectest' has no attribute {name!r}")
