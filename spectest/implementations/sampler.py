"""The registered ``reference`` and ``reference-compiled`` models: what they declare, and their methods, with torch
imported at the first call.

``--spec-model reference`` is resolved wherever the pytest plugin configures, and on pytest-xdist's controller that
is only to describe the model (the header, the results file): the workers resolve it again and run it. Importing
torch there held up every worker's start (the controller configures before it starts them) and the end of the run
by about 1.5 s of a 27 s main job. So this module imports nothing heavy, and each method calls into
:mod:`spectest.implementations.reference`, which holds the sampler itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectest.protocol import DEFAULT_ORDER

if TYPE_CHECKING:
    import torch

    from spectest.sampling_params import SamplingParams


class ReferenceSampler:
    """The reference with every optional capability of the protocol (see docs/reference/protocols.md)."""

    spectest_capabilities = frozenset({"standard-rejection", "per-row-seeds", "ragged-drafts"})
    spectest_filter_order = DEFAULT_ORDER
    spectest_dtypes = ("float32", "float64", "bfloat16", "float16")

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator,
        num_draft_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from spectest.implementations.reference import verify

        return verify(
            draft_token_ids, draft_probs, target_probs, generator=generator, num_draft_tokens=num_draft_tokens
        )

    def verify_logits(
        self,
        draft_token_ids: torch.Tensor,
        draft_logits: torch.Tensor,
        target_logits: torch.Tensor,
        params: SamplingParams,
        *,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Process both sides with each row's parameters, then the chain; greedy rows fall out
        of it (a one-hot p accepts exactly the argmax and corrects to it)."""
        from spectest.implementations.reference import ExtraToken, row_uniforms, verify_at
        from spectest.sampling_params import process_logits

        p = process_logits(target_logits, params, order=self.spectest_filter_order)
        q = process_logits(draft_logits, params, order=self.spectest_filter_order)
        k = draft_token_ids.shape[1]
        u, v = row_uniforms(params, k, generator, device=draft_token_ids.device, dtype=p.dtype)
        return verify_at(draft_token_ids, q, p, u, ExtraToken(v))

    def propose(
        self, draft_logits: torch.Tensor, params: SamplingParams, *, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft tokens sampled from the processed draft distribution, and that distribution."""
        from spectest.sampling import sample_categorical
        from spectest.sampling_params import process_logits

        q = process_logits(draft_logits, params, order=self.spectest_filter_order)
        return sample_categorical(q, generator), q


REFERENCE = ReferenceSampler()


class CompiledReference:
    """``reference-compiled``: the reference's chain compiled whole by ``torch.compile`` for long CPU rows
    (:mod:`spectest.implementations.compiled` says why it is not the default)."""

    spectest_capabilities = frozenset({"standard-rejection", "ragged-drafts"})
    spectest_dtypes = ("float32", "float64", "bfloat16", "float16")

    @property
    def spectest_unavailable(self) -> str | None:
        from spectest.availability import compiler_missing

        return compiler_missing()

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator,
        num_draft_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from spectest.implementations.compiled import verify

        return verify(
            draft_token_ids, draft_probs, target_probs, generator=generator, num_draft_tokens=num_draft_tokens
        )


REFERENCE_COMPILED = CompiledReference()
