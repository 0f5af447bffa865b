"""The acceptance profiler (``spectest profile``): how predictable is a text for a target/draft
pair, scored by teacher forcing (``acceptance``), with byte-level n-gram models (``ngram``).
"""
