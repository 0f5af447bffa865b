"""Stand-ins for GPU libraries, in plain torch on the CPU, so that their adapters run in the harness's own tests.

Each stand-in keeps the library's documented signature and semantics (read from its source, cited in the
stand-in) and is exact, so the whole property suite passes it; its deliberately wrong shapes are the bugs and API
changes the adapter must report. ``flashinfer/`` is importable as ``flashinfer`` with this folder on the path
(``PYTHONPATH`` for a run through the plugin, ``sys.path`` in process); ``flashinfer_on_cpu.py`` is the FlashInfer
adapter with its CUDA requirement lifted.
"""
