"""The acceptance chain along a real text: exact tokens per pass given the per-token acceptances.

When text y is the target's output, the draft token at position t was accepted with
probability r_t = min(p(y_t), q(y_t)) / p(y_t) given that y_t came out (the output is the
target's sample, and P(accepted, y_t = x) = min(p(x), q(x))); its average over y_t ~ p is the
acceptance rate a_t = sum min(p, q). Given the text, acceptances at different positions are
independent, so passes form a renewal chain along the text: a pass starting at t emits
L = l tokens with probability r_t ... r_{t+l-2} (1 - r_{t+l-1}) (l <= K), or r_t ... r_{t+K-1}
(l = K + 1). Expected passes, the pass-start distribution and per-slot acceptance follow
exactly by dynamic programming, with no i.i.d. assumption.
"""

from __future__ import annotations

import numpy as np


def _validate(realized: np.ndarray, k: int) -> np.ndarray:
    realized = np.asarray(realized, dtype=np.float64)
    if realized.ndim != 1 or realized.size == 0:
        raise ValueError("per-token acceptances must be a non-empty 1-D array")
    if np.any((realized < 0) | (realized > 1)) or not np.all(np.isfinite(realized)):
        raise ValueError("per-token acceptances must lie in [0, 1]")
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    return realized


def pass_lengths(realized: np.ndarray, k: int) -> np.ndarray:
    """[T, K+1]: P(a pass starting at position t emits l tokens), l = 1..K+1 (positions past the
    end of the text count as accepted: the text is finished either way)."""
    realized = _validate(realized, k)
    t = realized.size
    padded = np.concatenate([realized, np.ones(k)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, k)[:t]  # r_t .. r_{t+K-1}
    survive = np.concatenate([np.ones((t, 1)), np.cumprod(windows, axis=1)], axis=1)  # P(L > l-1)
    lengths = survive[:, :-1] * (1 - windows)
    return np.concatenate([lengths, survive[:, -1:]], axis=1)


def expected_passes(realized: np.ndarray, k: int) -> float:
    """E[number of passes] to emit the whole text (the last pass may run past its end)."""
    lengths = pass_lengths(realized, k)
    t = lengths.shape[0]
    remaining = np.zeros(t + k + 2)
    for start in range(t - 1, -1, -1):
        remaining[start] = 1.0 + lengths[start] @ remaining[start + 1 : start + k + 2]
    return float(remaining[0])


def pass_starts(realized: np.ndarray, k: int) -> np.ndarray:
    """[T]: probability that some pass starts at position t (sums to the expected passes)."""
    lengths = pass_lengths(realized, k)
    t = lengths.shape[0]
    starts = np.zeros(t + k + 2)
    starts[0] = 1.0
    for start in range(t):
        starts[start + 1 : start + k + 2] += starts[start] * lengths[start]
    return starts[:t]


def slot_acceptance(realized: np.ndarray, k: int) -> np.ndarray:
    """[K]: P(draft i of a pass is accepted | drafts before it were), averaged over the passes
    that reach slot i (slot 0 is the first draft of a pass)."""
    realized = _validate(realized, k)
    starts = pass_starts(realized, k)
    padded = np.concatenate([realized, np.ones(k)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, k)[: realized.size]
    reach = np.concatenate([np.ones((realized.size, 1)), np.cumprod(windows, axis=1)[:, :-1]], axis=1)
    inside = (np.arange(realized.size)[:, None] + np.arange(k)) < realized.size  # slots past the end don't count
    reached = starts @ (reach * inside)
    return np.divide(starts @ (reach * windows * inside), reached, out=np.zeros(k), where=reached > 0)


def tokens_per_pass_along(realized: np.ndarray, k: int) -> float:
    """Long-run tokens per pass on this text: its length over the expected passes."""
    return realized.size / expected_passes(realized, k)


def passes_law(realized: np.ndarray, k: int) -> np.ndarray:
    """[T + 1]: the exact law of the number of passes that emit the text (index = passes), given its
    per-token acceptances: the distribution behind :func:`expected_passes`, for a test of a count an
    engine reports. Passes start inside the text only; the last one may run past its end."""
    lengths = pass_lengths(realized, k)
    t = lengths.shape[0]
    # remaining[s, n]: P(n more passes emit positions s.. of the text); at or past the end, none.
    remaining = np.zeros((t + k + 2, t + 1))
    remaining[t:, 0] = 1.0
    for start in range(t - 1, -1, -1):
        after = lengths[start] @ remaining[start + 1 : start + k + 2]  # [T + 1]: passes after this one
        remaining[start, 1:] = after[:-1]
    return remaining[0]
