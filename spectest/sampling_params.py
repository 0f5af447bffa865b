"""Per-row sampling parameters, and the distribution plain sampling with them gives.

Engines hand the verifier logits plus per-request parameters, not clean probabilities. The
*processed* distribution of a row is what ordinary (non-speculative) sampling with that row's
parameters draws from: ``softmax(logits / temperature)``, then each filter in the model's
declared order, renormalising after each; temperature 0 means greedy (one-hot at the first
argmax of the raw logits). Speculative output must follow the processed target exactly.

Conventions (one tensor of length B per parameter):

* ``temperature``: float, 0 means greedy.
* ``top_k``: int, keep the k most likely tokens; 0 (or >= V) means off.
* ``top_p``: float, keep the smallest most-likely set whose mass reaches top_p; 1 means off.
* ``min_p``: float, keep tokens with probability >= min_p * the row's top probability; 0 means off.
* ``seed``: int, a row's own random stream (capability ``per-row-seeds``); -1 means none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import torch

from spectest.protocol import DEFAULT_ORDER, FILTERS, PARAMETERS, split_at_temperature, validate_order

__all__ = ["DEFAULT_ORDER", "FILTERS", "PARAMETERS", "SamplingParams", "process_logits"]

NO_SEED = -1


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters per row of a batch (see the module docstring)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor

    @classmethod
    def build(
        cls,
        batch: int,
        *,
        temperature: float | Iterable[float] = 1.0,
        top_k: int | Iterable[int] = 0,
        top_p: float | Iterable[float] = 1.0,
        min_p: float | Iterable[float] = 0.0,
        seed: int | Iterable[int] = NO_SEED,
        device: torch.device | str = "cpu",
    ) -> SamplingParams:
        """Parameters for ``batch`` rows: a scalar applies to every row, an iterable gives one per row."""

        def column(value: float | Iterable[float], dtype: torch.dtype) -> torch.Tensor:
            if isinstance(value, int | float):
                return torch.full((batch,), value, dtype=dtype, device=device)
            tensor = torch.as_tensor(list(value), dtype=dtype, device=device)
            if tensor.shape != (batch,):
                raise ValueError(f"expected {batch} values, got shape {tuple(tensor.shape)}")
            return tensor

        params = cls(
            temperature=column(temperature, torch.float32),
            top_k=column(top_k, torch.int64),
            top_p=column(top_p, torch.float32),
            min_p=column(min_p, torch.float32),
            seed=column(seed, torch.int64),
        )
        params.validate()
        return params

    def validate(self) -> None:
        """Reject values no sampler could honour (negative temperature, top_p outside (0, 1], ...)."""
        b = self.batch_size
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, torch.Tensor) or value.shape != (b,):
                raise ValueError(f"SamplingParams.{f.name} must be a tensor of shape [{b}]")
        if not bool(torch.isfinite(self.temperature).all()) or bool((self.temperature < 0).any()):
            raise ValueError("temperature must be finite and >= 0 (0 means greedy)")
        if bool((self.top_k < 0).any()):
            raise ValueError("top_k must be >= 0 (0 means off)")
        if bool(((self.top_p <= 0) | (self.top_p > 1)).any()):
            raise ValueError("top_p must lie in (0, 1] (1 means off)")
        if bool(((self.min_p < 0) | (self.min_p > 1)).any()):
            raise ValueError("min_p must lie in [0, 1] (0 means off)")

    @property
    def batch_size(self) -> int:
        return int(self.temperature.shape[0])

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    def map(self, fn) -> SamplingParams:
        return SamplingParams(**{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str) -> SamplingParams:
        return self.map(lambda t: t.to(device))

    def repeat(self, times: int) -> SamplingParams:
        """``times`` copies stacked (copy r of row b is row r * B + b), as the harness repeats inputs."""
        return self.map(lambda t: t.repeat(times))

    def take(self, rows: torch.Tensor) -> SamplingParams:
        return self.map(lambda t: t[rows.to(t.device)])

    @classmethod
    def cat(cls, parts: Iterable[SamplingParams]) -> SamplingParams:
        """Batches stacked one after another."""
        parts = list(parts)
        return cls(**{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    def clone(self) -> SamplingParams:
        return self.map(torch.clone)

    def equal(self, other: SamplingParams) -> bool:
        return all(torch.equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    def describe_row(self, row: int) -> str:
        if float(self.temperature[row]) == 0:
            text = "greedy"
        else:
            parts = [f"T={float(self.temperature[row]):.3g}"]
            if 0 < int(self.top_k[row]):
                parts.append(f"top_k={int(self.top_k[row])}")
            if float(self.top_p[row]) < 1:
                parts.append(f"top_p={float(self.top_p[row]):.4g}")
            if float(self.min_p[row]) > 0:
                parts.append(f"min_p={float(self.min_p[row]):.4g}")
            text = " ".join(parts)
        return text + (f" seed={int(self.seed[row])}" if int(self.seed[row]) != NO_SEED else "")


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, 1] in ``like``'s dtype, to broadcast over positions and vocabulary."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, *([1] * (like.dim() - 1)))


def filter_active(name: str, values: torch.Tensor, vocab: int) -> torch.Tensor:
    """Rows where a filter changes anything (0 < top_k < V, top_p < 1, min_p > 0)."""
    if name == "top_k":
        return (values > 0) & (values < vocab)
    return values < 1 if name == "top_p" else values > 0


def _filter_sorted(
    probs: torch.Tensor, names: tuple[str, ...], values: dict[str, torch.Tensor], active: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The filters in order, renormalised, from a single sort: top-k keeps the tokens at least as
    likely as the k-th most likely; top-p the smallest most-likely set whose mass reaches top_p (a
    token stays if the mass strictly before it, in descending order, is below top_p); min-p the
    tokens with probability >= min_p times the top one; each on what the filters before it kept,
    renormalised. Every filter keeps a prefix of the descending order (the most likely token
    always stays), so what survives is a prefix too: each filter shortens a per-row prefix length,
    one comparison along the sorted rows. ``tests/test_sampling_params.py`` holds this to a
    written-out per-row definition.

    The kept prefix is written back without a scatter where it ends between two different values
    (it is then every token at least as likely as its last one); only a row whose prefix splits a
    tie (top-p can) is sorted again, with indices, and takes that sort's order among the tied tokens."""
    ordered = descending(probs)
    vocab = ordered.shape[-1]
    kept = torch.full(ordered.shape[:-1], vocab, dtype=torch.int64, device=ordered.device)  # prefix lengths
    positions = torch.arange(vocab, device=ordered.device)
    for name in names:
        on = active[name].view(-1, *([1] * (ordered.dim() - 2)))
        if name == "top_k":
            k = values[name].clamp(1, vocab).view(-1, *([1] * (ordered.dim() - 1))).expand(*ordered.shape[:-1], 1)
            cut = (ordered >= ordered.gather(-1, k - 1)).sum(dim=-1)
        else:
            current = torch.where(positions < kept.unsqueeze(-1), ordered, 0.0)
            current = current / current.sum(dim=-1, keepdim=True)
            if name == "top_p":
                cut = (current.cumsum(dim=-1) - current < _per_row(values[name], ordered)).sum(dim=-1)
            else:
                cut = (current >= _per_row(values[name], ordered) * current[..., :1]).sum(dim=-1)
        kept = torch.where(on, torch.minimum(kept, cut), kept)
    last = ordered.gather(-1, (kept - 1).unsqueeze(-1))
    following = ordered.gather(-1, kept.clamp(max=vocab - 1).unsqueeze(-1))
    clean = (kept == vocab) | (following.squeeze(-1) < last.squeeze(-1))  # no tie split at the prefix's end
    out = torch.where(probs >= last, probs, 0.0)
    if not bool(clean.all()):
        split = ~clean
        tied, index = probs[split].sort(dim=-1, descending=True)
        in_order = torch.where(positions < kept[split].unsqueeze(-1), tied, 0.0)
        out[split] = torch.zeros_like(in_order).scatter_(-1, index, in_order)
    return out / out.sum(dim=-1, keepdim=True)


def descending(probs: torch.Tensor) -> torch.Tensor:
    """Each row's values in descending order. On a CPU, float32 and float64 rows are sorted by numpy (a vectorised
    quicksort, about six times torch's sort there; the values only, which is all a prefix length needs)."""
    if probs.device.type != "cpu" or probs.dtype not in (torch.float32, torch.float64) or probs.requires_grad:
        return probs.sort(dim=-1, descending=True).values
    return torch.from_numpy(np.ascontiguousarray(np.sort(probs.numpy(), axis=-1)[..., ::-1]))


def process_logits(
    logits: torch.Tensor, params: SamplingParams, *, order: Iterable[str] = DEFAULT_ORDER
) -> torch.Tensor:
    """The processed distribution [B, N, V] of logits [B, N, V] (float math in logits' dtype).
    ``order`` lists the filters in the order applied, and "temperature" where it applies (first when
    absent): filters before it cut the untempered distribution, the tempered one keeps what they kept."""
    greedy = params.greedy.to(logits.device)
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    before, after = split_at_temperature(validate_order(order))
    vocab = logits.shape[-1]
    values = {name: getattr(params, name).to(logits.device) for name in (*before, *after)}
    active = {name: filter_active(name, values[name], vocab) & ~greedy for name in values}
    probs = torch.softmax(logits / _per_row(temperature, logits), dim=-1)  # this call's own: changed in place
    if before:
        cut = _filtered(torch.softmax(logits, dim=-1), before, values, active)
        if cut is not None:
            rows, untempered = cut
            kept = probs[rows] * (untempered > 0)
            probs.index_copy_(0, rows, kept / kept.sum(dim=-1, keepdim=True))
    filtered = _filtered(probs, after, values, active)
    if filtered is not None:
        rows, kept = filtered
        probs.index_copy_(0, rows, kept)
    if not bool(greedy.any()):
        return probs
    rows = greedy.nonzero().flatten()
    probs.index_copy_(0, rows, torch.nn.functional.one_hot(logits[rows].argmax(dim=-1), vocab).to(probs.dtype))
    return probs


def _filtered(
    probs: torch.Tensor, names: tuple[str, ...], values: dict[str, torch.Tensor], active: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rows, their filtered distributions) for the rows where ``names`` cut anything; None if none does."""
    if not names:
        return None
    rows = torch.stack([active[n] for n in names]).any(dim=0).nonzero().flatten()
    if not rows.numel():  # only the rows that filter anything, sorted once: each filter keeps a prefix of that order
        return None
    if "top_p" not in names:  # top-k and min-p are thresholds: no sort needed
        return rows, _filter_thresholds(
            probs[rows], {n: values[n][rows] for n in names}, {n: active[n][rows] for n in names}
        )
    sorted_rows = active["top_p"][rows]
    out = torch.empty_like(probs[rows])
    for part, where in ((True, sorted_rows), (False, ~sorted_rows)):
        chosen = rows[where]
        if not chosen.numel():
            continue
        picked = {n: values[n][chosen] for n in names}, {n: active[n][chosen] for n in names}
        out[where] = (
            _filter_sorted(probs[chosen], names, *picked) if part else _filter_thresholds(probs[chosen], *picked)
        )
    return rows, out


def _filter_thresholds(
    probs: torch.Tensor, values: dict[str, torch.Tensor], active: dict[str, torch.Tensor]
) -> torch.Tensor:
    """Top-k and min-p without a sort, in any order, renormalised: each keeps the tokens at or above a threshold
    (the k-th largest probability of the row; min_p times the row's largest, which every filter keeps and
    renormalising scales alike), so together they keep the tokens at or above the larger threshold, the set
    :func:`_filter_sorted` keeps for these rows."""
    vocab = probs.shape[-1]
    threshold = torch.zeros((*probs.shape[:-1], 1), dtype=probs.dtype, device=probs.device)
    shape = (-1, *([1] * (probs.dim() - 1)))
    if "top_k" in values and bool(active["top_k"].any()):
        k = values["top_k"].clamp(1, vocab)
        top = probs.topk(int(k[active["top_k"]].max()), dim=-1).values
        kth = top.gather(
            -1, (torch.minimum(k, torch.tensor(top.shape[-1])) - 1).view(shape).expand(*probs.shape[:-1], 1)
        )
        threshold = torch.where(active["top_k"].view(shape), torch.maximum(threshold, kth), threshold)
    if "min_p" in values and bool(active["min_p"].any()):
        floor = _per_row(values["min_p"], probs) * probs.amax(dim=-1, keepdim=True)
        threshold = torch.where(active["min_p"].view(shape), torch.maximum(threshold, floor), threshold)
    kept = torch.where(probs >= threshold, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)
