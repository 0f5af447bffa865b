"""Relaxed (lossy) acceptance rules engines ship, as references to measure against.

Registered ``typical-acceptance`` (Medusa's typical acceptance as vLLM's
TypicalAcceptanceSampler runs it, its defaults posterior_threshold 0.09, posterior_alpha 0.3) and
``relaxed-topk`` (TensorRT-LLM's MTP relaxed acceptance, relaxed_topk 8, relaxed_delta 0.5: a
thinking-phase setting; its defaults 1 and 0 accept only the target's top token). Build your own
with other knobs and hand it over as ``path/to/file.py:name``::

    from spectest.implementations.lossy import TypicalAcceptance
    strict = TypicalAcceptance(posterior_threshold=0.3, posterior_alpha=0.55)

Each accepts draft x at position i from p_i alone (q is ignored), stops at the first rejection,
and emits a fallback token there: the target's most likely token ("argmax", as both engines do)
or a draw from p_i ("sample"). The bonus after K accepted drafts is a draw from p_K for typical
acceptance (vLLM samples it as usual) and follows ``fallback`` for relaxed top-k (TensorRT-LLM's
"golden token" is the top-1). Both declare ``spectest_lossy``: the harness measures how far
their output is from the target (spectest.statistics.tv); the exact model of their output is
spectest.simulators.lossy, written separately in numpy.
"""

from __future__ import annotations

import torch

from spectest.protocol import PAD
from spectest.sampling import inverse_cdf_blocked

FALLBACKS = ("argmax", "sample")


class RelaxedAcceptance:
    """Shared by both rules: the chain of deterministic accept decisions, then one fallback."""

    spectest_lossy = True
    spectest_capabilities = frozenset()
    bonus = "sample"

    def __init__(self, *, fallback: str = "argmax") -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.fallback = fallback

    def accepts(self, p: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        """Whether the rule accepts drafts of probability ``px`` [...] under p [..., V] (float64)."""
        raise NotImplementedError

    def verify(
        self,
        draft_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        *,
        generator: torch.Generator,
    ) -> torch.Tensor:
        b, k = draft_token_ids.shape
        p = target_probs.double()
        px = p[:, :k].gather(-1, draft_token_ids.unsqueeze(-1)).squeeze(-1)
        accept = self.accepts(p[:, :k], px)
        n_accepted = torch.cumprod(accept.to(torch.int64), dim=1).sum(dim=1)  # [B]
        rows = torch.arange(b, device=p.device)
        at_stop = p[rows, n_accepted]  # [B, V]: the target where the fallback or bonus comes from
        u = torch.rand(b, generator=generator, device=p.device, dtype=torch.float64)  # one per row, always
        sampled = inverse_cdf_blocked(at_stop, u)
        greedy = at_stop.argmax(-1)
        use_sample = (n_accepted == k) & (self.bonus == "sample") | (n_accepted < k) & (self.fallback == "sample")
        last = torch.where(use_sample, sampled, greedy)
        slots = torch.arange(k + 1, device=p.device)
        drafts = torch.cat([draft_token_ids, torch.full((b, 1), PAD, device=p.device, dtype=torch.int64)], dim=1)
        out = torch.where(slots < n_accepted[:, None], drafts, torch.full_like(drafts, PAD))
        out[rows, n_accepted] = last
        return out


class TypicalAcceptance(RelaxedAcceptance):
    """Accept x iff p(x) > min(posterior_threshold, posterior_alpha * exp(-H(p))) (H in nats)."""

    def __init__(self, *, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3, fallback: str = "argmax"):
        super().__init__(fallback=fallback)
        if not 0 <= posterior_threshold <= 1 or not 0 <= posterior_alpha <= 1:
            raise ValueError("posterior_threshold and posterior_alpha must lie in [0, 1]")
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    def accepts(self, p: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        entropy = torch.special.entr(p).sum(-1)  # -sum p log p, 0 log 0 = 0
        threshold = torch.clamp(self.posterior_alpha * torch.exp(-entropy), max=self.posterior_threshold)
        return px > threshold

    def __repr__(self) -> str:
        return (
            f"TypicalAcceptance(posterior_threshold={self.posterior_threshold}, "
            f"posterior_alpha={self.posterior_alpha}, fallback={self.fallback!r})"
        )


class RelaxedTopK(RelaxedAcceptance):
    """Accept x iff it is among the ``relaxed_topk`` most likely tokens (ties at the cut count)
    and p(x) >= p(top-1) - relaxed_delta, p(x) > 0. The bonus follows ``fallback`` too."""

    def __init__(self, *, relaxed_topk: int = 1, relaxed_delta: float = 0.0, fallback: str = "argmax"):
        super().__init__(fallback=fallback)
        if int(relaxed_topk) < 1 or relaxed_delta < 0:
            raise ValueError("relaxed_topk must be >= 1 and relaxed_delta >= 0")
        self.relaxed_topk = int(relaxed_topk)
        self.relaxed_delta = float(relaxed_delta)
        self.bonus = fallback

    def accepts(self, p: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
        top = torch.topk(p, min(self.relaxed_topk, p.shape[-1]), dim=-1).values
        return (px >= top[..., -1]) & (px >= top[..., 0] - self.relaxed_delta) & (px > 0)

    def __repr__(self) -> str:
        return f"RelaxedTopK(relaxed_topk={self.relaxed_topk}, relaxed_delta={self.relaxed_delta}, fallback={self.fallback!r})"


TYPICAL = TypicalAcceptance()
RELAXED_TOPK = RelaxedTopK(relaxed_topk=8, relaxed_delta=0.5)
