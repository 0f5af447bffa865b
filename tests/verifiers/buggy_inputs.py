"""Known-buggy verifiers for inputs as engines pass them (issue 19): each is the reference but for
how it reads its inputs. ``BUGS`` declares the properties that must catch each and their rules.
"""

from __future__ import annotations

import numpy as np
import torch

from spectest import rules as R
from spectest.implementations.reference import verify as reference_verify
from spectest.implementations.reference import verify_at, working_precision
from spectest.sampling import inverse_cdf_blocked

spectest_capabilities = frozenset({"standard-rejection"})
spectest_dtypes = ("float32", "float64", "bfloat16", "float16")


def contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def as_if_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """What a kernel handed only ``data_ptr()`` and the shape reads: the storage from the view's
    offset on, walked with contiguous strides."""
    return torch.as_strided(tensor, tensor.shape, contiguous_strides(tensor.shape), tensor.storage_offset())


def reads_strides_as_contiguous(draft_token_ids, draft_probs, target_probs, *, generator):
    ids, q, p = (as_if_contiguous(t) for t in (draft_token_ids, draft_probs, target_probs))
    return reference_verify(ids.clamp(0, p.shape[-1] - 1), q, p, generator=generator)


def ignores_storage_offset(draft_token_ids, draft_probs, target_probs, *, generator):
    """The reference on what a kernel handed the storage's pointer, the sizes and the strides, but not
    ``storage_offset()``, reads: the right strides from the start of the buffer, so every view that
    starts inside its buffer (any slice past an engine's first row or position) is read off by its
    offset. Exact on contiguous inputs and on every view at offset 0."""
    ids, q, p = (torch.as_strided(t, t.shape, t.stride(), 0) for t in (draft_token_ids, draft_probs, target_probs))
    return reference_verify(ids.clamp(0, p.shape[-1] - 1), q, p, generator=generator)


def residual_via_ratio(draft_token_ids, draft_probs, target_probs, *, generator):
    """The residual as p - q min(1, p/q) over the whole vocabulary: equal to max(p - q, 0), except
    that a token masked in both (p = q = 0: a grammar mask, vocabulary padding) gives 0/0 = NaN,
    and the NaN row goes to the sampler."""
    b, k = draft_token_ids.shape
    p, q = target_probs, draft_probs
    ratio = torch.clamp(p[:, :k] / q, max=1.0)
    u = torch.rand((b, k), generator=generator, device=p.device, dtype=p.dtype)
    ids = draft_token_ids.unsqueeze(-1)
    accepted = u < ratio.gather(-1, ids).squeeze(-1)
    n = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rows = torch.arange(b, device=p.device)
    residual = p[:, :k] - q * ratio
    weights = torch.where((n < k)[:, None], residual[rows, n.clamp(max=k - 1)], p[rows, n])
    extra = torch.multinomial(weights.double(), 1, generator=generator).squeeze(1)
    slots = torch.arange(k + 1, device=p.device)
    padded = torch.cat([draft_token_ids, torch.full((b, 1), -1, dtype=torch.int64, device=p.device)], dim=1)
    out = torch.where(slots < n[:, None], padded, -1)
    out[rows, n] = extra
    return out


def cumsum_in_half_precision(draft_token_ids, draft_probs, target_probs, *, generator):
    """The reference, but the extra token's inverse CDF runs over a cumulative sum kept in the
    input's dtype: in bf16 a running sum near 0.5 has a spacing of 2^-9, so once it gets there
    tokens of probability below about 0.001 add nothing and the tail of the vocabulary stalls."""
    batch, k = draft_token_ids.shape
    given = target_probs.dtype
    q, p = working_precision(draft_probs), working_precision(target_probs)
    u = torch.rand((batch, k), generator=generator, device=p.device, dtype=p.dtype)
    v = torch.rand((batch,), generator=generator, device=p.device, dtype=torch.float64)

    def sample(weights):
        cdf = weights.to(given).cumsum(-1)
        point = v.to(given)[:, None] * cdf[:, -1:]
        return torch.searchsorted(cdf, point, right=True).clamp(max=weights.shape[-1] - 1).squeeze(1)

    return verify_at(draft_token_ids, q, p, u, sample)


def cumsum_in_float16(draft_token_ids, draft_probs, target_probs, *, generator):
    """The reference, but given half-precision inputs (bf16 or fp16) the extra token's inverse CDF
    runs over a running sum kept in float16, as a kernel with a ``half`` accumulator does (numpy's
    float16 cumsum rounds every partial sum; torch's accumulates in float32 and rounds only the
    output). Its spacing is 2^-11 near 1 and 2^-14 near 0.1: at V = 1536 on a Dirichlet row the
    rounding moves a TV of about 0.1, and at V = 32000 the sum stalls far below 1, so the tail of
    the vocabulary is never drawn."""
    batch, k = draft_token_ids.shape
    half = target_probs.dtype in (torch.float16, torch.bfloat16)
    q, p = working_precision(draft_probs), working_precision(target_probs)
    u = torch.rand((batch, k), generator=generator, device=p.device, dtype=p.dtype)
    v = torch.rand((batch,), generator=generator, device=p.device, dtype=torch.float64)

    def sample(weights):
        if not half:
            return inverse_cdf_blocked(weights, v)
        values = weights.float().cpu().numpy().astype(np.float16)
        cdf = torch.from_numpy(np.cumsum(values, axis=-1, dtype=np.float16).astype(np.float64)).to(weights.device)
        point = v[:, None] * cdf[:, -1:]
        return torch.searchsorted(cdf, point, right=True).clamp(max=weights.shape[-1] - 1).squeeze(1)

    return verify_at(draft_token_ids, q, p, u, sample)


def prefix_sums_stored_in(half: torch.dtype):
    """The reference, but the extra token's inverse CDF searches prefix sums stored in ``half``: the
    running sum is exact (float32), and each prefix is rounded to the half type before the search, as
    a sampling kernel with a half-precision CDF buffer does. A token whose rounded prefix equals the
    one before it can never be drawn, and its mass goes to the next token that can: near a CDF of 1
    the float16 spacing is 2^-11 and the bfloat16 one 2^-8, so at V = 32000 only about 5,400
    (float16) or 1,050 (bfloat16) tokens of a flat row can ever be emitted. Exact TV from the target
    (``python -m tests.verifiers.buggy_inputs``): 0.71 / 0.94 on a flat row, 0.14 / 0.30 on softmax(3 z),
    0.10 / 0.10 on a row with 0.9 on one token and a tail of 0.1 (float16 / bfloat16). The pooled
    cells merge hundreds of neighbouring tokens, inside which the lumping moves mass unseen."""

    def verify(draft_token_ids, draft_probs, target_probs, *, generator):
        batch, k = draft_token_ids.shape
        q, p = working_precision(draft_probs), working_precision(target_probs)
        u = torch.rand((batch, k), generator=generator, device=p.device, dtype=p.dtype)
        v = torch.rand((batch,), generator=generator, device=p.device, dtype=torch.float64)

        def sample(weights):
            cdf = weights.float().cumsum(-1).to(half).float()
            point = v.float()[:, None] * cdf[:, -1:]
            return torch.searchsorted(cdf, point, right=True).clamp(max=weights.shape[-1] - 1).squeeze(1)

        return verify_at(draft_token_ids, q, p, u, sample)

    verify.__name__ = f"prefix_sums_stored_in_{str(half).removeprefix('torch.')}"
    return verify


prefix_sums_stored_in_float16 = prefix_sums_stored_in(torch.float16)
prefix_sums_stored_in_bfloat16 = prefix_sums_stored_in(torch.bfloat16)


def lumped_distribution(p: np.ndarray, half: torch.dtype) -> np.ndarray:
    """The exact distribution ``prefix_sums_stored_in(half)`` draws from a row ``p`` [..., V]."""
    cdf = torch.as_tensor(p, dtype=torch.float32).cumsum(-1).to(half).double().numpy()
    steps = np.diff(cdf, axis=-1, prepend=0.0).clip(min=0.0)
    return steps / steps.sum(axis=-1, keepdims=True)


PER_POSITION = "test_every_row_and_position_is_exact"
LARGE_VOCABULARY = "test_large_vocabularies_are_exact"
OUTPUT = (R.PER_POSITION, R.NEVER_IMPOSSIBLE, R.ACCEPTED_ARE_DRAFTS)
BUGS = {
    # Exact on contiguous inputs: only the property that lays inputs out as engines do sees it.
    "reads_strides_as_contiguous": {PER_POSITION: OUTPUT},
    # Exact at offset 0: every strided layout starts inside its buffer, and each is an explicit case.
    "ignores_storage_offset": {PER_POSITION: OUTPUT},
    # Lumped inside pooled cells: only an identity test that keeps every token its own cell sees it,
    # on the large-vocabulary property's language-model-like rows.
    "prefix_sums_stored_in_float16": {LARGE_VOCABULARY: (R.PER_POSITION,)},
    "prefix_sums_stored_in_bfloat16": {LARGE_VOCABULARY: (R.PER_POSITION,)},
    # Exact until a token is masked on both sides; the per-position property's explicit case masks tails.
    "residual_via_ratio": {PER_POSITION: (*OUTPUT, R.DOES_NOT_RAISE, R.IDS_IN_RANGE)},
    # Exact in float32 and float64: the per-position property's explicit case is bf16 for models that take it.
    "cumsum_in_half_precision": {PER_POSITION: OUTPUT},
    # Exact in float32 and float64 and at small V: the large-vocabulary property reaches each declared
    # half dtype at V = 32000 and beyond, where the float16 running sum stalls.
    "cumsum_in_float16": {LARGE_VOCABULARY: OUTPUT},
}
ONLY = ("reads_strides_as_contiguous", "ignores_storage_offset")


class IgnoresDraftCounts:
    """Declares ragged drafts, then verifies every row as if it carried K: a short row runs on
    into its padding and emits more tokens than it drafted."""

    spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator, num_draft_tokens=None):
        return reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)


class BonusFromLastPosition:
    """Stops each row at its count, but draws a full row's bonus from target_probs[:, K] (the last
    position of the padded batch) instead of target_probs[r, n_r]."""

    spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator, num_draft_tokens=None):
        if num_draft_tokens is None:
            return reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)
        rows = torch.arange(target_probs.shape[0], device=target_probs.device)
        moved = target_probs.clone()
        moved[rows, num_draft_tokens] = target_probs[:, -1]
        return reference_verify(
            draft_token_ids, draft_probs, moved, generator=generator, num_draft_tokens=num_draft_tokens
        )


ignores_draft_counts = IgnoresDraftCounts()
bonus_from_last_position = BonusFromLastPosition()
RAGGED = "test_short_rows_emit_at_most_their_drafts_plus_one"
# Both read padding rows: where an engine left zeros there, what they sample from them is garbage.
BUGS["ignores_draft_counts"] = {RAGGED: (R.RAGGED_LENGTH, R.IDS_IN_RANGE, R.NEVER_IMPOSSIBLE)}
BUGS["bonus_from_last_position"] = {RAGGED: (R.PER_POSITION, R.NEVER_IMPOSSIBLE, R.IDS_IN_RANGE)}
ONLY += ("ignores_draft_counts", "bonus_from_last_position")


class VerifiesPaddingThenCuts:
    """Declares ragged drafts, verifies every slot as if each row carried K drafts (the padding
    included), then cuts each row to n_r + 1 tokens. Exact when the padding ids happen to be honest
    draws from the padding q (a speculative step against any draft is exact), wrong when they hold
    what an engine's buffers hold: the row's (n_r + 1)-th token is a padding id accepted against
    padding, or a correction against it, instead of the bonus from p at n_r."""

    spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator, num_draft_tokens=None):
        emitted = reference_verify(draft_token_ids, draft_probs, target_probs, generator=generator)
        if num_draft_tokens is None:
            return emitted
        slots = torch.arange(emitted.shape[1], device=emitted.device)
        return emitted.masked_fill(slots.unsqueeze(0) > num_draft_tokens.unsqueeze(1), -1)


verifies_padding_then_cuts = VerifiesPaddingThenCuts()
BUGS["verifies_padding_then_cuts"] = {RAGGED: (R.PER_POSITION, R.NEVER_IMPOSSIBLE)}
ONLY += ("verifies_padding_then_cuts",)


if __name__ == "__main__":  # the exact TV of the half-precision prefix-sum bugs on the rows their docstring names
    from spectest.cases.toy_models import target_distributions

    rng = np.random.default_rng(0)
    rows = {
        "flat (Dirichlet(1))": rng.dirichlet(np.ones(32000)),
        "softmax(3 z)": np.exp(3 * rng.standard_normal(32000)),
        "0.9 on one token, a tail of 0.1": target_distributions(rng, 1, 32000, "peaky")[0],
    }
    for name, row in rows.items():
        row = row / row.sum()
        tvs = [0.5 * np.abs(lumped_distribution(row, half) - row).sum() for half in (torch.float16, torch.bfloat16)]
        print(f"V = 32000, {name}: TV {tvs[0]:.3f} (float16), {tvs[1]:.3f} (bfloat16)")
