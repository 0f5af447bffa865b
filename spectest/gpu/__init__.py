"""GPU code, apart from the pure-torch references: spectest's own kernels (the fused Triton chain verifier,
``triton``, and the same algorithm as a CUDA C++ kernel launched through CuPy, ``cupy``, with its source in
``cuda/``; what the two share, ``chain_inputs``; each with its deliberately broken variants), the compile gate
that compiles every kernel for sm_80 and sm_90 without a GPU (``compile_gate``), one launch for compute-sanitizer
(``launch_once``), and the adapters of GPU libraries' samplers (FlashInfer's ``flashinfer``, vLLM's ``vllm``,
SGLang's tree verifier ``sglang_tree``). Each imports its library only when used and says why it cannot run here
through :mod:`spectest.availability`; every sampler registers through the ``spectest.models`` entry points.
"""
