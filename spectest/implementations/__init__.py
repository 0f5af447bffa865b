"""The implementations that ship: the torch ``reference`` (registered ``reference``), the fused
Triton kernel (``triton``: ``reference-triton``) and adapters to engines' samplers
(``engines``: ``transformers``, ``flashinfer``, ``vllm``). Optional dependencies are imported
only when used; every one registers through the ``spectest.models`` entry-point group.
"""
