"""Engines the harness's own tests run: a fast exact Markov engine, known-buggy and known-slow transformers loops,
engines that crash, and stand-in servers; with the names the end-to-end test modules share."""

from __future__ import annotations

from pathlib import Path

from spectest.options import BUDGETS

ENGINES = Path(__file__).resolve().parent
MARKOV = f"{ENGINES / 'markov.py'}:markov"
SLOW = f"{ENGINES / 'slow_transformers.py'}"
TWIN = "test_output_follows_a_twin_without_speculation"  # skips for every engine but a server with a twin
QUICK_TOLERANCE = BUDGETS["quick"].tolerance  # the smallest relative shift a quick run must resolve
# The suite's end-to-end properties (properties/test_e2e.py) but the twin comparison.
E2E_PROPERTIES = [
    "test_engine_output_follows_the_target",
    "test_tokens_per_pass_follow_the_engines_acceptance",
    "test_greedy_requests_equal_greedy_decoding",
    "test_same_seed_same_output",
    "test_seeded_requests_ignore_the_batch",
    "test_first_tokens_of_one_prompt_follow_the_target",
]


def select_properties(pairs: dict[str, list[str]]) -> str:
    """A ``-k`` expression that selects each engine's listed properties and nothing else."""
    names = [*pairs, *E2E_PROPERTIES]
    assert not [(a, b) for a in names for b in names if a != b and a in b], "names must not contain one another"
    return " or ".join(f"({name} and ({' or '.join(props)}))" for name, props in pairs.items())
