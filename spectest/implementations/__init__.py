"""The pure-torch implementations that ship: the ``reference`` chain sampler, the tree references (``tree``),
block verification (``block``), relaxed acceptance (``lossy``), and transformers' own sampler
(``transformers_sampler``). Kernels and GPU libraries' samplers live in :mod:`spectest.gpu`. Every one registers
through the ``spectest.models`` entry-point group; optional dependencies are imported only when used.
"""
