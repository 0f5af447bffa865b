"""Seeded categorical sampling shared by the reference sampler and the harness loop."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

# Same-size integers: 16-bit floats are copied and gathered as bits (torch's bfloat16 copies and index_select run
# several times slower on a CPU than the same bytes as int16).
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (every draw must come from one)."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(int(seed) % (2**63))
    return gen


@contextlib.contextmanager
def global_rng_from(generator: torch.Generator) -> Iterator[None]:
    """Seed torch's global RNG (CPU and the generator's CUDA device) from ``generator`` for the
    duration, restoring the caller's state afterwards."""
    device = generator.device
    cuda = [device.index or 0] if device.type == "cuda" else []
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        yield


def sample_categorical(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``weights`` [..., V] (unnormalised, non-negative) by inverse CDF.

    A token of weight zero is never returned: the search lands on the first cell whose
    cumulative weight exceeds the uniform, and a rounding overshoot is clamped to the last
    cell of positive weight rather than to V - 1.
    """
    return RepeatedCategorical(weights).sample(1, generator)[0]


BLOCK = 256


def inverse_cdf_blocked(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One inverse-CDF draw per row of ``weights`` [N, V] at uniforms ``u`` [N], reading the
    weights once: block sums locate the block, and only that block's cells are summed in order.

    Same contract as :func:`sample_categorical` (never a zero-weight cell: a rounding overshoot is
    clamped to the last cell of positive weight), but without a float64 copy and cumulative sum
    of every row, which cost most of a verifier's time at large V. A block's sum is accumulated in
    the weights' own precision (pairwise over 256 cells: a few ulp, far below the rounding of the
    weights themselves; float64 accumulation of float32 cost 13x a float32 sum here) and widened;
    the search inside the block and the running sum over blocks are float64.
    """
    return inverse_cdf_at_blocks(
        block_sums(weights), u, weights.shape[1], lambda block, cells: weights.gather(1, cells)
    )


def block_width(vocab: int) -> int:
    """Cells per block: :data:`BLOCK`, or the whole row when it is shorter (one block, no padding to 256 columns)."""
    return min(BLOCK, vocab)


def block_sums(weights: torch.Tensor) -> torch.Tensor:
    """[N, ceil(V / width)] float64: each block's sum of ``weights`` [N, V] (contiguous rows), accumulated in the
    weights' own precision and widened (the first half of :func:`inverse_cdf_blocked`; a caller that builds its
    rows a few at a time sums each few while they are in cache and draws from all of them at once)."""
    rows, vocab = weights.shape
    width = block_width(vocab)
    full = vocab // width
    parts = []
    if full:
        parts.append(weights[:, : full * width].view(rows, full, width).sum(-1).to(torch.float64))
    if vocab % width:
        parts.append(weights[:, full * width :].sum(-1, keepdim=True).to(torch.float64))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]


def inverse_cdf_at_blocks(
    sums: torch.Tensor,
    u: torch.Tensor,
    vocab: int,
    cells_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The draws of :func:`inverse_cdf_blocked` from the rows' block sums ``sums`` (:func:`block_sums`) and
    ``cells_of(block, cells)``, the weights [N, width] of each row's chosen block [N, 1] at its cells [N, width]
    (int64; past V clamped to V - 1, and masked here), which need not be kept anywhere but where the rows came
    from."""
    width = block_width(vocab)
    device = sums.device
    cumulative = sums.cumsum(-1)
    target = u.to(torch.float64).unsqueeze(1) * cumulative[:, -1:]
    # The first block (then cell) whose running sum passes the target has weight (where one of no weight passes, so
    # does the one before it): only a rounding overshoot past the end needs clamping to the last with weight.
    block = torch.searchsorted(cumulative, target, right=True)
    if overshoots(block, sums.shape[1]):
        block = torch.minimum(block, last_positive(sums))
    cells = block * width + torch.arange(width, device=device)
    if vocab % width:  # a short last block: its cells past V read the last cell, weighted zero
        inside = cells < vocab
        values = cells_of(block, cells.clamp(max=vocab - 1)).to(torch.float64) * inside
    else:
        values = cells_of(block, cells).to(torch.float64)
    local = (target - (cumulative.gather(1, block) - sums.gather(1, block))).clamp_min(0)
    within = torch.searchsorted(values.cumsum(-1), local, right=True)
    if overshoots(within, width):
        within = torch.minimum(within, last_positive(values))
    return (block * width + within).squeeze(1)


def last_positive(weights: torch.Tensor) -> torch.Tensor:
    """[N, 1] each row's last cell of positive weight (the last cell where a row has none)."""
    return weights.shape[1] - 1 - (weights > 0).flip(-1).to(torch.int8).argmax(-1, keepdim=True)


def overshoots(index: torch.Tensor, end: int) -> bool:
    """Whether any search landed past the last cell. On a CPU the answer costs a few microseconds and saves the
    clamp; on a GPU asking would wait for the device, so the clamp is always made (it changes nothing where no
    search overshoots)."""
    return index.device.type != "cpu" or bool((index >= end).any())


class RepeatedCategorical:
    """Many draws from the same rows of probabilities: the CDF is built once, each draw costs a
    binary search (the harness's repeated-batch checks draw drafts this way)."""

    def __init__(self, probs: torch.Tensor) -> None:
        self.shape = probs.shape[:-1]
        flat = probs.reshape(-1, probs.shape[-1])
        self.cdf = flat.to(torch.float64).cumsum(dim=-1)
        self.last_positive = last_positive(flat)

    def sample(self, repeats: int, generator: torch.Generator) -> torch.Tensor:
        """[repeats, *shape] draws; repeat r of row i is independent of every other draw."""
        rows = self.cdf.shape[0]
        u = torch.rand((rows, repeats), generator=generator, device=self.cdf.device, dtype=torch.float64)
        return self.at(u)

    def at(self, u: torch.Tensor) -> torch.Tensor:
        """The draws [repeats, *shape] at uniforms ``u`` [rows, repeats] (float64, in [0, 1))."""
        idx = torch.searchsorted(self.cdf, u * self.cdf[:, -1:], right=True)
        idx = torch.minimum(idx, self.last_positive)
        return idx.T.reshape(u.shape[1], *self.shape)
