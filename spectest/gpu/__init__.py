"""GPU code, apart from the pure-torch references: spectest's own kernels (the fused Triton chain verifier,
``triton``, with its deliberately broken variants) and the adapters of GPU libraries' samplers (FlashInfer's
``flashinfer``, vLLM's ``vllm``, SGLang's tree verifier ``sglang_tree``). Each imports its library only when
used and says why it cannot run here through :mod:`spectest.availability`; every one registers through the
``spectest.models`` entry points.
"""
