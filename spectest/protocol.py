"""The chain-verifier protocol and the contract every call to an implementation is held to.

Every call the harness makes to a user's verifier goes through :func:`call_verify`, so a
wrong shape, a stray id, an exception or a hang becomes a :class:`ContractViolation` naming
the implementation, the rule and the input, never a harness traceback.

Protocol::

    verify(draft_token_ids, draft_probs, target_probs, generator=gen) -> emitted
      draft_token_ids: int64 [B, K]
      draft_probs:     float [B, K, V]
      target_probs:    float [B, K+1, V]   (row K is the bonus distribution)
      emitted:         int64 [B, K+1]      accepted draft prefix, one token, then -1s

Optional capabilities, discovered from the model object (methods of the same name):

    verify_logits(draft_token_ids, draft_logits, target_logits, params, generator=gen) -> emitted
      draft_logits [B, K, V], target_logits [B, K+1, V], params: SamplingParams (per-row
      temperature, top_k, top_p, min_p, seed); output exact against the *processed* target.
    propose(draft_logits, params, generator=gen) -> (draft_token_ids [B, K], draft_probs [B, K, V])
      drafted tokens must follow the reported draft_probs ("draft honesty").

    verify_tree(parents, draft_token_ids, draft_probs, target_probs, generator=gen) -> (path, token)
      a tree of drafts verified in one call (see spectest.tree_protocol; declares how its
      siblings are drafted in ``spectest_tree_drafting``).
    spectest_counters() -> {"emitted_drafts": int [B], "accepted_drafts": int [B] (optional)} or None
      the per-row counters a kernel reports of its last verify call (FlashInfer's
      output_emitted_draft_token_num and output_accepted_token_num), held to that call's output
      exactly by :func:`check_counters` (capability "counters"); None: the call reported none.

and declared ones (attribute ``spectest_capabilities``): ``standard-rejection`` (p = q means
certain acceptance), ``block-verification`` (Sun et al. 2024: held to the block tokens-per-pass
model and to accepting at least as many tokens as token-wise verification) and ``per-row-seeds`` (a row with a seed gives the same output whatever
else is in the batch). ``strided-inputs`` is on unless a model declares ``spectest_contiguous_only``:
then it gets contiguous tensors only (see spectest.cases.layouts). ``spectest_filter_order`` (default top_k, top_p, min_p) and
``spectest_sampling_params`` (default all four) say how and which parameters a model applies;
``spectest_tie_break`` how greedy rows break exact ties ("lowest-id", the default, or "any");
``ragged-drafts``: rows may carry fewer than K drafts, marked as ``spectest_draft_padding``
says: "lengths" (``verify(..., num_draft_tokens=n)``, int64 [B], vLLM's per-request counts) or
"minus-one" (draft ids past a row's count are -1, FlashInfer's padding); draft and target rows
past a row's count are padding, ``target_probs[r, n_r]`` is its bonus row, and it emits at most
n_r + 1 tokens. ``spectest_dtypes`` the probability dtypes it accepts (default float32 and float64; add
"bfloat16", "float16" for half precision, held to the distribution the half values define).
``spectest_one_hot_drafts = True``: the model takes each draft as one-hot at its token whatever
``draft_probs`` say (vLLM's ``draft_probs=None``), accepting draft x with probability p(x): the harness
plans how often each position is reached from that rule, not from min(p, q).
``spectest_speed_gate`` (a number >= 1): the speed property also fails the model when a pass
costs more than that multiple of an efficient pass (``--spec-speed-gate`` for every model).

Lossy schemes (typical acceptance, relaxed top-k) declare ``spectest_max_tv = TV`` (the largest
total variation distance per emitted token they promise) or ``spectest_lossy = True`` (no promise:
measure and report only). Their output-distribution checks then measure the TV distance with a
confidence interval instead of testing exactness (``--spec-max-tv`` does the same for any model);
every exact rule still holds.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from spectest import rules

if TYPE_CHECKING:
    import torch

PAD = -1
PARAMETERS = ("temperature", "top_k", "top_p", "min_p")
FILTERS = ("top_k", "top_p", "min_p")
# transformers applies temperature, then top-k, top-p, min-p; vLLM applies min-p before top-k/top-p.
DEFAULT_ORDER = ("top_k", "top_p", "min_p")
LOGITS = "logits"
PROPOSE = "propose"
PER_ROW_SEEDS = "per-row-seeds"
STANDARD_REJECTION = "standard-rejection"
BLOCK_VERIFICATION = "block-verification"
TREE = "tree"  # verify_tree (spectest.tree_protocol)
COUNTERS = "counters"  # spectest_counters(): per-row counters of the last verify call, checked against its output
COUNTER_NAMES = ("emitted_drafts", "accepted_drafts")  # spectest_counters()'s keys ("emitted_drafts" required)
RAGGED = "ragged-drafts"  # rows with fewer than K drafts (spectest_draft_padding says how they are marked)
DRAFT_PADDINGS = ("lengths", "minus-one")  # num_draft_tokens=[B] keyword (vLLM), or -1 draft ids (FlashInfer)
STRIDED = "strided-inputs"  # takes non-contiguous views (on unless the model declares spectest_contiguous_only)
TREE_DRAFTING = ("iid", "without-replacement", "top-k")
# How greedy decoding breaks exact ties at the top logit (``spectest_tie_break``): the lowest id,
# as torch.argmax does, or any of the tied tokens (a kernel whose reduction order varies).
TIE_BREAKS = ("lowest-id", "any")
# Probability dtypes a model accepts (``spectest_dtypes``); half precision only when declared.
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
DEFAULT_DTYPES = ("float32", "float64")


class Verifier(Protocol):
    """Anything callable with the chain-verifier signature."""

    def __call__(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator,
    ) -> torch.Tensor: ...


class ContractViolation(AssertionError):
    """An implementation broke an exact rule of the protocol (raised as a test failure)."""

    kind = "rule"  # what the results file says caught the implementation

    def __init__(self, model: str, rule: str, detail: str) -> None:
        self.model = model
        self.rule = rule
        self.detail = detail
        super().__init__(f"[{model}] broke rule '{rule}': {detail}")


@dataclass(frozen=True)
class Model:
    """A resolved implementation under test: what the user named, and the verify callable."""

    name: str
    verify: Callable[..., Any]
    source: str = ""
    # Declared (attribute ``spectest_capabilities``) plus discovered ones; reported in the header.
    capabilities: frozenset[str] = field(default_factory=frozenset)
    verify_logits: Callable[..., Any] | None = None
    propose: Callable[..., Any] | None = None
    verify_tree: Callable[..., Any] | None = None
    counters: Callable[[], Any] | None = None  # spectest_counters: the last verify call's per-row counters
    tree_drafting: str | None = None  # how its trees' siblings are drafted (TREE_DRAFTING)
    filter_order: tuple[str, ...] = DEFAULT_ORDER
    sampling_params: tuple[str, ...] = PARAMETERS
    # Why it cannot run here (an adapter whose package or GPU is missing); its properties skip.
    unavailable: str | None = None
    # Lossy mode: the declared maximum TV per emitted token (1.0: lossy, measured only); None: exact.
    max_tv: float | None = None
    tie_break: str = "lowest-id"  # greedy rows' rule for exactly tied top logits (TIE_BREAKS)
    dtypes: tuple[str, ...] = DEFAULT_DTYPES  # probability dtypes the harness hands it (DTYPE_NAMES)
    draft_padding: str = "lengths"  # how short rows are marked, with the ragged-drafts capability
    # Takes each draft as one-hot at its token (spectest_one_hot_drafts): accepts draft x with probability p(x), so
    # position i is reached with probability prod_{j<i} sum q_j p_j, where standard rejection has sum min(p_j, q_j).
    one_hot_drafts: bool = False
    # The speed property's efficiency gate the model asks for (spectest_speed_gate): its passes may
    # cost at most this multiple of an efficient pass; None: measured and reported only.
    speed_gate: float | None = None
    # Runs Triton kernels in Triton's interpreter here (spectest_interpreted, or --spec-interpret): its calls cost
    # what the interpreter costs (timed calls are not its speed), and their time limit scales with their size.
    interpreted: bool = False
    description: str | None = None  # spectest_description: what runs, for the header (e.g. whose kernels, where)

    def __str__(self) -> str:
        return self.name


TEMPERATURE = "temperature"


def validate_order(order: Iterable[str], *, what: str = "a filter order") -> tuple[str, ...]:
    """A filter order: each of FILTERS exactly once, and optionally "temperature" where the engine
    applies it (absent: first, before every filter, as transformers and vLLM do; llama.cpp filters the
    untempered logits and applies temperature last, OpenVINO GenAI between top-k and top-p)."""
    order = tuple(order)
    if sorted(o for o in order if o != TEMPERATURE) != sorted(FILTERS) or order.count(TEMPERATURE) > 1:
        raise ValueError(f"{what} must list each of {FILTERS} once (and {TEMPERATURE!r} at most once), got {order}")
    return order


def split_at_temperature(order: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(filters on the untempered distribution, filters after temperature)."""
    if TEMPERATURE not in order:
        return (), order
    at = order.index(TEMPERATURE)
    return order[:at], order[at + 1 :]


def build_model(name: str, source: str, obj: Any, verify: Callable[..., Any], module: Any = None) -> Model:
    """A Model from a user's object: declared capabilities and options, plus discovered methods."""

    def declared(attribute: str) -> Any:
        value = getattr(obj, attribute, None)
        return value if value is not None else getattr(module, attribute, None)

    verify_logits = getattr(obj, "verify_logits", None)
    propose = getattr(obj, "propose", None)
    verify_tree = getattr(obj, "verify_tree", None)
    counters = getattr(obj, "spectest_counters", None)
    capabilities = set(declared("spectest_capabilities") or ())
    capabilities |= {LOGITS} if callable(verify_logits) else set()
    capabilities |= {PROPOSE} if callable(propose) else set()
    capabilities |= {TREE} if callable(verify_tree) else set()
    capabilities |= {COUNTERS} if callable(counters) else set()
    capabilities |= set() if declared("spectest_contiguous_only") else {STRIDED}
    drafting = declared("spectest_tree_drafting")
    if callable(verify_tree) and drafting not in TREE_DRAFTING:
        raise ValueError(f"{name}: a verify_tree model must declare spectest_tree_drafting, one of {TREE_DRAFTING}")
    order = validate_order(declared("spectest_filter_order") or DEFAULT_ORDER, what=f"{name}: spectest_filter_order")
    supported = tuple(declared("spectest_sampling_params") or PARAMETERS)
    if not set(supported) <= set(PARAMETERS) or "temperature" not in supported:
        raise ValueError(f"{name}: spectest_sampling_params must include 'temperature' and lie in {PARAMETERS}")
    unavailable = getattr(obj, "spectest_unavailable", None)
    tie_break = declared("spectest_tie_break") or "lowest-id"
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"{name}: spectest_tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    dtypes = tuple(declared("spectest_dtypes") or DEFAULT_DTYPES)
    if not dtypes or not set(dtypes) <= set(DTYPE_NAMES):
        raise ValueError(f"{name}: spectest_dtypes must be a non-empty subset of {DTYPE_NAMES}, got {dtypes!r}")
    padding = declared("spectest_draft_padding") or "lengths"
    if padding not in DRAFT_PADDINGS:
        raise ValueError(f"{name}: spectest_draft_padding must be one of {DRAFT_PADDINGS}, got {padding!r}")
    gate = declared("spectest_speed_gate")
    if gate is not None:
        try:
            gate = float(gate)
        except (TypeError, ValueError):
            gate = float("nan")
        if not 1.0 <= gate < float("inf"):
            raise ValueError(
                f"{name}: spectest_speed_gate must be a finite number >= 1, got {declared('spectest_speed_gate')!r}"
            )
    reason = unavailable() if callable(unavailable) else unavailable
    # What runs, and where, is asked only of a model that can run here (an adapter answers it from the loaded code).
    description = None if reason else getattr(obj, "spectest_description", None)
    return Model(
        interpreted=bool(not reason and declared("spectest_interpreted")),
        description=str(description) if description else None,
        speed_gate=gate,
        draft_padding=padding,
        one_hot_drafts=bool(declared("spectest_one_hot_drafts")),
        dtypes=dtypes,
        tie_break=tie_break,
        max_tv=declared_max_tv(name, declared("spectest_max_tv"), declared("spectest_lossy")),
        name=name,
        unavailable=reason,
        verify=verify,
        source=source,
        capabilities=frozenset(capabilities),
        verify_logits=verify_logits if callable(verify_logits) else None,
        propose=propose if callable(propose) else None,
        verify_tree=verify_tree if callable(verify_tree) else None,
        counters=counters if callable(counters) else None,
        tree_drafting=drafting if callable(verify_tree) else None,
        filter_order=order,
        sampling_params=supported,
    )


def declared_max_tv(name: str, max_tv: Any, lossy: Any) -> float | None:
    """The lossy-mode limit a model declares: its ``spectest_max_tv``, 1.0 for a bare
    ``spectest_lossy = True``, None (exact) otherwise."""
    if max_tv is None:
        return 1.0 if lossy else None
    try:
        value = float(max_tv)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: spectest_max_tv must be a number in [0, 1], got {max_tv!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: spectest_max_tv must lie in [0, 1], got {value!r}")
    return value


def describe_inputs(draft_token_ids: torch.Tensor, target_probs: torch.Tensor) -> str:
    """A one-line description of a call's inputs, for failure messages."""
    b, k = draft_token_ids.shape
    v = target_probs.shape[-1]
    return f"B={b}, K={k}, V={v}, dtype={target_probs.dtype}, device={target_probs.device}"


@contextlib.contextmanager
def time_limit(seconds: float | None, model: str, what: str) -> Iterator[None]:
    """Turn a hang into a ContractViolation (SIGALRM; main thread on POSIX only)."""
    usable = (
        seconds
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise ContractViolation(model, rules.RETURNS_IN_TIME, f"{what} did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call_verify(
    model: Model,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    *,
    timeout: float | None = None,
    num_draft_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Call ``model`` and check every exact rule of the output; return the emitted ids. With
    ``num_draft_tokens`` [B] (a ragged-drafts model), short rows are marked as the model declares."""
    __tracebackhide__ = True
    inputs = describe_inputs(draft_token_ids, target_probs)
    ids, extra = draft_token_ids, {}
    if num_draft_tokens is not None:
        inputs += ", ragged: rows carry 0..K drafts"
        if model.draft_padding == "minus-one":
            slots = num_draft_tokens.new_tensor(range(draft_token_ids.shape[1])).unsqueeze(0)
            ids = draft_token_ids.masked_fill(slots >= num_draft_tokens.unsqueeze(1), PAD)
        else:
            extra = {"num_draft_tokens": num_draft_tokens}
    emitted = guarded_call(
        model, "verify", inputs, timeout, model.verify, ids, draft_probs, target_probs, generator=generator, **extra
    )
    check_emitted(model.name, emitted, draft_token_ids, target_probs.shape[-1], inputs, num_draft_tokens)
    if model.counters is not None:
        check_counters(model, emitted, draft_token_ids, inputs, num_draft_tokens, timeout=timeout)
    return emitted


class OutsideTheImplementation(RuntimeError):
    """A failure of something the user named beside the implementation (a reference endpoint, a scoring
    server): it passes through :func:`guarded_call` untouched, a harness-side error and no verdict."""


def guarded_call(
    model: Model, what: str, inputs: str, timeout: float | None, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Call an implementation's method; its exceptions and hangs become ContractViolations."""
    __tracebackhide__ = True
    try:
        with time_limit(timeout, model.name, f"{what}({inputs})"):
            return fn(*args, **kwargs)
    except (ContractViolation, OutsideTheImplementation):
        raise
    except Exception as exc:  # the implementation's own error: report it, don't crash the harness
        raise ContractViolation(
            model.name, rules.DOES_NOT_RAISE, f"{what}({inputs}) raised {type(exc).__name__}: {exc}"
        ) from exc


def call_verify_logits(
    model: Model,
    draft_token_ids: torch.Tensor,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    params: Any,
    generator: torch.Generator,
    *,
    timeout: float | None = None,
) -> torch.Tensor:
    """``model.verify_logits`` under the same exact output rules as :func:`call_verify`."""
    __tracebackhide__ = True
    if model.verify_logits is None:
        raise ContractViolation(model.name, "has verify_logits", "the model declares no verify_logits method")
    inputs = describe_inputs(draft_token_ids, target_logits) + ", logits with sampling parameters"
    emitted = guarded_call(
        model,
        "verify_logits",
        inputs,
        timeout,
        model.verify_logits,
        draft_token_ids,
        draft_logits,
        target_logits,
        params,
        generator=generator,
    )
    check_emitted(model.name, emitted, draft_token_ids, target_logits.shape[-1], inputs)
    return emitted


def call_propose(
    model: Model, draft_logits: torch.Tensor, params: Any, generator: torch.Generator, *, timeout: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.propose``: (draft_token_ids int64 [B, K] in [0, V), draft_probs [B, K, V], a
    distribution per row and position), checked exactly."""
    __tracebackhide__ = True
    if model.propose is None:
        raise ContractViolation(model.name, "has propose", "the model declares no propose method")
    b, k, v = draft_logits.shape
    inputs = f"B={b}, K={k}, V={v}, dtype={draft_logits.dtype}, device={draft_logits.device}"
    out = guarded_call(model, "propose", inputs, timeout, model.propose, draft_logits, params, generator=generator)
    rule = rules.PROPOSE_SHAPES
    import torch

    if not (isinstance(out, tuple | list) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise ContractViolation(model.name, rule, f"got {type(out).__name__} for {inputs}")
    tokens, probs = out
    if tuple(tokens.shape) != (b, k) or tokens.dtype != torch.int64 or tuple(probs.shape) != (b, k, v):
        raise ContractViolation(
            model.name,
            rule,
            f"got tokens {tuple(tokens.shape)} {tokens.dtype} and probs {tuple(probs.shape)} for {inputs}",
        )
    if tokens.device != draft_logits.device or probs.device != draft_logits.device:
        raise ContractViolation(model.name, rules.OUTPUT_DEVICE, f"inputs on {draft_logits.device}")
    if bool(((tokens < 0) | (tokens >= v)).any()):
        row, col = (int(i) for i in ((tokens < 0) | (tokens >= v)).nonzero()[0])
        raise ContractViolation(
            model.name, rules.DRAFTED_IDS_IN_RANGE, f"row {row} slot {col} holds {int(tokens[row, col])} ({inputs})"
        )
    wide = probs.double()
    tolerance = 1e-3 if probs.dtype in (torch.float32, torch.float64) else 2e-2
    sums = wide.sum(-1)
    bad = ~torch.isfinite(wide).all(-1) | (wide < 0).any(-1) | ((sums - 1).abs() > tolerance)
    if bool(bad.any()):
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ContractViolation(
            model.name,
            rules.DRAFT_PROBS_ARE_DISTRIBUTIONS,
            f"row {row} position {col}: sum {float(sums[row, col]):.6g}, min {float(wide[row, col].min()):.3g} "
            f"({inputs})",
        )
    return tokens, probs


def check_emitted(
    model: str,
    emitted: Any,
    draft_token_ids: torch.Tensor,
    vocab_size: int,
    inputs: str,
    num_draft_tokens: torch.Tensor | None = None,
) -> None:
    """Exact structural rules: type, shape, dtype, device, id range, and the chain shape.

    Each row must be: the first n-1 draft tokens, then one token, then -1 in every later slot;
    a row with ``num_draft_tokens`` n_r drafts emits at most n_r + 1 tokens.
    """
    __tracebackhide__ = True
    import torch

    b, k = draft_token_ids.shape
    if not isinstance(emitted, torch.Tensor):
        raise ContractViolation(model, rules.RETURNS_A_TENSOR, f"got {type(emitted).__name__} for {inputs}")
    if tuple(emitted.shape) != (b, k + 1):
        raise ContractViolation(
            model, rules.OUTPUT_SHAPE, f"expected {(b, k + 1)}, got {tuple(emitted.shape)} for {inputs}"
        )
    if emitted.dtype != torch.int64:
        raise ContractViolation(model, rules.OUTPUT_DTYPE, f"got {emitted.dtype} for {inputs}")
    if emitted.device != draft_token_ids.device:
        raise ContractViolation(model, rules.OUTPUT_DEVICE, f"got {emitted.device}, inputs on {draft_token_ids.device}")
    out_of_range = (emitted < PAD) | (emitted >= vocab_size)
    if bool(out_of_range.any()):
        row, col = (int(i) for i in out_of_range.nonzero()[0])
        raise ContractViolation(
            model,
            rules.IDS_IN_RANGE,
            f"row {row} slot {col} holds {int(emitted[row, col])} with V={vocab_size} ({inputs})",
        )
    present = emitted != PAD
    n_emitted = present.sum(dim=1)
    slots = torch.arange(k + 1, device=emitted.device)
    is_prefix = present == (slots.unsqueeze(0) < n_emitted.unsqueeze(1))
    bad = ~is_prefix.all(dim=1) | (n_emitted < 1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        raise ContractViolation(
            model,
            rules.TOKENS_THEN_PADDING,
            f"row {row} is {emitted[row].tolist()} ({inputs})",
        )
    if num_draft_tokens is not None:
        over = n_emitted > num_draft_tokens + 1
        if bool(over.any()):
            row = int(over.nonzero()[0])
            raise ContractViolation(
                model,
                rules.RAGGED_LENGTH,
                f"row {row} carries {int(num_draft_tokens[row])} drafts but emitted {int(n_emitted[row])} tokens: "
                f"{emitted[row].tolist()} (its drafts {draft_token_ids[row, : int(num_draft_tokens[row])].tolist()}; "
                f"{inputs})",
            )
    # Every token before the last emitted one must be the draft token at that slot.
    before_last = slots[:k].unsqueeze(0) < (n_emitted - 1).unsqueeze(1)
    mismatch = before_last & (emitted[:, :k] != draft_token_ids)
    if bool(mismatch.any()):
        row, col = (int(i) for i in mismatch.nonzero()[0])
        raise ContractViolation(
            model,
            rules.ACCEPTED_ARE_DRAFTS,
            f"row {row} slot {col} holds {int(emitted[row, col])} but the draft there is "
            f"{int(draft_token_ids[row, col])}, and a later slot is filled: {emitted[row].tolist()} "
            f"(drafts {draft_token_ids[row].tolist()}; {inputs})",
        )


def check_counters(
    model: Model,
    emitted: torch.Tensor,
    draft_token_ids: torch.Tensor,
    inputs: str,
    num_draft_tokens: torch.Tensor | None = None,
    *,
    timeout: float | None = None,
) -> None:
    """Hold the counters a model reports of its last verify call (``spectest_counters``) to that call's
    output, row by row, exactly: a kernel's counters feed an engine's acceptance metrics and its scheduler, so
    a counter that disagrees with the tokens is a bug even when every token is right.

    ``emitted_drafts`` [B] must equal the accepted draft prefix the output shows (its tokens less the one
    extra); ``accepted_drafts`` [B], when given, counts the drafts that pass their own acceptance test, each
    considered alone (FlashInfer's ``output_accepted_token_num``): every draft of the emitted prefix passed
    its test, so it lies between ``emitted_drafts`` and the row's number of drafts. Called after
    :func:`check_emitted`, so the output is known to be well formed.
    """
    __tracebackhide__ = True
    import torch

    counters = guarded_call(model, "spectest_counters", inputs, timeout, model.counters)
    if counters is None:
        return
    b, k = draft_token_ids.shape
    if not isinstance(counters, Mapping) or "emitted_drafts" not in counters or not set(counters) <= set(COUNTER_NAMES):
        got = sorted(counters) if isinstance(counters, Mapping) else type(counters).__name__
        raise ContractViolation(model.name, rules.COUNTERS_SHAPES, f"got {got} after verify({inputs})")
    for name, value in counters.items():
        integer = isinstance(value, torch.Tensor) and not (value.dtype.is_floating_point or value.dtype.is_complex)
        if not integer or value.dtype == torch.bool or tuple(value.shape) != (b,):
            shape = f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise ContractViolation(
                model.name, rules.COUNTERS_SHAPES, f"{name!r} is {shape}, expected int [{b}] (verify({inputs}))"
            )
    shown = emitted_lengths(emitted) - 1  # the drafts the output emits: its tokens but the extra one
    counted = counters["emitted_drafts"].to(device=emitted.device, dtype=torch.int64)
    wrong = counted != shown
    if bool(wrong.any()):
        row = int(wrong.nonzero()[0])
        raise ContractViolation(
            model.name,
            rules.COUNTED_EMITTED_DRAFTS,
            f"row {row}: the counter says {int(counted[row])} drafts emitted, the output shows {int(shown[row])}: "
            f"{emitted[row].tolist()} (drafts {draft_token_ids[row].tolist()}; {inputs})",
        )
    if "accepted_drafts" in counters:
        accepted = counters["accepted_drafts"].to(device=emitted.device, dtype=torch.int64)
        carried = torch.full_like(shown, k) if num_draft_tokens is None else num_draft_tokens.to(shown)
        outside = (accepted < shown) | (accepted > carried)
        if bool(outside.any()):
            row = int(outside.nonzero()[0])
            raise ContractViolation(
                model.name,
                rules.COUNTED_ACCEPTED_DRAFTS,
                f"row {row}: the counter says {int(accepted[row])} drafts accepted, but the output shows "
                f"{int(shown[row])} emitted and the row carries {int(carried[row])}: {emitted[row].tolist()} "
                f"(drafts {draft_token_ids[row].tolist()}; {inputs})",
            )


def emitted_lengths(emitted: torch.Tensor) -> torch.Tensor:
    """Number of tokens each row emitted (accepted drafts plus the one extra token)."""
    return (emitted != PAD).sum(dim=1)
