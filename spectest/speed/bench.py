"""Measured speedups against the tokens-per-pass model and its break-even threshold.

Every cost the model needs is measured in the same *round* as the decoding it predicts, on a
clock other processes cannot steal from (:mod:`spectest.speed.clock`), with torch on one thread. A
round runs, for each acceptance point, three interleaved chunks: plain decoding, speculative
decoding with the reference verifier (the model's costs), and speculative decoding with the
implementation under test. The loops time their own phases, so each cost is measured under
the decoding run's own conditions:

* t1: a target step (forward over one position) and a plain token (forward plus sampling);
* a pass: K draft steps, one target forward over K + 1 positions, the verify call, and the
  rest (writes, loop control), each fitted as ``cost(r) = cost_bonus + (cost_reject -
  cost_bonus) r`` over all the round's reference passes, where r is the fraction of rows whose
  pass ended in a rejection (costs that depend on how a pass ended are in the model).

In units of t1, that is Leviathan et al.'s model with both overheads measured: speedup(a) =
E[L](a) (1 + o_plain) / (K c + 1 + d K + o(a)), o(a) = o_bonus + (o_reject - o_bonus)(1 - a^K).
The model is the cost of an *efficient* pass: verification costs what the reference's costs.
An implementation whose passes cost more (a full residual at every position, a wait per
rejection) measures below the model, and the speed property says by how much.

The pair used makes acceptance identical in every context (see
:func:`spectest.speed.decoding.uniform_acceptance_pair`), so E[L] of the i.i.d. chain is exact.
"""

from __future__ import annotations

import itertools
import statistics
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from spectest.protocol import Model
from spectest.sampling import make_generator
from spectest.simulators import CostModel, break_even_acceptance, expected_tokens_iid, speedup
from spectest.speed.clock import OWN_CLOCK, single_threaded
from spectest.speed.decoding import (
    CostedMarkovLM,
    DecodeResult,
    acceptance_from_passes,
    plain_decode,
    speculative_decode,
    uniform_acceptance_pair,
)

SPEED_MARGIN = 1.1  # the model's claim: a pass costs within 10% of it


@dataclass(frozen=True)
class BenchConfig:
    """A decoder-shaped workload: V = 32000, a target whose step reads ``target_mb`` of
    weights, a draft reading ``draft_mb``, per-position arithmetic of ``layers`` [n, H] x [H, H]
    products; each round times ``tokens`` plain steps and ``passes`` speculative passes per point."""

    vocab: int = 32000
    k: int = 4
    target_mb: float = 24.0
    draft_mb: float = 0.25
    target_hidden: int = 128
    draft_hidden: int = 16
    layers: int = 2
    batch: int = 1
    tokens: int = 16  # per row in each plain chunk
    passes: int = 6  # in each speculative chunk
    seed: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class PhaseFit:
    """A pass phase's cost when every row ended in a bonus (r = 0) and in a rejection (r = 1)."""

    bonus: float
    reject: float

    def at(self, r: float) -> float:
        return self.bonus + (self.reject - self.bonus) * r

    @classmethod
    def fit(cls, seconds: np.ndarray, rejected: np.ndarray) -> PhaseFit:
        """Least squares over passes; the mean for both ends when r does not vary."""
        if np.ptp(rejected) < 1e-12:
            mean = float(seconds.mean())
            return cls(mean, mean)
        slope, intercept = np.polyfit(rejected, seconds, 1)
        return cls(float(intercept), float(intercept + slope))


@dataclass(frozen=True)
class RoundCosts:
    """The model's costs in seconds, from one round's plain and reference chunks."""

    k: int
    target_step: float  # target forward over one position (t1)
    plain_token: float  # one plain decoding step: forward, sampling, writes
    draft: PhaseFit  # K draft steps
    verify_forward: PhaseFit  # target forward over K + 1 positions
    verify: PhaseFit  # the verifier call, contract checks included
    rest: PhaseFit  # writes and loop control

    def pass_cost(self, rejected: float) -> float:
        return sum(f.at(rejected) for f in (self.draft, self.verify_forward, self.verify, self.rest))

    def pass_cost_without_verify(self, rejected: float) -> float:
        """What a pass would cost with a free verifier: no implementation can beat it."""
        return self.pass_cost(rejected) - self.verify.at(rejected)

    def cost_model(self) -> CostModel:
        """Leviathan et al.'s terms in target steps: c, d, o for a bonus pass and a rejected one, o_plain."""
        t1 = self.target_step
        k = self.k
        overhead = (self.verify.bonus + self.rest.bonus) / t1
        return CostModel(
            cost_ratio=max(0.0, self.draft.at(0.5) / k / t1),
            verify_growth=max(0.0, (self.verify_forward.at(0.5) / t1 - 1) / k),
            overhead=max(0.0, overhead),
            rejection_overhead=(self.verify.reject + self.rest.reject) / t1 - overhead,
            plain_overhead=max(0.0, self.plain_token / t1 - 1),
        )

    def as_dict(self) -> dict[str, float]:
        model = self.cost_model()
        return {
            "target_step_s": self.target_step,
            "plain_token_s": self.plain_token,
            "pass_bonus_s": self.pass_cost(0.0),
            "pass_reject_s": self.pass_cost(1.0),
            "verify_bonus_s": self.verify.bonus,
            "verify_reject_s": self.verify.reject,
            "cost_ratio": model.cost_ratio,
            "verify_growth": model.verify_growth,
            "overhead": model.overhead,
            "rejection_overhead": model.rejection_overhead,
            "plain_overhead": model.plain_overhead,
        }


def rejected_fraction(result: DecodeResult) -> np.ndarray:
    """Per pass: the fraction of rows whose pass ended in a rejection (emitted K tokens or fewer)."""
    assert result.tokens_per_pass is not None
    return (result.tokens_per_pass <= result.k).double().mean(dim=0).cpu().numpy()


def round_costs(plains: Sequence[DecodeResult], references: Sequence[DecodeResult], k: int) -> RoundCosts:
    phases = np.concatenate([r.phases for r in references])
    rejected = np.concatenate([rejected_fraction(r) for r in references])
    plain_phases = np.concatenate([p.phases for p in plains])
    fits = [PhaseFit.fit(phases[:, i], rejected) for i in range(4)]
    return RoundCosts(
        k=k,
        target_step=float(plain_phases[:, 0].mean()),
        plain_token=sum(p.seconds for p in plains) / sum(p.phases.shape[0] for p in plains),
        draft=fits[0],
        verify_forward=fits[1],
        verify=fits[2],
        rest=fits[3],
    )


@dataclass
class PointRound:
    """One acceptance point in one round: the implementation's chunk against the round's model."""

    round: int
    tokens: int  # emitted by the implementation, over all rows
    passes: int
    rejected: float  # fraction of (row, pass) ending in a rejection
    pass_cost: float  # measured seconds per pass
    model_pass_cost: float  # the round's model at this chunk's rejections
    free_verify_pass_cost: float  # the model with a free verifier
    plain_steps: float  # the chunk's time in plain decoding steps of the same round
    predicted: float  # the model's speedup at the point's exact acceptance

    @property
    def speedup(self) -> float:
        """Measured: tokens per row over the plain steps the same time buys."""
        return self.tokens / self.plain_steps

    @property
    def cost_ratio(self) -> float:
        """Model pass cost over measured (below 1: the implementation's passes cost more)."""
        return self.model_pass_cost / self.pass_cost


@dataclass
class SpeedPoint:
    mix: float
    acceptance_exact: float
    rounds: list[PointRound] = field(default_factory=list)
    tokens_per_pass_counts: list[int] = field(default_factory=list)  # passes that emitted 1..K+1

    @property
    def acceptance_measured(self) -> float:
        counts = np.array(self.tokens_per_pass_counts)
        passes = torch.as_tensor(np.repeat(np.arange(1, counts.size + 1), counts))
        return acceptance_from_passes(passes, counts.size - 1) if counts.sum() else float("nan")

    @property
    def speedup_measured(self) -> float:
        """All rounds pooled: tokens over the plain steps their time would have bought."""
        return sum(r.tokens for r in self.rounds) / sum(r.plain_steps for r in self.rounds)

    @property
    def speedup_predicted(self) -> float:
        return statistics.median(r.predicted for r in self.rounds)

    @property
    def ratio(self) -> float:
        """Measured over predicted speedup."""
        return self.speedup_measured / self.speedup_predicted

    @property
    def pass_cost_ratio(self) -> float:
        """Model over measured pass cost (median over rounds)."""
        return statistics.median(r.cost_ratio for r in self.rounds)

    @property
    def tokens_per_pass(self) -> float:
        counts = np.array(self.tokens_per_pass_counts)
        return float((counts * np.arange(1, counts.size + 1)).sum() / max(1, counts.sum()))


class SpeedBench:
    """Plain, reference and implementation decoding of the same costed pair, round by round."""

    def __init__(
        self,
        model: Model,
        reference: Model,
        config: BenchConfig,
        mixes: Sequence[float],
        *,
        timeout: float | None = None,
    ) -> None:
        self.model, self.reference, self.config, self.timeout = model, reference, config, timeout
        self.device = torch.device(config.device)
        self.clock = OWN_CLOCK
        cfg = config
        self.pairs = [uniform_acceptance_pair(cfg.vocab, mix, seed=cfg.seed, device=self.device) for mix in mixes]
        self.points = [SpeedPoint(mix, pair[2]) for mix, pair in zip(mixes, self.pairs, strict=True)]
        # The target table is the same at every point (only the draft moves): one target model.
        self.target = CostedMarkovLM(
            self.pairs[0][0],
            hidden=cfg.target_hidden,
            layers=cfg.layers,
            weight_mb=cfg.target_mb,
            device=self.device,
            seed=1,
        )
        self.drafts = [
            CostedMarkovLM(
                pair[1], hidden=cfg.draft_hidden, layers=cfg.layers, weight_mb=cfg.draft_mb, device=self.device, seed=2
            )
            for pair in self.pairs
        ]
        self.history: list[RoundCosts] = []
        self.rounds_run = 0

    def _generator(self, *labels: object) -> torch.Generator:
        text = ":".join(map(str, (self.config.seed, *labels)))
        return make_generator(zlib.crc32(text.encode()), self.device)

    def _plain(self, label: object) -> DecodeResult:
        cfg = self.config
        return plain_decode(
            self.target,
            batch=cfg.batch,
            tokens=cfg.tokens,
            start=cfg.vocab,
            generator=self._generator("plain", label),
            device=self.device,
            clock=self.clock,
            phases=True,
        )

    def _speculative(self, verifier: Model, index: int, label: object) -> DecodeResult:
        cfg = self.config
        return speculative_decode(
            self.target,
            self.drafts[index],
            verifier,
            batch=cfg.batch,
            tokens=0,
            passes=cfg.passes,
            k=cfg.k,
            start=cfg.vocab,
            generator=self._generator(index, label),
            device=self.device,
            clock=self.clock,
            phases=True,
            timeout=self.timeout,
        )

    def timing_spread(self, repeats: int = 15) -> float:
        """Interquartile range over median of repeated identical target steps: can this machine be timed?"""
        tokens = torch.zeros((self.config.batch, 1), dtype=torch.int64, device=self.device)
        with single_threaded():
            self.target.forward(tokens)
            times = []
            for _ in range(repeats):
                started = self.clock()
                self.target.forward(tokens)
                times.append(self.clock() - started)
        q1, q2, q3 = statistics.quantiles(times, n=4)
        return (q3 - q1) / q2 if q2 > 0 else float("inf")

    def warm_up(self) -> None:
        with single_threaded():
            self._plain("warm-up")
            for verifier in (self.reference, self.model):
                self._speculative(verifier, len(self.points) - 1, "warm-up")

    def run_round(self, indices: Sequence[int]) -> list[PointRound]:
        """One round over the given points; returns each point's comparison with this round's model."""
        cfg = self.config
        label = self.rounds_run
        self.rounds_run += 1
        plains, references, chunks = [], [], []
        with single_threaded():
            for i in indices:
                plains.append(self._plain((label, i)))
                # Alternate which of the two speculative chunks runs first, so neither always finds warm caches.
                if label % 2 == 0:
                    references.append(self._speculative(self.reference, i, ("reference", label)))
                    chunks.append(self._speculative(self.model, i, ("model", label)))
                else:
                    chunks.append(self._speculative(self.model, i, ("model", label)))
                    references.append(self._speculative(self.reference, i, ("reference", label)))
        costs = round_costs(plains, references, cfg.k)
        self.history.append(costs)
        out = []
        model = costs.cost_model()
        for i, chunk in zip(indices, chunks, strict=True):
            point = self.points[i]
            rejected = rejected_fraction(chunk)
            r = float(rejected.mean())
            measured = chunk.seconds / chunk.passes
            assert chunk.tokens_per_pass is not None
            lengths = chunk.tokens_per_pass.flatten().cpu()
            counts = torch.bincount(lengths - 1, minlength=cfg.k + 1).tolist()
            point.tokens_per_pass_counts = [
                a + b for a, b in zip(point.tokens_per_pass_counts or [0] * len(counts), counts, strict=True)
            ]
            result = PointRound(
                round=label,
                tokens=chunk.emitted,
                passes=chunk.passes,
                rejected=r,
                pass_cost=measured,
                model_pass_cost=costs.pass_cost(r),
                free_verify_pass_cost=costs.pass_cost_without_verify(r),
                plain_steps=chunk.seconds / costs.plain_token * cfg.batch,
                predicted=speedup(point.acceptance_exact, cfg.k, model),
            )
            point.rounds.append(result)
            out.append(result)
        return out

    def pooled_costs(self) -> CostModel:
        """The model with every round's costs pooled (medians of each term): for reports and a*."""
        models = [c.cost_model() for c in self.history]
        return CostModel(**{name: statistics.median(getattr(m, name) for m in models) for name in COST_TERMS})


COST_TERMS = ("cost_ratio", "verify_growth", "overhead", "rejection_overhead", "plain_overhead")


@dataclass
class BreakEven:
    predicted: float | None  # a* from the pooled costs
    measured: float | None  # where the measured speedup crosses 1 (linear in acceptance), if it does
    bracket: tuple[float, float] | None  # exact acceptances of the sweep points around the crossing


def break_even(points: Sequence[SpeedPoint], k: int, costs: CostModel) -> BreakEven:
    predicted = break_even_acceptance(k, costs)
    ordered = sorted((p for p in points if p.rounds), key=lambda p: p.acceptance_exact)
    for low, high in itertools.pairwise(ordered):
        if low.speedup_measured < 1.0 <= high.speedup_measured:
            fraction = (1.0 - low.speedup_measured) / (high.speedup_measured - low.speedup_measured)
            crossing = low.acceptance_exact + fraction * (high.acceptance_exact - low.acceptance_exact)
            return BreakEven(predicted, crossing, (low.acceptance_exact, high.acceptance_exact))
    return BreakEven(predicted, None, None)


def point_record(point: SpeedPoint, k: int, costs: CostModel) -> dict[str, object]:
    """A point as the results file and the report's plots carry it."""
    from spectest.simulators import tokens_per_pass_iid

    return {
        "mix": point.mix,
        "acceptance": point.acceptance_exact,
        "acceptance_measured": point.acceptance_measured,
        "measured": point.speedup_measured,
        "predicted": point.speedup_predicted,
        "ratio": point.ratio,
        "pass_cost_ratio": point.pass_cost_ratio,
        "pass_cost": costs.pass_cost(k, point.acceptance_exact) / (1 + costs.plain_overhead),
        "rounds": len(point.rounds),
        "counts": point.tokens_per_pass_counts,
        "model_probs": tokens_per_pass_iid(point.acceptance_exact, k).probs.tolist(),
        "tokens_per_pass": point.tokens_per_pass,
        "tokens_per_pass_model": expected_tokens_iid(point.acceptance_exact, k),
    }


def sweep(
    model: Model,
    config: BenchConfig,
    mixes: Sequence[float],
    *,
    rounds: int = 5,
    reference: Model | None = None,
    progress: Callable[[str], None] | None = None,
) -> SpeedBench:
    """A fixed number of rounds over every point (``spectest bench``)."""
    bench = SpeedBench(model, reference or reference_model(), config, mixes)
    bench.warm_up()
    for r in range(rounds):
        if progress:
            progress(f"round {r + 1}/{rounds}")
        bench.run_round(range(len(mixes)))
    return bench


def reference_model() -> Model:
    from spectest.resolve import resolve_model

    return resolve_model("reference")


def config_dict(config: BenchConfig) -> dict[str, object]:
    return asdict(config)
