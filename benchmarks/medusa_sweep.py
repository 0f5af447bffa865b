"""How far does Medusa's typical acceptance move the output from the target, position by position, at its published
thresholds and at others? A benchmark, not a test: run it, read it.

    .venv/bin/python benchmarks/medusa_sweep.py [--draws 2000] [--seed 0] [--json out.json]

Needs ``pip install --no-deps medusa-llm==0.1``. The rows: 8 (p, q) chains of K = 4 drafts over V = 32 tokens from
``spectest.cases.toy_models.distribution_pairs`` with ``numpy.random.default_rng(seed)``, row r of kinds
``KINDS[r % 4]`` (target kind, draft kind). For each setting (posterior_threshold in 0.01, 0.05, 0.09, 0.3 with
posterior_alpha = sqrt(threshold), as medusa_model.py recommends; 0.09 and 0.3 are also the published defaults):

* Monte Carlo, the wheel's tokens: ``--draws`` drafts per row sampled from q with a seeded ``torch.Generator``, each
  chain verified by medusa-llm's ``evaluate_posterior`` at temperature 1 on log p and ended with
  ``generate_candidates``' argmax (spectest's ``MedusaLogits.verify``, which calls both). Per row and position the
  plug-in TV of the emitted token (given the position is reached) to p; the table gives, per position, the mean
  over rows weighted by how often each row reached it, with a bootstrap standard error (200 resamples of the draws).
  The plug-in is biased upward by sampling noise (about 1/2 sum_x sqrt(2 t_x (1 - t_x) / (pi n)) on cells where the
  output matches the target).
* Exact, beside it: ``simulators/lossy.py``'s ``lossy_chain`` (argmax fallback, argmax bonus) with the acceptance
  mask the wheel itself gives (``evaluate_posterior`` called on every (row, position, token)), weighted by the exact
  reach. The mask of ``typical_accepted`` (exact entropy, where the wheel uses ``-sum p log(p + 1e-5)``) is
  compared with it and the tokens where they differ are counted.

Positions 1..K are the drafts' slots (a draft accepted, or the argmax after a rejection), position K + 1 the token
after K accepted drafts: Medusa's argmax, TV 1 - max p there, where vLLM's TypicalAcceptanceSampler samples it from
p (TV 0). "mean" is the TV per emitted token: over positions and rows, weighted by reach. "tokens" is the exact
mean tokens per call, "std" the same for standard rejection sampling on the same p, q.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from spectest.simulators.chain import tokens_per_pass
from spectest.simulators.lossy import lossy_chain, typical_accepted

from spectest.cases.toy_models import distribution_pairs
from spectest.implementations.medusa import MedusaLogits, load_medusa

ROWS, K, VOCAB = 8, 4, 32
KINDS = (("lm", "close"), ("dirichlet", "far"), ("peaky", "close"), ("zipf", "uniform"))
SETTINGS = tuple((t, math.sqrt(t)) for t in (0.01, 0.05, 0.09, 0.3))  # (0.09, 0.3) is the published pair
BOOTSTRAP = 200


def rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """p [ROWS, K + 1, V] and q [ROWS, K, V] (float64)."""
    rng = np.random.default_rng(seed)
    pairs = [distribution_pairs(rng, K + 1, VOCAB, *KINDS[r % len(KINDS)]) for r in range(ROWS)]
    return np.stack([p for p, _ in pairs]), np.stack([q[:K] for _, q in pairs])


def wheel_mask(p: np.ndarray, threshold: float, alpha: float) -> np.ndarray:
    """[ROWS, K, V]: whether the wheel's evaluate_posterior accepts token x as the draft at each position."""
    medusa = load_medusa()
    logits = torch.log(torch.from_numpy(p[:, :K]))
    mask = np.zeros((ROWS, K, VOCAB), dtype=bool)
    for r in range(ROWS):
        for i in range(K):
            along = logits[r, i].expand(1, 2, VOCAB)
            for x in range(VOCAB):
                _, accepted = medusa.evaluate_posterior(along, torch.tensor([[0, x]]), 1.0, threshold, alpha)
                mask[r, i, x] = int(accepted) == 1
    return mask


def emitted(p: np.ndarray, q: np.ndarray, setting: tuple[float, float], draws: int, seed: int) -> np.ndarray:
    """[draws, ROWS, K + 1] tokens through the wheel (-1 past the end)."""
    model = MedusaLogits(posterior_threshold=setting[0], posterior_alpha=setting[1])
    generator = torch.Generator().manual_seed(seed)
    qt = torch.from_numpy(q).repeat(draws, 1, 1)
    drafts = torch.multinomial(qt.reshape(-1, VOCAB), 1, generator=generator).view(draws * ROWS, K)
    out = model.verify(drafts, qt, torch.from_numpy(p).repeat(draws, 1, 1), generator=generator)
    return out.numpy().reshape(draws, ROWS, K + 1)


def plug_in(out: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(TV [ROWS, K + 1] of each reached position's empirical output to p, reached counts [ROWS, K + 1])."""
    tv = np.zeros((ROWS, K + 1))
    reached = (out >= 0).sum(axis=0)
    for r in range(ROWS):
        for i in range(K + 1):
            tokens = out[:, r, i]
            tokens = tokens[tokens >= 0]
            if tokens.size:
                tv[r, i] = 0.5 * np.abs(np.bincount(tokens, minlength=VOCAB) / tokens.size - p[r, i]).sum()
    return tv, reached


def weighted(tv: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, float]:
    """(per position: the mean over rows weighted by ``weight``, the mean over everything weighted so)."""
    per_position = (tv * weight).sum(axis=0) / np.maximum(weight.sum(axis=0), 1e-300)
    return per_position, float((tv * weight).sum() / weight.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=2000, help="Monte Carlo drafts per row and setting")
    parser.add_argument("--seed", type=int, default=0, help="seeds the rows (numpy) and the drafts (torch)")
    parser.add_argument("--json", type=Path, help="write the table here too")
    args = parser.parse_args()
    torch.set_num_threads(1)  # thousands of calls on tiny tensors: threads only add their wake-ups
    started = time.perf_counter()
    p, q = rows(args.seed)
    standard = tokens_per_pass(np.minimum(p[:, :K], q).sum(-1)).mean.mean()
    print(
        f"medusa-llm evaluate_posterior at temperature 1, {ROWS} rows x K={K} x V={VOCAB} (seed {args.seed}), "
        f"{args.draws} draws a row; TV per position given reached, rows weighted by reach; MC +- bootstrap SE"
    )
    header = " ".join(f"{'pos ' + str(i + 1):>21}" for i in range(K + 1))
    print(f"{'threshold':>9} {'alpha':>6} {header} {'mean':>21} {'tokens':>6} {'std':>5} {'mask diff':>9}")
    results = []
    boot = np.random.default_rng(args.seed)
    for threshold, alpha in SETTINGS:
        mask = wheel_mask(p, threshold, alpha)
        differ = int((mask != typical_accepted(p[:, :K], threshold, alpha)).sum())
        exact = lossy_chain(p, q, mask, fallback="argmax", bonus="argmax")
        exact_position, exact_mean = weighted(exact.tv(p), exact.reach)
        out = emitted(p, q, (threshold, alpha), args.draws, args.seed)
        tv, reached = plug_in(out, p)
        mc_position, mc_mean = weighted(tv, reached)
        resampled = []
        for _ in range(BOOTSTRAP):
            pick = boot.integers(0, args.draws, args.draws)
            b_tv, b_reached = plug_in(out[pick], p)
            resampled.append(np.concatenate([weighted(b_tv, b_reached)[0], [weighted(b_tv, b_reached)[1]]]))
        se = np.std(resampled, axis=0, ddof=1)
        cells = [
            f"{m:.3f}+-{s:.3f} ({e:.3f})"
            for m, s, e in zip([*mc_position, mc_mean], se, [*exact_position, exact_mean], strict=True)
        ]
        print(
            f"{threshold:>9g} {alpha:>6.3f} "
            + " ".join(f"{c:>21}" for c in cells)
            + f" {exact.tokens.mean.mean():>6.3f} {standard:>5.3f} {differ:>9d}"
        )
        results.append(
            {
                "posterior_threshold": threshold,
                "posterior_alpha": alpha,
                "monte_carlo_tv": [*mc_position.tolist(), mc_mean],
                "monte_carlo_se": se.tolist(),
                "exact_tv": [*exact_position.tolist(), exact_mean],
                "tokens_per_call": float(exact.tokens.mean.mean()),
                "standard_tokens_per_call": float(standard),
                "mask_differs_from_exact_entropy": differ,
            }
        )
    print("cells: Monte Carlo +- SE (exact); the last position's exact TV with vLLM's sampled bonus would be 0.000")
    print(f"{time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps({"draws": args.draws, "seed": args.seed, "settings": results}, indent=1))


if __name__ == "__main__":
    main()
