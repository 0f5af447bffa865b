"""Analytic and Monte Carlo models of the speculative-decoding acceptance chain.

The public surface; the modules underneath each do one job: ``chain`` (tokens per pass in
closed form), ``speed`` (cost, speedup, break-even), ``markov`` (exact context-dependent chains
and the maximal-coupling bound), ``text`` (the exact chain along a real text's per-token
acceptances) and ``montecarlo`` (the sampling twin that cross-checks them).
"""

from spectest.simulators.chain import (
    TokensPerPass,
    acceptance_probability,
    expected_tokens_iid,
    tokens_per_pass,
    tokens_per_pass_iid,
)
from spectest.simulators.speed import (
    CostModel,
    acceptance_for_speedup,
    acceptance_for_tokens_per_pass,
    break_even_acceptance,
    operations_factor,
    optimal_k,
    speedup,
)
from spectest.simulators.text import (
    expected_passes,
    pass_starts,
    passes_law,
    slot_acceptance,
    tokens_per_pass_along,
)

__all__ = [
    "CostModel",
    "TokensPerPass",
    "acceptance_for_speedup",
    "acceptance_for_tokens_per_pass",
    "acceptance_probability",
    "break_even_acceptance",
    "expected_passes",
    "expected_tokens_iid",
    "operations_factor",
    "optimal_k",
    "pass_starts",
    "passes_law",
    "slot_acceptance",
    "speedup",
    "tokens_per_pass",
    "tokens_per_pass_along",
    "tokens_per_pass_iid",
]
