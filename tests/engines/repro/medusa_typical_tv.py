"""Reproduction without spectest: medusa-llm 0.1's typical acceptance (``medusa/model/utils.py``) emits tokens that
are not distributed as the target, at its published thresholds (posterior_threshold 0.09, posterior_alpha 0.3:
``medusa/model/medusa_model.py`` lines 195 and 197), and the token after the accepted prefix is always the target's
argmax.

One chain of K = 3 drafts over V = 6 tokens, p (the target at each position and after the last draft) and q (the
draft at each position) fixed below. Each of 20000 draws samples the drafts from q (a seeded ``torch.Generator``),
hands the wheel's ``evaluate_posterior`` the candidates [1, K + 1] (slot 0 the last verified token, then the drafts)
and the logits log p [1, K + 1, V] at temperature 1 (so its softmax is p), keeps the accepted drafts, then emits
the token Medusa's next round starts from: ``generate_candidates``' first candidate, ``torch.argmax(logits[:, -1])``
on the logits at the last accepted slot (called here with no Medusa heads, where it is that line alone). Prints,
per position, how often it was reached, the emitted distribution against p there, and the TV between them.

    .venv/bin/python tests/engines/repro/medusa_typical_tv.py

Needs only torch and ``pip install --no-deps medusa-llm==0.1`` (the file is imported alone: the package's
``__init__`` pulls its chat front end).
"""

from __future__ import annotations

import importlib.util
import sys

import torch

THRESHOLD, ALPHA, DRAWS, SEED = 0.09, 0.3, 20000, 0
# p [K + 1, V]: the target at each draft position, then after the last draft; q [K, V]: the draft.
P = torch.tensor(
    [
        [0.40, 0.25, 0.15, 0.10, 0.06, 0.04],
        [0.30, 0.30, 0.20, 0.12, 0.05, 0.03],
        [0.70, 0.12, 0.08, 0.05, 0.03, 0.02],
        [0.35, 0.25, 0.20, 0.10, 0.06, 0.04],
    ],
    dtype=torch.float64,
)
Q = torch.tensor(
    [
        [0.10, 0.10, 0.20, 0.20, 0.20, 0.20],
        [0.20, 0.40, 0.10, 0.10, 0.10, 0.10],
        [0.30, 0.10, 0.10, 0.10, 0.20, 0.20],
    ],
    dtype=torch.float64,
)
K, V = Q.shape


def load_medusa_utils():
    """``medusa/model/utils.py`` of the installed wheel, imported by path."""
    found = importlib.util.find_spec("medusa")
    if found is None:
        sys.exit("medusa-llm is not installed: pip install --no-deps medusa-llm==0.1")
    root = next(iter(found.submodule_search_locations))
    spec = importlib.util.spec_from_file_location("medusa_utils_alone", f"{root}/model/utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def draw_drafts(draws: int, seed: int) -> torch.Tensor:
    """[draws, K] drafts from Q."""
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(Q.repeat(draws, 1), 1, generator=generator).view(draws, K)


def emit(utils, drafts: torch.Tensor, threshold: float = THRESHOLD, alpha: float = ALPHA) -> torch.Tensor:
    """[draws, K + 1]: the accepted drafts, the token after them, then -1; one evaluate_posterior call a draw."""
    logits = torch.log(P).unsqueeze(0)  # [1, K + 1, V]
    no_heads = torch.zeros((0, 1, 1, V), dtype=torch.float64)
    out = torch.full((drafts.shape[0], K + 1), -1, dtype=torch.int64)
    for n, row in enumerate(drafts):
        candidates = torch.cat([row[:1], row]).unsqueeze(0)  # slot 0: the last verified token (not read)
        _, accepted = utils.evaluate_posterior(logits, candidates, 1.0, threshold, alpha)
        accepted = int(accepted)
        out[n, :accepted] = row[:accepted]
        after, _ = utils.generate_candidates(no_heads, logits[:, accepted : accepted + 1], [], [0], 1.0)
        out[n, accepted] = after[0]
    return out


def report(out: torch.Tensor) -> list[float]:
    """Print each position's emitted distribution against p; return the TVs."""
    tvs = []
    for i in range(K + 1):
        tokens = out[:, i][out[:, i] >= 0]
        share = torch.bincount(tokens, minlength=V).double() / max(1, tokens.numel())
        tv = 0.5 * float((share - P[i]).abs().sum())
        tvs.append(tv)
        what = "after the last draft" if i == K else f"draft position {i}"
        print(f"{what}: reached {tokens.numel()} of {out.shape[0]}, TV to the target {tv:.4f}")
        print(f"  emitted {[round(x, 4) for x in share.tolist()]}")
        print(f"  target  {P[i].tolist()}")
    return tvs


if __name__ == "__main__":
    torch.set_num_threads(1)  # 20000 calls on tiny tensors: threads only add their wake-ups
    utils = load_medusa_utils()
    print(f"medusa-llm evaluate_posterior, posterior_threshold {THRESHOLD}, posterior_alpha {ALPHA}, {DRAWS} draws")
    report(emit(utils, draw_drafts(DRAWS, SEED)))
