"""The FlashInfer adapter with its CUDA requirement lifted, for the CPU stand-in of FlashInfer beside it:
``pytest --spec-model tests/stand_ins/flashinfer_on_cpu.py:FLASHINFER`` with ``tests/stand_ins`` on
``PYTHONPATH`` runs the whole suite through the adapter, on the shape ``SPECTEST_FLASHINFER_STAND_IN`` names.

The registered ``flashinfer`` model is the same adapter requiring CUDA, which a CPU stand-in does not need; the
adapter itself is unchanged, so the suite holds exactly the code a GPU run uses."""

from __future__ import annotations

from spectest.gpu.flashinfer import FlashInferSampler

FLASHINFER = FlashInferSampler(requires_cuda=False)
