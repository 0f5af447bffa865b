"""A CPU stand-in for ``flashinfer.sampling``: ``chain_speculative_sampling`` in each shape FlashInfer has had,
in plain torch, exact, filling FlashInfer's counters as its kernel does.

``SPECTEST_FLASHINFER_STAND_IN`` picks the shape ``chain_speculative_sampling`` has in this module (a key of
``SHAPES``; default ``"0.7"``), so that a run through the plugin drives the adapter through one shape per process.
In process, a test sets the module attribute instead.

The real shapes, read from FlashInfer's source (``flashinfer/sampling.py`` at the git tags v0.5.0 to v0.5.3,
v0.6.0 to v0.6.18rc7, and the 0.7.0 and 0.7.4 wheels' ``flashinfer/sampling.py`` and
``include/flashinfer/sampling.cuh``):

* ``"0.5"``: ``(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
  maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None)``.
* ``"0.6"``: the same plus ``seed=None, offset=None`` (ints; from 0.6.10 also int64 tensors, for CUDA graphs),
  which take the place of the generator's state when both are given.
* ``"0.7"``: the signature of 0.6, unchanged. What changed is the accepted counter: up to 0.7.0 the kernel
  re-tests the first rejected draft with a fresh uniform (and counts it when that passes); 0.7.4 consumes the
  uniform without counting it. This stand-in counts as 0.7.4 does.

All return ``(output_token_ids int32 [B, K + 1] padded with -1, output_accepted_token_num int32 [B],
output_emitted_draft_token_num int32 [B])``, and add the counts to counters handed in, in place: the wrapper calls
``.int()`` on them, so an int32 counter is written and any other dtype is a copy the caller never sees (mirrored
here). ``emitted`` is the accepted draft prefix; ``accepted`` is that prefix plus the later drafts that pass
their own test, ``u * q(d) < p(d)`` with a fresh uniform each, so ``emitted <= accepted <= K``.

The other shapes are not FlashInfer's: a seed-and-offset-only and a bare-tensor return (the adapter's other
paths), a doctored emitted counter, and three API changes the adapter must name.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from spectest.implementations.reference import verify as exact_chain


def _chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    accepted_counter: torch.Tensor | None,
    emitted_counter: torch.Tensor | None,
    generator: torch.Generator | None,
    seed: int | None = None,
    offset: int | None = None,
    *,
    retest_first_rejected: bool,
    emitted_off_by_one: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain (spectest's exact reference, on FlashInfer's float32 inputs), then the counters as FlashInfer's
    kernel fills them; the return value is FlashInfer's tuple."""
    draft_probs, target_probs = draft_probs.float(), target_probs.float()  # as FlashInfer's wrapper converts
    ids = draft_token_ids.int().long()
    batch, k = ids.shape
    if seed is not None and offset is not None:  # FlashInfer: an explicit seed and offset replace the generator
        generator = torch.Generator(device=draft_probs.device).manual_seed((seed * 1_000_003 + offset) % 2**63)
    elif generator is None:
        generator = torch.default_generator
    out = exact_chain(ids, draft_probs, target_probs, generator=generator)
    prefix = (out != -1).sum(dim=1) - 1  # the drafts the output emits
    # The kernel's second loop: a fresh uniform for each draft after the prefix, counted when u * q(d) < p(d).
    u = torch.rand((batch, k), generator=generator, device=draft_probs.device)
    q = draft_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    p = target_probs[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    first_counted = prefix if retest_first_rejected else prefix + 1
    later = (torch.arange(k, device=ids.device) >= first_counted.unsqueeze(1)) & (u * q < p)
    # FlashInfer's wrapper allocates int32 zeros for a counter not handed in, returns the counters it was handed,
    # and lets the kernel add to their .int(): the very tensor when int32, a copy the caller never sees otherwise.
    zeros = torch.zeros(batch, dtype=torch.int32, device=ids.device)
    accepted = zeros.clone() if accepted_counter is None else accepted_counter
    emitted = zeros.clone() if emitted_counter is None else emitted_counter
    written_accepted, written_emitted = accepted.int(), emitted.int()
    written_accepted += (prefix + later.sum(dim=1)).int()
    written_emitted += prefix.int()
    if emitted_off_by_one:  # the doctored counter: one too many on every even row (row 0 of any batch)
        written_emitted += (torch.arange(batch, device=ids.device) % 2 == 0).int()
    return out.int(), accepted, emitted


def chain_speculative_sampling_0_5(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
):
    """FlashInfer 0.5.x."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        generator,
        retest_first_rejected=True,
    )


def chain_speculative_sampling_0_6(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    offset: int | None = None,
):
    """FlashInfer 0.6.x (and 0.7.0, whose kernel still re-tests the first rejected draft)."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        generator,
        seed,
        offset,
        retest_first_rejected=True,
    )


def chain_speculative_sampling_0_7(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    offset: int | None = None,
):
    """FlashInfer 0.7.x as of 0.7.4: 0.6's signature; the first rejected draft is not counted as accepted."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        generator,
        seed,
        offset,
        retest_first_rejected=False,
    )


def chain_speculative_sampling_seed_offset_only(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    seed: int | None = None,
    offset: int | None = None,
):
    """Not a FlashInfer release: randomness through seed and offset only (the adapter derives them)."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        None,
        seed,
        offset,
        retest_first_rejected=False,
    )


def chain_speculative_sampling_bare_tensor(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
):
    """Not a FlashInfer release: the output ids alone (as before 0.1.6), the counts only in the counters handed in."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        generator,
        retest_first_rejected=False,
    )[0]


def chain_speculative_sampling_doctored_emitted(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    offset: int | None = None,
):
    """0.7's shape and exact tokens, but an emitted counter one too many on every even row."""
    return _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        maybe_output_accepted_token_num,
        maybe_output_emitted_draft_token_num,
        generator,
        seed,
        offset,
        retest_first_rejected=False,
        emitted_off_by_one=True,
    )


def chain_speculative_sampling_renamed_argument(
    draft_probs,
    draft_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
):
    """An API change: the second argument renamed (a call by position would still run, on whatever it now means)."""
    raise AssertionError("the adapter must not call a chain_speculative_sampling whose arguments it does not know")


def chain_speculative_sampling_required_argument(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    *,
    num_speculative_tokens: torch.Tensor,
):
    """An API change: a new argument without a default, which the adapter does not supply."""
    raise AssertionError("the adapter must not call a chain_speculative_sampling whose arguments it does not know")


def chain_speculative_sampling_no_generator(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
):
    """An API change: no generator, no seed and offset, so the draws could not follow the harness's generator."""
    raise AssertionError("the adapter must not call a chain_speculative_sampling it cannot seed")


SHAPES: dict[str, Callable[..., object]] = {
    "0.5": chain_speculative_sampling_0_5,
    "0.6": chain_speculative_sampling_0_6,
    "0.7": chain_speculative_sampling_0_7,
    "seed-offset-only": chain_speculative_sampling_seed_offset_only,
    "bare-tensor": chain_speculative_sampling_bare_tensor,
    "doctored-emitted": chain_speculative_sampling_doctored_emitted,
    "renamed-argument": chain_speculative_sampling_renamed_argument,
    "required-argument": chain_speculative_sampling_required_argument,
    "no-generator": chain_speculative_sampling_no_generator,
}
chain_speculative_sampling = SHAPES[os.environ.get("SPECTEST_FLASHINFER_STAND_IN", "0.7")]
