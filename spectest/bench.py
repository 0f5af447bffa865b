"""Measured speedups against the tokens-per-pass model and its break-even threshold.

Everything a prediction needs is measured in the same run as the decoding it predicts, so machine
noise largely cancels in the ratio: the cost of a target step and a draft step (forward over one
position plus sampling), of a verification pass over K + 1 positions, and of one verifier call.
In units of a target forward over one position: c = draft forward, 1 + d K = target forward over
K + 1 positions, o = the bookkeeping of one speculative pass (drafting samples, the verify call and
its contract checks, writes), o_plain = the bookkeeping of one plain token; the two overheads are
measured by running both loops with null models. Predicted speedup = E[L](a) (1 + o_plain) /
(K c + 1 + d K + o), with the i.i.d. model at the measured acceptance a (Leviathan et al.'s
formula when both overheads are 0). The pair used makes acceptance identical in every context (see
:func:`spectest.decoding.uniform_acceptance_pair`), so that model is exact.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from simulators import acceptance_for_tokens_per_pass, expected_tokens_iid
from spectest.decoding import (
    CostedMarkovLM,
    acceptance_from_passes,
    plain_decode,
    speculative_decode,
    synchronize,
    uniform_acceptance_pair,
)
from spectest.protocol import Model
from spectest.sampling import make_generator


@dataclass(frozen=True)
class BenchConfig:
    vocab: int = 64
    target_hidden: int = 1024
    draft_hidden: int = 64
    layers: int = 6
    k: int = 4
    batch: int = 1
    tokens: int = 300
    repeats: int = 25
    rounds: int = 3  # alternating plain/speculative runs per point; the median speedup is kept
    seed: int = 0
    device: str = "cpu"


@dataclass
class StepCosts:
    """Seconds, each from its own micro-benchmark: model forwards over 1 and K+1 positions, and
    the bookkeeping of each loop (sampling, verify call, contract checks, writes), measured by
    running the loops with null models (same tables, no matrix work)."""

    target_forward: float  # target forward over one position
    draft_forward: float
    verify_forward: float  # target forward over K + 1 positions
    plain_overhead: float  # per plain token beyond the target forward
    pass_overhead: float  # per speculative pass beyond the model forwards
    noise: float = 0.0  # largest interquartile range / median among the timings above (not the null forwards)

    @property
    def cost_ratio(self) -> float:
        return self.draft_forward / self.target_forward

    def verify_growth(self, k: int) -> float:
        return (self.verify_forward / self.target_forward - 1) / k

    @property
    def overhead(self) -> float:
        return self.pass_overhead / self.target_forward

    @property
    def plain_overhead_ratio(self) -> float:
        return self.plain_overhead / self.target_forward

    def pass_cost(self, k: int) -> float:
        """One speculative pass in plain-token units: (K c + 1 + d K + o) / (1 + o_plain)."""
        spec = k * self.cost_ratio + 1 + self.verify_growth(k) * k + self.overhead
        return spec / (1 + self.plain_overhead_ratio)

    def as_dict(self, k: int) -> dict[str, float]:
        return asdict(self) | {
            "cost_ratio": self.cost_ratio,
            "verify_growth": self.verify_growth(k),
            "overhead": self.overhead,
            "plain_overhead": self.plain_overhead_ratio,
            "pass_cost": self.pass_cost(k),
        }


@dataclass
class SweepPoint:
    mix: float
    acceptance_exact: float
    acceptance_measured: float
    tokens_per_pass: float
    tokens_per_pass_model: float
    speedup_measured: float
    speedup_predicted: float
    costs: dict[str, float]
    tokens_per_pass_counts: list[int]  # passes that emitted 1..K+1 tokens

    @property
    def ratio(self) -> float:
        return self.speedup_measured / self.speedup_predicted


class Timer:
    """Median timings, remembering how unstable they were (interquartile range / median)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.noise = 0.0

    def median(self, action: Callable[[], object], repeats: int, *, judged: bool = True) -> float:
        """Median of ``repeats`` timings; ``judged`` ones count toward the noise figure (a few
        microsecond timings jitter by ~100% on any machine and are only small corrections)."""
        action()  # warm-up
        times = []
        for _ in range(repeats):
            synchronize(self.device)
            started = time.perf_counter()
            action()
            synchronize(self.device)
            times.append(time.perf_counter() - started)
        quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
        middle = quartiles[1]
        if judged and middle > 0:
            self.noise = max(self.noise, (quartiles[2] - quartiles[0]) / middle)
        return middle


def measure_costs(
    target: CostedMarkovLM, draft: CostedMarkovLM, verifier: Model, config: BenchConfig, generator: torch.Generator
) -> StepCosts:
    device = torch.device(config.device)
    one = torch.zeros((config.batch, 1), dtype=torch.int64, device=device)
    many = torch.zeros((config.batch, config.k + 1), dtype=torch.int64, device=device)
    null_target = CostedMarkovLM(target.table.cpu().numpy(), hidden=1, layers=0, device=device)
    null_draft = CostedMarkovLM(draft.table.cpu().numpy(), hidden=1, layers=0, device=device)
    start, steps = config.vocab, 20

    def plain_steps() -> None:
        plain_decode(null_target, batch=config.batch, tokens=steps, start=start, generator=generator, device=device)

    def spec_passes() -> None:
        speculative_decode(
            null_target, null_draft, verifier, batch=config.batch, tokens=steps * (config.k + 1), k=config.k,
            start=start, generator=generator, device=device,
        )  # fmt: skip

    null_passes = speculative_decode(
        null_target, null_draft, verifier, batch=config.batch, tokens=steps * (config.k + 1), k=config.k,
        start=start, generator=generator, device=device,
    ).passes  # fmt: skip
    repeats = max(3, config.repeats // 5)
    timer = Timer(device)
    # The null loops still run null forwards (a table lookup each): subtract them, so that the
    # overheads hold only what the real loops add to their model forwards.
    null_one = timer.median(lambda: null_target.forward(one), config.repeats, judged=False)
    null_many = timer.median(lambda: null_target.forward(many), config.repeats, judged=False)
    plain_null = timer.median(plain_steps, repeats) / steps
    pass_null = timer.median(spec_passes, repeats) / max(1, null_passes)
    costs = StepCosts(
        target_forward=timer.median(lambda: target.forward(one), config.repeats),
        draft_forward=timer.median(lambda: draft.forward(one), config.repeats),
        verify_forward=timer.median(lambda: target.forward(many), config.repeats),
        plain_overhead=max(0.0, plain_null - null_one),
        pass_overhead=max(0.0, pass_null - config.k * null_one - null_many),
    )
    costs.noise = timer.noise
    return costs


def run_point(verifier: Model, config: BenchConfig, mix: float) -> SweepPoint:
    """Plain and speculative decoding of the same pair, costs measured alongside."""
    device = torch.device(config.device)
    target_table, draft_table, exact = uniform_acceptance_pair(config.vocab, mix, seed=config.seed)
    target = CostedMarkovLM(target_table, hidden=config.target_hidden, layers=config.layers, device=device, seed=1)
    draft = CostedMarkovLM(draft_table, hidden=config.draft_hidden, layers=config.layers, device=device, seed=2)
    generator = make_generator(config.seed, device)
    start = config.vocab
    costs = measure_costs(target, draft, verifier, config, generator)
    speedups, per_pass = [], []
    for _ in range(config.rounds):  # alternate, so a disturbance hits one round, not one side
        plain = plain_decode(
            target, batch=config.batch, tokens=config.tokens, start=start, generator=generator, device=device
        )
        spec = speculative_decode(
            target, draft, verifier, batch=config.batch, tokens=config.tokens, k=config.k, start=start,
            generator=generator, device=device,
        )  # fmt: skip
        assert spec.tokens_per_pass is not None
        speedups.append((spec.emitted / spec.seconds) / (plain.emitted / plain.seconds))
        per_pass.append(spec.tokens_per_pass.flatten())
    all_passes = torch.cat(per_pass)
    acceptance = acceptance_from_passes(all_passes, config.k)
    model_tokens = expected_tokens_iid(acceptance, config.k)
    counts = torch.bincount(all_passes - 1, minlength=config.k + 1).tolist()
    return SweepPoint(
        mix=mix,
        acceptance_exact=exact,
        acceptance_measured=acceptance,
        tokens_per_pass=float(all_passes.double().mean()),
        tokens_per_pass_model=expected_tokens_iid(exact, config.k),
        speedup_measured=statistics.median(speedups),
        speedup_predicted=model_tokens / costs.pass_cost(config.k),
        costs=costs.as_dict(config.k),
        tokens_per_pass_counts=counts,
    )


@dataclass
class BreakEven:
    predicted: float | None  # a* from the costs measured in the sweep (median pass cost)
    measured: float | None  # where the measured speedup crosses 1 (linear in acceptance), if it does
    bracket: tuple[float, float] | None  # exact acceptances of the sweep points around the crossing


def break_even(points: Sequence[SweepPoint], k: int) -> BreakEven:
    pass_cost = statistics.median(p.costs["pass_cost"] for p in points)
    predicted = acceptance_for_tokens_per_pass(pass_cost, k)
    ordered = sorted(points, key=lambda p: p.acceptance_exact)
    for low, high in itertools.pairwise(ordered):
        if low.speedup_measured < 1.0 <= high.speedup_measured:
            fraction = (1.0 - low.speedup_measured) / (high.speedup_measured - low.speedup_measured)
            crossing = low.acceptance_measured + fraction * (high.acceptance_measured - low.acceptance_measured)
            return BreakEven(predicted, crossing, (low.acceptance_exact, high.acceptance_exact))
    return BreakEven(predicted, None, None)


def pool_costs(points: Sequence[SweepPoint], k: int) -> None:
    """Predict every point from the median pass cost of the whole sweep: the models are the same
    size at every point (only their tables differ), so one disturbed cost measurement should not
    decide a point."""
    pooled = statistics.median(p.costs["pass_cost"] for p in points)
    for point in points:
        point.costs["pass_cost_pooled"] = pooled
        point.speedup_predicted = expected_tokens_iid(point.acceptance_measured, k) / pooled


def sweep(
    verifier: Model, config: BenchConfig, mixes: Sequence[float], progress: Callable[[str], None] | None = None
) -> list[SweepPoint]:
    points = []
    for i, mix in enumerate(mixes):
        if progress:
            progress(f"[{i + 1}/{len(mixes)}] draft mixed {mix:.2f} toward uniform")
        points.append(run_point(verifier, config, mix))
    pool_costs(points, config.k)
    return points
