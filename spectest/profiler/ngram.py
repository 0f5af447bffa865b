"""Byte-level n-gram language models trained on the fly (no downloads, nothing to install).

Interpolated Witten-Bell smoothing down to a uniform floor, so every byte has positive
probability. Two models trained on the same text share the 256-byte vocabulary by construction.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

VOCAB = 256


class NgramLM:
    """P(next byte | previous order-1 bytes)."""

    def __init__(self, order: int, texts: list[bytes]) -> None:
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1, got {order}")
        if not any(texts):
            raise ValueError("an n-gram model needs training text (--train FILE ...)")
        self.order = order
        self.vocab_size = VOCAB
        self.counts: list[dict[bytes, np.ndarray]] = [defaultdict(lambda: np.zeros(VOCAB)) for _ in range(order)]
        for text in texts:
            data = np.frombuffer(text, dtype=np.uint8)
            for m in range(order):  # context length m
                table = self.counts[m]
                for t in range(m, data.size):
                    table[text[t - m : t]][data[t]] += 1
        self.counts = [dict(table) for table in self.counts]

    @property
    def vocabulary(self) -> str:
        return "bytes/256"

    def next_probs(self, text: bytes) -> np.ndarray:
        """[T, 256]: P(text[t] | text[:t]) for every t (teacher forcing)."""
        probs = np.empty((len(text), VOCAB))
        uniform = np.full(VOCAB, 1.0 / VOCAB)
        for t in range(len(text)):
            p = uniform
            for m in range(min(self.order - 1, t) + 1):
                counts = self.counts[m].get(text[t - m : t])
                if counts is None:
                    break  # longer contexts were not seen either
                total = counts.sum()
                types = np.count_nonzero(counts)
                weight = total / (total + types)
                p = weight * counts / total + (1 - weight) * p
            probs[t] = p
        return probs
