"""A CPU stand-in for the ``flashinfer`` package: only ``flashinfer.sampling.chain_speculative_sampling``, in
plain torch (see :mod:`flashinfer.sampling` here). Found as ``flashinfer`` when ``tests/stand_ins`` is on the path."""
