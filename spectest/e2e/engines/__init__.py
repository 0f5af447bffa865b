"""The registered engine adapters, one module per real engine: transformers' own loops
(:mod:`~spectest.e2e.engines.transformers_loops`), vLLM on a GPU (:mod:`~spectest.e2e.engines.vllm_gpu`), and the
engines that run speculative decoding on a plain CPU. Each imports its engine only when used, and resolves
without it, every property skipping with the reason."""
