"""How often does the sparse identity test fail a correct sampler? Simulates seeded null runs, counts
drawn from the target itself, and tallies each statistic's p-values (a benchmark, not a test: run it,
read it).

    python benchmarks/sparse_null.py [--runs 200] [--json out.json]

Each run draws a regime (V of 32000, 152064 or 256000; 1-4 rows of a language-model-like kind; 100
to 2000 draws per row), multinomial counts from the rows' exact probabilities, and the p-value of
each statistic of :mod:`spectest.statistics.sparse` on its own (its exact Chernoff bound, before any
split). A valid test rejects at level alpha in at most a share alpha of null runs; the bound is
conservative, so the measured shares sit below. Exit code 0 only if every share is within alpha
(plus two binomial standard errors).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from spectest.cases.toy_models import target_distributions
from spectest.statistics.sparse import STATISTICS, chernoff_log_sf, repeat_probability, sparse_tokens

VOCABULARIES = (32000, 152064, 256000)
KINDS = ("lm", "zipf", "dirichlet", "peaky")
LEVELS = (0.1, 0.05, 0.01)


def one_run(seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice(VOCABULARIES))
    rows = int(rng.integers(1, 5))
    kind = str(rng.choice(KINDS))
    draws = int(rng.integers(100, 2001))
    probs = target_distributions(rng, rows, vocab, kind)
    counts = np.stack([rng.multinomial(draws, row) for row in probs])
    mask = sparse_tokens(probs, counts.sum(axis=1))
    p, n, seen = probs[mask], np.broadcast_to(counts.sum(axis=1)[:, None], probs.shape)[mask], counts[mask]
    chances = {"tail repeats": repeat_probability(p, n.astype(float)), "missing support": np.exp(n * np.log1p(-p))}
    observed = {"tail repeats": int((seen >= 2).sum()), "missing support": int((seen == 0).sum())}
    return {
        "seed": seed,
        "regime": f"V={vocab}, {rows} {kind} rows, {draws} draws",
        "p": {name: math.exp(chernoff_log_sf(observed[name], chances[name])) for name in STATISTICS},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs = [one_run(seed) for seed in range(args.runs)]
    ok = True
    for name in STATISTICS:
        values = np.array([r["p"][name] for r in runs])
        shares = []
        for level in LEVELS:
            share = float((values <= level).mean())
            ok &= share <= level + 2 * math.sqrt(level * (1 - level) / len(values))
            shares.append(f"p <= {level:g} in {share:.3f}")
        print(f"{name}: {len(values)} null runs; " + ", ".join(shares) + f"; smallest p {values.min():.3g}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
