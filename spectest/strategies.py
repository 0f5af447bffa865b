"""Hypothesis strategies for speculative-decoding cases, for the suite and for users' own tests.

The public surface (like ``hypothesis.strategies``): it re-exports from ``spectest.cases``.
Strategies draw small *recipes* (sizes, kinds, a seed) rather than raw probability vectors:
that keeps large vocabularies cheap, lets Hypothesis shrink toward small simple cases, and
replays any case exactly from its printed repr. Build the arrays with :func:`build_chain` or
:func:`build_logits`.
"""

from __future__ import annotations

from spectest.cases.chain import ChainCase, MarkovCase, build_chain, chain_cases, markov_cases, max_length
from spectest.cases.logits import LogitsCase, LogitsInputs, build_logits, logits_cases
from spectest.cases.ranges import CaseRanges
from spectest.cases.sizes import TILE_EDGES, batch_sizes, draft_lengths, kind_pairs, seeds, vocab_sizes
from spectest.sampling_params import SamplingParams

__all__ = [
    "TILE_EDGES",
    "CaseRanges",
    "ChainCase",
    "LogitsCase",
    "LogitsInputs",
    "MarkovCase",
    "SamplingParams",
    "batch_sizes",
    "build_chain",
    "build_logits",
    "chain_cases",
    "draft_lengths",
    "kind_pairs",
    "logits_cases",
    "markov_cases",
    "max_length",
    "seeds",
    "vocab_sizes",
]
