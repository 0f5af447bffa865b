"""End to end: a whole generation loop with speculative decoding on, held to its own target model.

:mod:`spectest.e2e.protocol` (the engine protocol and its contract), :mod:`spectest.e2e.resolve`
(``--spec-engine`` values to engines), :mod:`spectest.e2e.cases` (request batches),
:mod:`spectest.e2e.targets` (the processed target along the engine's own output: impossible
tokens, greedy equality, the probability integral transform), :mod:`spectest.e2e.run` (a property
on an engine), and the registered adapters (:mod:`spectest.e2e.engines`).
"""
