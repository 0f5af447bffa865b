"""Exact output of relaxed (lossy) acceptance rules, for the calibration of measured TV.

Both rules shipped as references (spectest.implementations.lossy) accept a draft x at position
i deterministically from the target p_i alone, and fall back to one token when they reject:

* typical acceptance (Medusa; vLLM's TypicalAcceptanceSampler): accept iff
  p_i(x) > min(posterior_threshold, posterior_alpha * exp(-H(p_i))), H in nats;
* relaxed top-k/delta (TensorRT-LLM's MTP relaxed acceptance): accept iff x is among the
  relaxed_topk most likely tokens of p_i (ties at the cut all count) and p_i(x) >= p_i(top-1) -
  relaxed_delta; a token of probability 0 is never accepted.

Drafts are independent across positions, so position i is reached with probability
prod_{j<i} a_j, a_j = sum_x q_j(x) acc_j(x), tokens per call follow the chain model with those
a_j, and the token emitted at a reached position i < K is distributed as
q_i(x) acc_i(x) + (1 - a_i) fallback_i(x). This module is numpy, written apart from the torch
references on purpose: the tests hold each against the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from spectest.simulators.chain import TokensPerPass, tokens_per_pass


def typical_accepted(p: np.ndarray, posterior_threshold: float, posterior_alpha: float) -> np.ndarray:
    """Mask [..., V] of tokens typical acceptance accepts under p [..., V]."""
    logs = np.log(np.where(p > 0, p, 1.0))
    entropy = -(p * logs).sum(-1, keepdims=True)
    threshold = np.minimum(posterior_threshold, posterior_alpha * np.exp(-entropy))
    return p > threshold


def relaxed_accepted(p: np.ndarray, relaxed_topk: int, relaxed_delta: float) -> np.ndarray:
    """Mask [..., V] of tokens relaxed top-k/delta acceptance accepts under p [..., V]."""
    above = (p[..., None, :] > p[..., :, None]).sum(-1)  # tokens strictly more likely than each
    top = p.max(-1, keepdims=True)
    return (above < relaxed_topk) & (p >= top - relaxed_delta) & (p > 0)


@dataclass
class LossyChain:
    """Exact per-position output of a lossy rule on one batch: ``outputs`` [B, K + 1, V] (the
    distribution at each position given it is reached), ``reach`` [B, K + 1] and tokens per call."""

    outputs: np.ndarray
    reach: np.ndarray
    tokens: TokensPerPass

    def tv(self, target: np.ndarray) -> np.ndarray:
        """[B, K + 1] exact TV distance of each position's output to ``target`` [B, K + 1, V]."""
        return 0.5 * np.abs(self.outputs - target).sum(-1)


def greedy(p: np.ndarray) -> np.ndarray:
    """One-hot at the most likely token (the lowest id among ties, as torch.argmax)."""
    out = np.zeros_like(p)
    np.put_along_axis(out, p.argmax(-1)[..., None], 1.0, axis=-1)
    return out


def lossy_chain(
    target: np.ndarray, draft: np.ndarray, accepted: np.ndarray, *, fallback: str, bonus: str
) -> LossyChain:
    """The exact model for ``target`` [B, K + 1, V], ``draft`` [B, K, V] and the rule's acceptance
    mask ``accepted`` [B, K, V]; ``fallback`` and ``bonus``: "argmax" or "sample" (from p)."""
    k = draft.shape[1]
    rate = (draft * accepted).sum(-1)  # [B, K]
    after = greedy(target[:, :k]) if fallback == "argmax" else target[:, :k]
    outputs = np.empty_like(target)
    outputs[:, :k] = draft * accepted + (1 - rate)[..., None] * after
    outputs[:, k] = greedy(target[:, k]) if bonus == "argmax" else target[:, k]
    reach = np.concatenate([np.ones((target.shape[0], 1)), np.cumprod(rate, axis=1)], axis=1)
    return LossyChain(outputs, reach, tokens_per_pass(rate))
