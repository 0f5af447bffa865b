"""The sizes each property draws, declared once: the property builds its strategy from them and
the property reference (``docs/reference/properties.md``) quotes them (``tests/test_docs.py``
keeps the two in step)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from spectest.cases.chain import ChainCase, chain_cases
from spectest.cases.logits import LogitsCase, logits_cases
from spectest.cases.sizes import batch_sizes, draft_lengths, vocab_sizes


@dataclass(frozen=True)
class CaseRanges:
    """The sizes a property draws, in one place: the strategy is built from them, and the docs'
    property reference quotes ``describe()`` (a test keeps the two in step). ``max_elements`` caps B (2K + 1) V per
    case, cutting B then K (see :func:`chain_cases`)."""

    batch: tuple[int, int] = (1, 512)
    k: tuple[int, int] = (1, 16)
    vocab: tuple[int, int] = (2, 131072)
    max_elements: int | None = None

    def describe(self) -> str:
        text = f"B {self.batch[0]}-{self.batch[1]}, K {self.k[0]}-{self.k[1]}, V {self.vocab[0]}-{self.vocab[1]}"
        return text + (f", B (2K + 1) V <= {self.max_elements:,}" if self.max_elements else "")

    def chain_cases(self, **kwargs: object) -> st.SearchStrategy[ChainCase]:
        return chain_cases(
            batch=batch_sizes(min_size=self.batch[0], max_size=self.batch[1]),
            k=draft_lengths(min_k=self.k[0], max_k=self.k[1]),
            vocab=vocab_sizes(min_size=self.vocab[0], max_size=self.vocab[1]),
            max_elements=self.max_elements,
            **kwargs,  # type: ignore[arg-type]
        )

    def logits_cases(self, **kwargs: object) -> st.SearchStrategy[LogitsCase]:
        return logits_cases(
            batch=batch_sizes(min_size=self.batch[0], max_size=self.batch[1]),
            k=draft_lengths(min_k=self.k[0], max_k=self.k[1]),
            vocab=vocab_sizes(min_size=self.vocab[0], max_size=self.vocab[1]),
            **kwargs,  # type: ignore[arg-type]
        )
