"""A worked example: wrapping a sampler with its own conventions for spectest.

Suppose your engine's sampler works one request at a time, takes logits, returns only the
accepted tokens plus one, and draws from a ``numpy`` RNG. The adapter below converts the
harness's conventions to yours and back, and fixes nothing in your code: a bug in
``my_engine_step`` must stay visible. Check it with

    pytest --spec-model examples/wrap_my_sampler.py:ADAPTER

Rules of thumb (see docs/tutorials/wrap-an-engine-sampler.md):

1. Inputs: ``draft_token_ids`` int64 [B, K], ``draft_probs`` [B, K, V], ``target_probs``
   [B, K+1, V]. Convert dtypes, layouts and probabilities <-> logits as your code expects.
2. Randomness: derive every seed from the ``generator`` you are given (never from time or a
   global RNG you do not restore), so that the printed ``--spec-seed`` replays a failure.
3. Output: int64 [B, K+1] on the input device: the accepted prefix, one token, then -1.
4. Declare only what holds: ``spectest_capabilities = {"standard-rejection"}`` if it accepts
   with min(1, p/q) token by token; add ``verify_logits``/``propose`` methods if you have them.
"""

from __future__ import annotations

import numpy as np
import torch


def my_engine_step(
    draft_ids: list[int], draft_logits: np.ndarray, target_logits: np.ndarray, rng: np.random.Generator
) -> list[int]:
    """Stand-in for the code under test: one request, logits in, tokens out."""

    def softmax(x: np.ndarray) -> np.ndarray:
        z = np.exp(x - x.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)

    q, p = softmax(draft_logits.astype(np.float64)), softmax(target_logits.astype(np.float64))
    out: list[int] = []
    for i, token in enumerate(draft_ids):
        if rng.random() * q[i, token] < p[i, token]:
            out.append(token)
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        out.append(int(rng.choice(len(residual), p=residual / residual.sum())))
        return out
    out.append(int(rng.choice(p.shape[-1], p=p[len(draft_ids)])))
    return out


class MySamplerAdapter:
    spectest_capabilities = frozenset({"standard-rejection"})

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        batch, k = draft_token_ids.shape
        # One numpy seed per row, drawn from the harness's generator: replayable, row-independent.
        seeds = torch.randint(0, 2**62, (batch,), generator=generator, device=generator.device).tolist()
        draft_logits = draft_probs.double().log().cpu().numpy()
        target_logits = target_probs.double().log().cpu().numpy()
        drafts = draft_token_ids.cpu().tolist()
        emitted = torch.full((batch, k + 1), -1, dtype=torch.int64)
        for row in range(batch):
            tokens = my_engine_step(
                drafts[row], draft_logits[row], target_logits[row], np.random.default_rng(seeds[row])
            )
            emitted[row, : len(tokens)] = torch.tensor(tokens)
        return emitted.to(draft_token_ids.device)


ADAPTER = MySamplerAdapter()
