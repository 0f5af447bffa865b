"""Ragged batches as engines leave them: rows with fewer than K drafts, and whatever fills the rest.

An engine that batches requests of different draft lengths pads each short row out to K. What
the padding holds is whatever its buffers held: token 0 or V - 1, the target's favourite, the
row's last real draft repeated, another row's stale ids, or honest draws; its probability rows
zeros, a copy of the row's last real row, a uniform row, or the target's own row. A verifier that
reads only a row's first n_r drafts cannot tell; one that verifies every slot and cuts the row
to n_r + 1 tokens afterwards is exact only when the padding happens to be an honest draft (a
correct speculative step against a uniform draft is still exact), so every scheme is drawn.

Row r carries n_r drafts: its drafts and draft rows at slots >= n_r are padding, its target row
at slot n_r is its bonus row (real), and its target rows past n_r are padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from spectest.cases.chain import ChainCase, build_chain

# What the padded draft ids hold (before the model's marking: "minus-one" models see -1 there).
PADDING_IDS = ("zero", "last-id", "target-argmax", "last-draft", "other-row", "honest")
# What the padded probability rows hold.
PADDING_ROWS = ("zeros", "last-real", "uniform", "target")


@dataclass(frozen=True)
class RaggedCase:
    """A chain case cut into rows of 0..K drafts, and what its padding holds."""

    chain: ChainCase
    padding_ids: str = "honest"
    draft_padding: str = "uniform"
    target_padding: str = "uniform"


@st.composite
def ragged_cases(draw: st.DrawFn, chain: st.SearchStrategy[ChainCase]) -> RaggedCase:
    return RaggedCase(
        draw(chain),
        draw(st.sampled_from(PADDING_IDS)),
        draw(st.sampled_from(PADDING_ROWS)),
        draw(st.sampled_from(PADDING_ROWS)),
    )


@dataclass(frozen=True)
class RaggedInputs:
    """Arrays of a ragged case: what the model is handed, and the exact distributions it is held to."""

    target: np.ndarray  # [B, K + 1, V] handed to the model (padding rows as the case says)
    draft: np.ndarray  # [B, K, V] handed to the model
    target_exact: np.ndarray  # [B, K + 1, V] the real rows (padding rows are never reached)
    draft_exact: np.ndarray  # [B, K, V] the real rows; the distribution padding ids are honestly drawn from
    lengths: np.ndarray  # [B] drafts per row


def _padding_rows(scheme: str, real: np.ndarray, last_real: np.ndarray, target: np.ndarray) -> np.ndarray:
    """What padded probability rows hold: ``real`` [B, S, V] rows as built, ``last_real`` [B, V]
    the row's last real row, ``target`` [B, S, V] the target's rows at the same slots."""
    if scheme == "zeros":
        return np.zeros_like(real)
    if scheme == "last-real":
        return np.broadcast_to(last_real[:, None, :], real.shape)
    if scheme == "uniform":
        return np.full_like(real, 1.0 / real.shape[-1])
    if scheme == "target":
        return target
    raise ValueError(f"unknown padding rows {scheme!r}; choose from {PADDING_ROWS}")


def build_ragged(case: RaggedCase) -> RaggedInputs:
    """Lengths (every case has an empty row and a full one) and the padded arrays."""
    chain = case.chain
    target, draft = build_chain(chain)
    rng = np.random.default_rng(chain.seed + 2)
    lengths = rng.integers(0, chain.k + 1, size=chain.batch)
    lengths[:2] = (0, chain.k)
    rows = np.arange(chain.batch)
    slots = np.arange(chain.k + 1)
    uniform = np.full(chain.vocab, 1.0 / chain.vocab)
    last_draft = np.where((lengths > 0)[:, None], draft[rows, np.maximum(lengths - 1, 0)], uniform)
    bonus = target[rows, lengths]
    past_bonus = (slots[None, :] > lengths[:, None])[..., None]
    past_drafts = (slots[None, : chain.k] >= lengths[:, None])[..., None]
    target_given = np.where(past_bonus, _padding_rows(case.target_padding, target, bonus, target), target)
    draft_given = np.where(
        past_drafts, _padding_rows(case.draft_padding, draft, last_draft, target_given[:, : chain.k]), draft
    )
    # Padding ids drawn "honestly" come from the padding rows, or from a uniform row where those are zero.
    draft_exact = np.where(past_drafts & (draft_given.sum(-1, keepdims=True) > 0), draft_given, draft)
    draft_exact = np.where(past_drafts & ~(draft_given.sum(-1, keepdims=True) > 0), uniform, draft_exact)
    return RaggedInputs(target_given, draft_given, target, draft_exact, lengths)


def pad_draft_ids(drafts: torch.Tensor, lengths: torch.Tensor, scheme: str, target: torch.Tensor) -> torch.Tensor:
    """Draft ids [N, K] (drawn honestly from the padded rows) with the slots past each row's count
    (``lengths`` [N]) filled as an engine's buffer would leave them; ``target`` [N, K + 1, V]."""
    n, k = drafts.shape
    slots = torch.arange(k, device=drafts.device)
    padded = slots.unsqueeze(0) >= lengths.unsqueeze(1)
    if scheme == "honest":
        return drafts
    if scheme == "zero":
        fill = torch.zeros_like(drafts)
    elif scheme == "last-id":
        fill = torch.full_like(drafts, target.shape[-1] - 1)
    elif scheme == "target-argmax":
        fill = target[:, :k].argmax(dim=-1)
    elif scheme == "last-draft":
        last = drafts.gather(1, (lengths - 1).clamp_min(0).unsqueeze(1))
        fill = torch.where(lengths.unsqueeze(1) > 0, last, 0).expand(n, k)
    elif scheme == "other-row":
        fill = drafts.roll(1, dims=0)  # the neighbouring row's ids: stale from another request
    else:
        raise ValueError(f"unknown padding ids {scheme!r}; choose from {PADDING_IDS}")
    return torch.where(padded, fill, drafts)
