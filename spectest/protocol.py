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
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

PAD = -1


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
    # Capabilities a model declares (attribute ``spectest_capabilities``); reported in the header.
    capabilities: frozenset[str] = field(default_factory=frozenset)

    def __str__(self) -> str:
        return self.name


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
        raise ContractViolation(model, "returns in time", f"{what} did not return within {seconds} s")

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
) -> torch.Tensor:
    """Call ``model`` and check every exact rule of the output; return the emitted ids."""
    __tracebackhide__ = True
    inputs = describe_inputs(draft_token_ids, target_probs)
    try:
        with time_limit(timeout, model.name, f"verify({inputs})"):
            emitted = model.verify(draft_token_ids, draft_probs, target_probs, generator=generator)
    except ContractViolation:
        raise
    except Exception as exc:  # the implementation's own error: report it, don't crash the harness
        raise ContractViolation(
            model.name, "does not raise", f"verify({inputs}) raised {type(exc).__name__}: {exc}"
        ) from exc
    check_emitted(model.name, emitted, draft_token_ids, target_probs.shape[-1], inputs)
    return emitted


def check_emitted(model: str, emitted: Any, draft_token_ids: torch.Tensor, vocab_size: int, inputs: str) -> None:
    """Exact structural rules: type, shape, dtype, device, id range, and the chain shape.

    Each row must be: the first n-1 draft tokens, then one token, then -1 in every later slot.
    """
    __tracebackhide__ = True
    import torch

    b, k = draft_token_ids.shape
    if not isinstance(emitted, torch.Tensor):
        raise ContractViolation(model, "returns a tensor", f"got {type(emitted).__name__} for {inputs}")
    if tuple(emitted.shape) != (b, k + 1):
        raise ContractViolation(
            model, "output shape is [B, K+1]", f"expected {(b, k + 1)}, got {tuple(emitted.shape)} for {inputs}"
        )
    if emitted.dtype != torch.int64:
        raise ContractViolation(model, "output dtype is int64", f"got {emitted.dtype} for {inputs}")
    if emitted.device != draft_token_ids.device:
        raise ContractViolation(
            model, "output on the input device", f"got {emitted.device}, inputs on {draft_token_ids.device}"
        )
    out_of_range = (emitted < PAD) | (emitted >= vocab_size)
    if bool(out_of_range.any()):
        row, col = (int(i) for i in out_of_range.nonzero()[0])
        raise ContractViolation(
            model,
            "ids lie in [0, V) or are -1 padding",
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
            "tokens then -1 padding, at least one token",
            f"row {row} is {emitted[row].tolist()} ({inputs})",
        )
    # Every token before the last emitted one must be the draft token at that slot.
    before_last = slots[:k].unsqueeze(0) < (n_emitted - 1).unsqueeze(1)
    mismatch = before_last & (emitted[:, :k] != draft_token_ids)
    if bool(mismatch.any()):
        row, col = (int(i) for i in mismatch.nonzero()[0])
        raise ContractViolation(
            model,
            "accepted tokens are the draft prefix",
            f"row {row} slot {col} holds {int(emitted[row, col])} but the draft there is "
            f"{int(draft_token_ids[row, col])}, and a later slot is filled: {emitted[row].tolist()} "
            f"(drafts {draft_token_ids[row].tolist()}; {inputs})",
        )


def emitted_lengths(emitted: torch.Tensor) -> torch.Tensor:
    """Number of tokens each row emitted (accepted drafts plus the one extra token)."""
    return (emitted != PAD).sum(dim=1)
