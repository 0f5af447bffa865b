"""FlashInfer's fused chain verifier (``flashinfer.sampling.chain_speculative_sampling``, CUDA only) as a
``--spec-model`` (registered ``flashinfer``): its conventions converted, nothing in it fixed.

The adapter reads the installed function's signature instead of assuming one version's: FlashInfer 0.5 takes a
``generator``, 0.6 and 0.7 also ``seed`` and ``offset``, and every version since 0.1.6 returns
``(output_token_ids, output_accepted_token_num, output_emitted_draft_token_num)`` (spectest's first adapter called
``.to()`` on that tuple and failed all nine properties on a GPU). A signature it cannot drive makes the model
unavailable, with the mismatch named, rather than a TypeError inside the first call.

FlashInfer's two per-row counters are kept and reported through ``spectest_counters``, so the contract holds
them to the output exactly (``spectest.protocol.check_counters``): ``output_emitted_draft_token_num`` is the
accepted draft prefix the output shows, and ``output_accepted_token_num`` counts the drafts that pass their own
acceptance test, each considered alone, so it lies between that prefix and K.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from spectest.availability import missing

LEADING = ("draft_probs", "draft_token_ids", "target_probs")  # passed positionally, in this order
ACCEPTED_COUNTER = "maybe_output_accepted_token_num"
EMITTED_COUNTER = "maybe_output_emitted_draft_token_num"
# FlashInfer adds its counts to the counters it is handed and returns those very tensors, but its kernel writes
# to their .int(): int32 is the only dtype whose counts reach the caller (any other is a copy, left at zero).
COUNTER_DTYPE = torch.int32


class UnsupportedSignature(RuntimeError):
    """The installed ``chain_speculative_sampling`` takes arguments this adapter cannot supply."""


@dataclass(frozen=True)
class CallPlan:
    """How to call one installed ``chain_speculative_sampling``, read from its signature."""

    takes_generator: bool  # else seed= and offset=, drawn from the harness's generator
    counters: tuple[str, ...]  # the counter parameters it takes (zeroed tensors are passed, added to in place)


@functools.cache
def call_plan(function: Callable[..., Any]) -> CallPlan:
    """The plan for ``function``, or :class:`UnsupportedSignature` naming what does not match (cached per
    function object, so the signature is read once per installed version)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        raise UnsupportedSignature(
            f"flashinfer's chain_speculative_sampling has no readable signature ({exc})"
        ) from None
    shown = f"the installed flashinfer's chain_speculative_sampling{inspect.signature(function)}"
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if tuple(name for name, p in parameters.items() if p.kind in positional)[: len(LEADING)] != LEADING:
        raise UnsupportedSignature(
            f"{shown} does not start with {', '.join(LEADING)}, which the adapter passes in that order: "
            "FlashInfer's API changed"
        )
    takes_generator = "generator" in parameters
    if not takes_generator and not {"seed", "offset"} <= set(parameters):
        raise UnsupportedSignature(
            f"{shown} takes neither generator= nor seed= and offset=: its random draws could not follow the "
            "harness's generator, so no run would replay"
        )
    counters = tuple(name for name in (ACCEPTED_COUNTER, EMITTED_COUNTER) if name in parameters)
    passed = {*LEADING, *counters, *(("generator",) if takes_generator else ("seed", "offset"))}
    unsupplied = [
        name
        for name, p in parameters.items()
        if name not in passed
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if unsupplied:
        raise UnsupportedSignature(
            f"{shown} requires {', '.join(map(repr, unsupplied))}, which the adapter does not supply: "
            "FlashInfer's API changed"
        )
    return CallPlan(takes_generator=takes_generator, counters=counters)


class FlashInferSampler:
    """FlashInfer's fused ``chain_speculative_sampling`` kernel, with its per-row counters checked.

    ``requires_cuda=False`` lifts the CUDA requirement for a CPU stand-in of the library: spectest's own tests
    drive the adapter through plain-torch stand-ins of each FlashInfer version (``tests/stand_ins``). The real
    library's kernels run on CUDA only, so the registered ``flashinfer`` model requires it.
    """

    spectest_capabilities = frozenset({"standard-rejection"})

    def __init__(self, *, requires_cuda: bool = True) -> None:
        self.requires_cuda = requires_cuda
        self._counters: dict[str, torch.Tensor] | None = None

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing("flashinfer", gpu=self.requires_cuda)
        if reason is not None:
            return reason
        try:
            call_plan(installed_function())
        except UnsupportedSignature as exc:
            return str(exc)
        except Exception as exc:  # an installed library that fails to import cannot run here
            return f"importing flashinfer.sampling.chain_speculative_sampling failed: {type(exc).__name__}: {exc}"
        return None

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator,
    ) -> Any:
        """One chain verification by FlashInfer, in spectest's conventions: int64 [B, K + 1], -1 padded (anything
        but FlashInfer's tuple or a tensor is returned as it came, for the contract to name)."""
        self._counters = None  # a failed call must not leave the previous call's counters to be checked
        function = installed_function()
        plan = call_plan(function)
        batch = draft_token_ids.shape[0]
        device = draft_token_ids.device
        counters = {name: torch.zeros(batch, dtype=COUNTER_DTYPE, device=device) for name in plan.counters}
        randomness: dict[str, Any] = {"generator": generator}
        if not plan.takes_generator:
            seed, offset = torch.randint(0, 2**62, (2,), generator=generator, device=generator.device).tolist()
            randomness = {"seed": seed, "offset": offset}
        out = function(
            draft_probs.float().contiguous(),
            draft_token_ids.int().contiguous(),
            target_probs.float().contiguous(),
            **counters,
            **randomness,
        )
        if isinstance(out, tuple | list) and len(out) == 3:  # (ids, accepted, emitted): every version since 0.1.6
            ids, accepted, emitted = out
        elif isinstance(out, torch.Tensor):  # a bare tensor (FlashInfer before 0.1.6): the counters handed in
            ids, accepted, emitted = out, counters.get(ACCEPTED_COUNTER), counters.get(EMITTED_COUNTER)
        else:  # anything else goes back as it came: the contract names it (rule "returns a tensor")
            return out
        if emitted is not None:
            self._counters = {"emitted_drafts": emitted}
            if accepted is not None:
                self._counters["accepted_drafts"] = accepted
        # int32 [B, K + 1] with -1 past the emitted tokens; the -1 padding survives the widening unchanged.
        return ids.to(torch.int64) if isinstance(ids, torch.Tensor) else ids

    def spectest_counters(self) -> dict[str, torch.Tensor] | None:
        """FlashInfer's per-row counters of the last call: ``emitted_drafts`` (its
        ``output_emitted_draft_token_num``) and ``accepted_drafts`` (its ``output_accepted_token_num``)."""
        return self._counters


def installed_function() -> Callable[..., Any]:
    """The installed ``flashinfer.sampling.chain_speculative_sampling`` (imported on first use)."""
    return importlib.import_module("flashinfer.sampling").chain_speculative_sampling


FLASHINFER = FlashInferSampler()
