"""Measured speedups agree with the tokens-per-pass model and its break-even threshold.

A small sweep on costed models (exact outputs, real tensor work): a predictable draft, drafts mixed
toward uniform, and a random draft. Every cost the model needs (draft/target step ratio c,
verification growth d, verifier overhead o) is measured in the same run as the decoding it
predicts, so machine noise largely cancels. Deselect with ``-m "not spec_speed"``.

Tolerance: the measured/predicted speedup ratio must lie within [1/1.35, 1.35] (SPEED_TOLERANCE),
wide enough for a shared 2-core machine, far narrower than the 2x to 5x effects a mis-modelled
verifier (one that recomputes the residual for every position, say) or a broken chain produces.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulators import tokens_per_pass_iid
from spectest.bench import BenchConfig, break_even, sweep
from spectest.stats import Group, chisquare_groups

SPEED_TOLERANCE = 1.35
MIXES = (0.0, 0.45, 0.65, 0.85, 1.0)
# Break-even bracket: a point must measure on its side of 1 when the model puts it at least this
# factor away from 1 (near a* the speedup curve is flat, so speed noise moves the crossing a lot).
BRACKET_SPEED_MARGIN = 1.15
# A machine too busy to time: repeated timings whose interquartile range exceeds this fraction of
# their median make the costs meaningless, and the property skips (saying so) instead of judging.
NOISE_LIMIT = 0.5


@pytest.mark.spec_speed
@pytest.mark.spec_property(examples=1, checks=1)
def test_measured_speedup_follows_the_model(spec) -> None:
    config = BenchConfig(device=str(spec.device), seed=spec.session.seed % 1000)
    points = sweep(spec.model, config, MIXES)
    noise = max(p.costs["noise"] for p in points)
    if noise > NOISE_LIMIT:
        pytest.skip(
            f"machine too noisy to time: repeated timings spread {noise:.0%} of their median (limit "
            f"{NOISE_LIMIT:.0%}); rerun on a quieter machine"
        )
    even = break_even(points, config.k)
    spec.record(
        {
            "k": config.k,
            "speed_points": [
                {"mix": p.mix, "acceptance": p.acceptance_measured, "measured": p.speedup_measured,
                 "predicted": p.speedup_predicted, "ratio": p.ratio, "pass_cost": p.costs["pass_cost"],
                 "counts": p.tokens_per_pass_counts,
                 "model_probs": tokens_per_pass_iid(p.acceptance_exact, config.k).probs.tolist()}
                for p in points
            ],
            "break_even_predicted": even.predicted,
            "break_even_measured": even.measured,
        }
    )  # fmt: skip
    table = "\n".join(
        f"  a={p.acceptance_exact:.3f}: measured {p.speedup_measured:.3f}x, model {p.speedup_predicted:.3f}x "
        f"(ratio {p.ratio:.3f}; c={p.costs['cost_ratio']:.3f}, d={p.costs['verify_growth']:.4f}, o={p.costs['overhead']:.3f})"
        for p in points
    )
    if spec.standard:  # tokens per pass follow the truncated geometric law of the exact acceptance
        groups = [
            Group(
                np.array(p.tokens_per_pass_counts),
                tokens_per_pass_iid(p.acceptance_exact, config.k).probs,
                f"a={p.acceptance_exact:.3f}: ",
            )
            for p in points
        ]
        fit = chisquare_groups("tokens per pass", groups, alpha=spec.alpha)
        spec.check_fit(fit, context=f"speculative decoding at K={config.k}\n{table}")
    for p in points:
        spec.require(
            1 / SPEED_TOLERANCE <= p.ratio <= SPEED_TOLERANCE,
            f"measured speedup within x{SPEED_TOLERANCE} of the model",
            f"at acceptance {p.acceptance_measured:.3f} the measured speedup is {p.speedup_measured:.3f}x but the model "
            f"predicts {p.speedup_predicted:.3f}x from the costs measured in the same run\n{table}",
        )
    if even.predicted is not None:
        for p in points:
            if p.speedup_predicted >= BRACKET_SPEED_MARGIN:
                ok = p.speedup_measured > 1.0
            elif p.speedup_predicted <= 1 / BRACKET_SPEED_MARGIN:
                ok = p.speedup_measured < 1.0
            else:
                continue
            spec.require(
                ok,
                "the measured break-even brackets the predicted one",
                f"predicted break-even a* = {even.predicted:.3f}; at acceptance {p.acceptance_exact:.3f} the model predicts "
                f"{p.speedup_predicted:.3f}x, clearly on one side, but the measured speedup is {p.speedup_measured:.3f}x\n{table}",
            )
