"""The engine protocol, and the contract every call to an engine is held to.

``pytest --spec-engine X`` runs the end-to-end properties on X, an engine with speculative
decoding on::

    class Engine:
        vocab_size: int
        def generate(self, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
                     seed: int) -> list[list[int]]
            # speculative decoding ON; exactly max_new_tokens new ids per prompt (no stop on EOS),
            # one list per prompt; params holds one row per request (temperature 0 = greedy,
            # top_k 0 = off, top_p 1 = off, min_p 0 = off, seed -1 = none: use ``seed``)
        def target_logits(self, sequences: list[list[int]]) -> torch.Tensor
            # [N, L, V] raw next-token logits of the TARGET model at every position of each
            # sequence (teacher forcing, no processors; float32 or wider; L = the longest
            # sequence, positions past a sequence's end are ignored)

Optional, discovered from the object: ``plain_generate`` (same signature, speculative decoding
off), ``draft_logits(sequences)`` (the draft model's raw logits, same shape), and after a
``generate``: ``passes`` (target forward passes per prompt), ``tokens_per_pass`` (per prompt, the
tokens each pass emitted) and ``draft_lengths`` (per prompt, the drafts each pass proposed), or,
for an engine that only counts, ``pass_counts`` (over the call: ``passes``, the target passes that
verified drafts, and ``draft_tokens``, the drafts they verified; see :mod:`spectest.e2e.pass_counts`)
with ``spectest_first_token`` ("drafted", the default: the first pass drafts from the prompt; or
"prefill": the prompt's own pass samples the first token with no drafts and is not counted).
Declared: ``spectest_engine_capabilities`` ("seeded": the same seed gives the same output;
"batch-invariant": a seeded request's output does not depend on the rest of the batch;
"standard-rejection": tokens are verified one by one with min(1, p/q), so the token at each
offset of a pass follows the target, and tokens per pass follow the chain), ``spectest_tie_break``
("lowest-id" or "any", for greedy requests), ``spectest_filter_order`` (default top_k, top_p,
min_p after temperature, transformers' order), ``spectest_draft_warps`` (how many times the
engine applies a request's processing to its draft: transformers applies it twice, so its draft
samples from softmax(logits / T^2) at temperature T; the harness models the draft's q the same way), ``spectest_draft_sampling``
("request", the default: the draft samples with the request's processing; or "greedy": it proposes its argmax
whatever the request says, as llama.cpp's speculative example drafts, so q is a point mass), ``spectest_masked_tokens`` (ids the engine can only
keep out of its output by masking them, EOS say: the harness masks them too), and
``spectest_sampling_params`` (the parameters it takes, default all four: requests leave the others off) and
``spectest_left_out`` (for each parameter it does not take, why: reported in the header, summary and results),
``spectest_prompt_tokens`` and ``spectest_prompt_prefix`` (for an engine whose prompts travel as text:
the ids whose text encodes back to themselves, which prompts are drawn from, and the ids its encoder
puts before every prompt, which every prompt then starts with), and ``spectest_unavailable`` (why it cannot run here: a missing package or GPU).
For the speed property: ``spectest_components`` (one pass's parts to time), ``spectest_clock`` (the clock to
time the engine on; an engine in a process of its own brings its process's CPU time) and
``spectest_components_unavailable`` (why there are no parts, said in the skip).

"No stop on EOS" must come from configuration, not from a processor that masks EOS (a
minimum-length rule sets its logit to -inf, so the engine samples from a distribution the raw
logits do not describe): an engine that cannot avoid masking declares the masked ids.

Every call goes through :func:`call_generate` or :func:`call_logits`: a wrong length, a stray id,
NaN logits, an exception or a hang becomes a :class:`~spectest.protocol.ContractViolation`
naming the engine, the rule and the input, never a harness traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spectest import rules
from spectest.protocol import DEFAULT_ORDER, PARAMETERS, TIE_BREAKS, ContractViolation, guarded_call, validate_order

if TYPE_CHECKING:
    import torch

    from spectest.sampling_params import SamplingParams

SEEDED = "seeded"
BATCH_INVARIANT = "batch-invariant"
TOKEN_WISE = "standard-rejection"
ENGINE_CAPABILITIES = (SEEDED, BATCH_INVARIANT, TOKEN_WISE)
# Discovered from the object's methods.
PLAIN = "plain-generate"
DRAFT_LOGITS = "draft-logits"
SCORED = "scored"  # its target can be scored: every engine but a server judged against a twin alone
TWIN = "twin"  # a twin without speculation to compare with (a server with --spec-reference-url)
FIRST_TOKENS = ("drafted", "prefill")  # where a request's first new token comes from (spectest_first_token)
DRAFT_SAMPLINGS = ("request", "greedy")  # how the draft picks its proposals (spectest_draft_sampling)


@dataclass(frozen=True)
class EngineModel:
    """A resolved engine under test: what the user named, and the object."""

    name: str
    engine: Any
    source: str = ""
    capabilities: frozenset[str] = field(default_factory=frozenset)
    tie_break: str = "lowest-id"
    masked_tokens: tuple[int, ...] = ()
    filter_order: tuple[str, ...] = DEFAULT_ORDER  # the order the engine applies top-k, top-p, min-p
    draft_warps: int = 1  # how many times the engine applies a request's processing to its draft
    draft_sampling: str = "request"  # or "greedy": the draft proposes its argmax whatever the request says
    sampling_params: tuple[str, ...] = PARAMETERS  # the parameters it takes (vLLM refuses min-p with a draft)
    left_out: tuple[tuple[str, str], ...] = ()  # (parameter, why) for each parameter it does not take
    first_token: str = "drafted"  # or "prefill": the first new token comes from the prompt's pass, no drafts
    prompt_tokens: tuple[int, ...] = ()  # the ids prompts may hold (none named: any); text-prompt servers name theirs
    prompt_prefix: tuple[int, ...] = ()  # ids every prompt starts with (what a text encoder always prepends)
    unavailable: str | None = None
    max_tv: None = None  # engines are held to exactness (lossy mode is the verifier suite's)

    def __str__(self) -> str:
        return self.name

    @property
    def vocab_size(self) -> int:
        """The engine's ``vocab_size``; an engine that cannot say (a checkpoint that does not load, a
        property that raises) breaks the protocol, never the harness."""
        __tracebackhide__ = True
        value = guarded_call(self, "vocab_size", "", None, getattr, self.engine, "vocab_size")
        try:
            vocab = int(value)
        except (TypeError, ValueError):
            vocab = 0
        if vocab < 1:
            raise ContractViolation(self.name, rules.E2E_OUTPUT, f"vocab_size is {value!r}, not a positive integer")
        return vocab

    def pass_record(self, prompts: int) -> PassRecord:
        """What the engine reported about its last ``generate`` (None for what it does not report)."""
        return PassRecord.read(self, prompts)


@dataclass(frozen=True)
class PassRecord:
    """Per prompt of the last ``generate``: target passes, tokens each pass emitted, drafts each proposed;
    or, over the whole call, what an engine counts (``counts``: passes with drafts and the drafts they verified)."""

    passes: list[int] | None
    tokens_per_pass: list[list[int]] | None
    draft_lengths: list[list[int]] | None
    counts: dict[str, int] | None = None

    @classmethod
    def read(cls, engine: EngineModel, prompts: int) -> PassRecord:
        def per_prompt(name: str, nested: bool) -> Any:
            value = getattr(engine.engine, name, None)
            if value is None:
                return None
            try:
                rows = [[int(x) for x in row] if nested else int(row) for row in value]
            except (TypeError, ValueError):
                raise ContractViolation(
                    engine.name, rules.E2E_PASSES, f"{name} is {type(value).__name__}, not one entry per prompt"
                ) from None
            if len(rows) != prompts:
                raise ContractViolation(
                    engine.name, rules.E2E_PASSES, f"{name} has {len(rows)} entries for {prompts} prompts"
                )
            return rows

        return cls(
            per_prompt("passes", False),
            per_prompt("tokens_per_pass", True),
            per_prompt("draft_lengths", True),
            cls.read_counts(engine),
        )

    @staticmethod
    def read_counts(engine: EngineModel) -> dict[str, int] | None:
        value = getattr(engine.engine, "pass_counts", None)
        if value is None:
            return None
        try:
            counts = {name: int(value[name]) for name in ("passes", "draft_tokens")}
        except (TypeError, KeyError, ValueError):
            raise ContractViolation(
                engine.name,
                rules.E2E_PASSES,
                f"pass_counts is {value!r}, not a mapping with integer passes and draft_tokens",
            ) from None
        if min(counts.values()) < 0:
            raise ContractViolation(engine.name, rules.E2E_PASSES, f"pass_counts {counts} holds a negative count")
        return counts


def build_engine(name: str, source: str, obj: Any, module: Any = None) -> EngineModel:
    """An EngineModel from a user's object: declared capabilities and options, discovered methods."""

    def declared(attribute: str) -> Any:
        value = getattr(obj, attribute, None)
        return value if value is not None else getattr(module, attribute, None)

    for method in ("generate", "target_logits"):
        if not callable(getattr(obj, method, None)):
            raise ValueError(f"{name}: an engine needs a {method} method (see spectest.e2e.protocol)")
    capabilities = set(declared("spectest_engine_capabilities") or ())
    unknown = capabilities - set(ENGINE_CAPABILITIES)
    if unknown:
        raise ValueError(f"{name}: unknown engine capabilities {sorted(unknown)}; known: {ENGINE_CAPABILITIES}")
    capabilities |= {PLAIN} if callable(getattr(obj, "plain_generate", None)) else set()
    capabilities |= {DRAFT_LOGITS} if callable(getattr(obj, "draft_logits", None)) else set()
    capabilities |= set() if getattr(obj, "spectest_unscored", None) else {SCORED}
    capabilities |= {TWIN} if getattr(obj, "twin", None) is not None else set()
    tie_break = declared("spectest_tie_break") or "lowest-id"
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"{name}: spectest_tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    masked = tuple(int(i) for i in declared("spectest_masked_tokens") or ())
    order = validate_order(declared("spectest_filter_order") or DEFAULT_ORDER, what=f"{name}: spectest_filter_order")
    warps = declared("spectest_draft_warps") or 1
    if not isinstance(warps, int) or warps < 1:
        raise ValueError(f"{name}: spectest_draft_warps must be an integer >= 1, got {warps!r}")
    supported = tuple(declared("spectest_sampling_params") or PARAMETERS)
    if "temperature" not in supported or set(supported) - set(PARAMETERS):
        raise ValueError(f"{name}: spectest_sampling_params must include 'temperature' and lie in {PARAMETERS}")
    why = dict(declared("spectest_left_out") or {})
    left_out = tuple(
        (p, str(why.get(p, "not among its spectest_sampling_params"))) for p in PARAMETERS if p not in supported
    )
    draft_sampling = declared("spectest_draft_sampling") or "request"
    if draft_sampling not in DRAFT_SAMPLINGS:
        raise ValueError(f"{name}: spectest_draft_sampling must be one of {DRAFT_SAMPLINGS}, got {draft_sampling!r}")
    first_token = declared("spectest_first_token") or "drafted"
    if first_token not in FIRST_TOKENS:
        raise ValueError(f"{name}: spectest_first_token must be one of {FIRST_TOKENS}, got {first_token!r}")
    prompt_tokens = tuple(int(i) for i in declared("spectest_prompt_tokens") or ())
    prompt_prefix = tuple(int(i) for i in declared("spectest_prompt_prefix") or ())
    unavailable = getattr(obj, "spectest_unavailable", None)
    return EngineModel(
        name=name,
        engine=obj,
        source=source,
        capabilities=frozenset(capabilities),
        tie_break=tie_break,
        masked_tokens=masked,
        filter_order=order,
        draft_warps=warps,
        draft_sampling=draft_sampling,
        sampling_params=supported,
        left_out=left_out,
        first_token=first_token,
        prompt_tokens=prompt_tokens,
        prompt_prefix=prompt_prefix,
        unavailable=unavailable() if callable(unavailable) else unavailable,
    )


def call_generate(
    engine: EngineModel,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    max_new_tokens: int,
    seed: int,
    *,
    timeout: float | None = None,
    method: str = "generate",
) -> list[list[int]]:
    """``engine.generate`` (or ``plain_generate``), its output checked exactly: one list per prompt
    of exactly ``max_new_tokens`` ids in [0, V)."""
    __tracebackhide__ = True
    inputs = f"{len(prompts)} prompts, max_new_tokens={max_new_tokens}, seed={seed}"
    fn = getattr(engine.engine, method)
    timeout = timeout * max(1, len(prompts)) if timeout else timeout  # one request may take the verifier's limit
    out = guarded_call(
        engine, method, inputs, timeout, fn, [list(p) for p in prompts], params.clone(), max_new_tokens, seed
    )
    vocab = engine.vocab_size
    try:
        rows = [[int(x) for x in row] for row in out]
    except TypeError:
        raise ContractViolation(
            engine.name, rules.E2E_OUTPUT, f"{method} returned {type(out).__name__}, not one id list per prompt"
        ) from None
    if len(rows) != len(prompts):
        raise ContractViolation(engine.name, rules.E2E_OUTPUT, f"{len(rows)} outputs for {len(prompts)} prompts")
    for r, row in enumerate(rows):
        if len(row) != max_new_tokens:
            raise ContractViolation(
                engine.name,
                rules.E2E_OUTPUT,
                f"request {r} ({params.describe_row(r)}) got {len(row)} new ids, not max_new_tokens={max_new_tokens} "
                f"(did it stop on EOS?): {row[:40]}",
            )
        bad = [x for x in row if not 0 <= x < vocab]
        if bad:
            raise ContractViolation(
                engine.name, rules.E2E_OUTPUT, f"request {r} holds id {bad[0]} outside [0, {vocab}): {row[:40]}"
            )
    return rows


def call_logits(
    engine: EngineModel, which: str, sequences: Sequence[Sequence[int]], *, timeout: float | None = None
) -> torch.Tensor:
    """``engine.target_logits`` or ``draft_logits``: float [N, >= longest, V], no NaN, no +inf
    (-inf marks a token the model itself never allows); returned as float64 on the CPU."""
    __tracebackhide__ = True
    import torch

    method = f"{which}_logits"
    longest = max(len(s) for s in sequences)
    inputs = f"{len(sequences)} sequences of up to {longest} tokens"
    logits = guarded_call(engine, method, inputs, timeout, getattr(engine.engine, method), [list(s) for s in sequences])
    vocab = engine.vocab_size
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ContractViolation(engine.name, rules.E2E_LOGITS, f"{method} returned {type(logits).__name__} ({inputs})")
    if logits.shape[0] != len(sequences) or logits.shape[1] < longest or logits.shape[2] != vocab:
        raise ContractViolation(
            engine.name,
            rules.E2E_LOGITS,
            f"{method} returned shape {tuple(logits.shape)}, expected [{len(sequences)}, {longest}, {vocab}] ({inputs})",
        )
    if not logits.is_floating_point() or logits.dtype in (torch.float16, torch.bfloat16):
        raise ContractViolation(engine.name, rules.E2E_LOGITS, f"{method} returned {logits.dtype}: float32 or wider")
    wide = logits.detach().to("cpu", torch.float64)
    if bool(torch.isnan(wide).any() or torch.isposinf(wide).any()):
        raise ContractViolation(engine.name, rules.E2E_LOGITS, f"{method} returned NaN or +inf ({inputs})")
    return wide
