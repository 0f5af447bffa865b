"""What an engine adapter needs, in one place: the public face for ``--spec-engine`` authors, as
:mod:`spectest.strategies` is for verifier authors (like ``hypothesis.strategies``: it re-exports from
``spectest.e2e``, whose modules may move; this surface stays).

* The protocol and its contract: :class:`EngineModel` (an object as the harness holds it, its declarations
  read), :func:`build_engine`, :func:`call_generate` and :func:`call_logits` (every call checked: lengths, ids,
  NaN, exceptions, hangs), :class:`PassRecord` (what an engine says about its passes) and
  :func:`resolve_engine` (a ``--spec-engine`` value to an engine, as the plugin resolves it).
* The declarations an engine may make, by value: :data:`SEEDED`, :data:`BATCH_INVARIANT` and :data:`TOKEN_WISE`
  (``spectest_engine_capabilities``), :data:`FIRST_TOKENS` (``spectest_first_token``), :data:`DRAFT_SAMPLINGS`
  (``spectest_draft_sampling``); requests: :class:`SamplingParams`, :data:`NO_SEED` and :func:`request_seed` (a
  request's own seed, or one derived as every adapter derives it).
* Isolation, for an engine whose native code can crash or hang: :class:`IsolatedEngine` (and
  :class:`IsolatedWithPlain`, :class:`IsolatedWithDraft` for the optional methods) runs it in a process of its
  own; :class:`EngineDied` and :class:`EngineHung` are what a call then raises.
* The shared tiny pair every CPU engine runs (nothing downloaded): :func:`tiny_pair` (its Hugging Face folders),
  :func:`converted` (a conversion to an engine's format, cached), :class:`TeacherForcing` and
  :class:`TeacherForcedLogits` (``target_logits`` / ``draft_logits`` from its checkpoints), :func:`build_pair`
  and :func:`teacher_forced` (a seeded pair of any size in transformers, and raw logits along sequences).

The reference pages list exactly these names (``tests/test_docs.py`` holds them to ``__all__``).
"""

from __future__ import annotations

from spectest.e2e import protocol
from spectest.e2e.cases import request_seed
from spectest.e2e.isolated import EngineDied, EngineHung, IsolatedEngine, IsolatedWithDraft, IsolatedWithPlain
from spectest.e2e.pair import build_pair, teacher_forced
from spectest.e2e.protocol import EngineModel, PassRecord, build_engine, call_generate, call_logits
from spectest.e2e.resolve import resolve_engine
from spectest.e2e.tiny_pair import PairDirs, TeacherForcedLogits, TeacherForcing, converted
from spectest.e2e.tiny_pair import pair as tiny_pair
from spectest.sampling_params import NO_SEED as _NO_SEED
from spectest.sampling_params import SamplingParams

#: ``spectest_engine_capabilities``: the same seed gives the same output.
SEEDED = protocol.SEEDED
#: ``spectest_engine_capabilities``: a seeded request's output does not depend on the rest of the batch.
BATCH_INVARIANT = protocol.BATCH_INVARIANT
#: ``spectest_engine_capabilities``: tokens are verified one by one with min(1, p/q) (standard rejection).
TOKEN_WISE = protocol.TOKEN_WISE
#: ``spectest_first_token``: where a request's first new token comes from ("drafted", the default, or "prefill").
FIRST_TOKENS = protocol.FIRST_TOKENS
#: ``spectest_draft_sampling``: how the draft picks its proposals ("request", the default, or "greedy").
DRAFT_SAMPLINGS = protocol.DRAFT_SAMPLINGS
#: A request's ``SamplingParams.seed`` when it has none of its own (it then uses the call's seed).
NO_SEED = _NO_SEED

__all__ = [
    "BATCH_INVARIANT",
    "DRAFT_SAMPLINGS",
    "FIRST_TOKENS",
    "NO_SEED",
    "SEEDED",
    "TOKEN_WISE",
    "EngineDied",
    "EngineHung",
    "EngineModel",
    "IsolatedEngine",
    "IsolatedWithDraft",
    "IsolatedWithPlain",
    "PairDirs",
    "PassRecord",
    "SamplingParams",
    "TeacherForcedLogits",
    "TeacherForcing",
    "build_engine",
    "build_pair",
    "call_generate",
    "call_logits",
    "converted",
    "request_seed",
    "resolve_engine",
    "teacher_forced",
    "tiny_pair",
]
