"""Measured speedups against the tokens-per-pass model and its break-even threshold.

Every cost the model needs is measured in the same *round* as the decoding it predicts, on a
clock other processes cannot steal from (:mod:`spectest.speed.clock`), with torch on one thread. A
round runs, for each acceptance point, three interleaved chunks: plain decoding, speculative
decoding with the reference verifier (the loop's costs), and speculative decoding with the
implementation under test; and once per round the implementation with every draft accepted
(the *calibration* chunk). The loops time their own phases, so each cost is measured under
the decoding run's own conditions:

* t1: a target step (forward over one position) and a plain token (forward plus sampling);
* a pass: K draft steps, one target forward over K + 1 positions, the verify call, and the
  rest (writes, loop control), each fitted as ``cost(r) = cost_bonus (1 - r) + cost_reject r``
  over all the round's reference passes (non-negative, robust: :meth:`PhaseFit.fit`), where r
  is the fraction of rows whose pass ended in a rejection.

In units of t1, that is Leviathan et al.'s model with both overheads measured: speedup(a) =
E[L](a) (1 + o_plain) / (K c + 1 + d K + o(a)), o(a) = o_bonus + (o_reject - o_bonus)(1 - a^K).
Two models come out of a round, differing only in the verify term:

* the implementation's *own* costs: its pass, phase by phase, as the calibration chunk timed
  it (every draft accepted: a timing that does not use the acceptance any point tests), plus
  what a rejection adds to an efficient pass. The speed property holds the measured speedup to
  this prediction: a verifier whose cost grows with rejections, or that wastes accepted drafts,
  measures below it;
* an *efficient* pass: the reference's verify cost. How far the implementation's passes are
  from it is always measured and reported, and gated only on request (``--spec-speed-gate``).

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
from scipy import optimize

from spectest.protocol import Model
from spectest.sampling import make_generator
from spectest.simulators import CostModel, break_even_acceptance, expected_tokens_iid, speedup
from spectest.speed.clock import OWN_CLOCK, single_threaded, timing_noise
from spectest.speed.decoding import (
    CostedMarkovLM,
    DecodeResult,
    acceptance_from_passes,
    plain_decode,
    speculative_decode,
    uniform_acceptance_pair,
)

SPEED_MARGIN = 1.1  # the model's claim: the measured speedup within 10% of the prediction
# A round whose reference passes scatter around the fitted costs by more than this share of a
# pass (median absolute residual), and by more than FIT_NOISE_FACTOR times the spread of the
# round's identical target steps, cannot price a pass: it is left out of the verdicts.
FIT_RESIDUAL_LIMIT = SPEED_MARGIN - 1
FIT_NOISE_FACTOR = 3.0
# The agreement tests tolerate this many rounds without the event before they could still reject:
# a round's speedup carries the sampling noise of its tokens, and a correct implementation falls
# below the margin in a few percent of rounds.
AGREEMENT_MISSES = 3


@dataclass(frozen=True)
class BenchConfig:
    """A decoder-shaped workload: V = 32000, a target whose step reads ``target_mb`` of
    weights, a draft reading ``draft_mb``, per-position arithmetic of ``layers`` [n, H] x [H, H]
    products; each round times ``tokens`` plain steps, ``passes`` speculative passes of the
    reference (the model's costs) and ``model_passes`` of the implementation (default
    ``passes``) per point. A batch of several rows averages tokens per pass over rows, so one
    round's speedup is measured to a few percent rather than to the spread of one row's passes."""

    vocab: int = 32000
    k: int = 4
    target_mb: float = 24.0
    draft_mb: float = 0.25
    target_hidden: int = 128
    draft_hidden: int = 16
    layers: int = 2
    batch: int = 1
    tokens: int = 16  # per row in each plain chunk
    passes: int = 6  # in each reference (and calibration) chunk
    seed: int = 0
    device: str = "cpu"
    model_passes: int | None = None  # in each of the implementation's chunks (default: passes)

    @property
    def implementation_passes(self) -> int:
        return self.model_passes or self.passes


@dataclass(frozen=True)
class PhaseFit:
    """A pass phase's cost when every row ended in a bonus (r = 0) and in a rejection (r = 1)."""

    bonus: float
    reject: float

    def at(self, r: float | np.ndarray) -> float | np.ndarray:
        """The cost at a rejected share ``r`` (a number, or an array of them)."""
        return self.bonus + (self.reject - self.bonus) * r

    @classmethod
    def fit(cls, seconds: np.ndarray, rejected: np.ndarray) -> PhaseFit:
        """cost(r) = bonus (1 - r) + reject r over the passes, with both ends >= 0 (a cost cannot
        be negative, however noisy the timings) and a robust loss (Cauchy: one pass that a page
        fault or a preemption stretched does not move the fit); the median at both ends when r
        does not vary."""
        seconds = np.asarray(seconds, dtype=np.float64)
        rejected = np.asarray(rejected, dtype=np.float64)
        if np.ptp(rejected) < 1e-12:
            middle = max(0.0, float(np.median(seconds)))
            return cls(middle, middle)
        design = np.stack([1 - rejected, rejected], axis=1)
        scale = max(float(np.median(np.abs(seconds - np.median(seconds)))), 1e-3 * float(np.abs(seconds).max()), 1e-12)
        start = np.clip(np.linalg.lstsq(design, seconds, rcond=None)[0], 0.0, None)
        fitted = optimize.least_squares(
            lambda x: design @ x - seconds, start, bounds=(0.0, np.inf), loss="cauchy", f_scale=scale
        )
        bonus, reject = (max(0.0, float(v)) for v in fitted.x)
        return cls(bonus, reject)


def relative_spread(values: np.ndarray) -> float:
    """Median absolute deviation over the median: how much identical timings scatter."""
    values = np.asarray(values, dtype=np.float64)
    middle = float(np.median(values))
    return float(np.median(np.abs(values - middle))) / middle if middle > 0 else float("inf")


PHASES = ("draft", "verify_forward", "verify", "rest")


@dataclass(frozen=True)
class RoundCosts:
    """The model's costs in seconds, from one round's plain and reference chunks, and the
    implementation's own pass from its calibration chunk (every draft accepted)."""

    k: int
    target_step: float  # target forward over one position (t1)
    plain_token: float  # one plain decoding step: forward, sampling, writes
    draft: PhaseFit  # K draft steps
    verify_forward: PhaseFit  # target forward over K + 1 positions
    verify: PhaseFit  # the reference's verify call, contract checks included
    rest: PhaseFit  # writes and loop control
    # The implementation's pass with every draft accepted, phase by phase (median seconds).
    calibration: tuple[float, float, float, float] | None = None
    fit_residual: float = 0.0  # reference passes around the fitted pass cost (median |residual| / median pass)
    step_noise: float = 0.0  # spread of the round's identical target steps (relative_spread)

    @property
    def fit_ok(self) -> bool:
        """Does the fit price a pass as well as the round's own timing noise allows? A round whose
        passes scatter more than FIT_RESIDUAL_LIMIT and FIT_NOISE_FACTOR times the step noise cannot."""
        return self.fit_residual <= max(FIT_RESIDUAL_LIMIT, FIT_NOISE_FACTOR * self.step_noise)

    @property
    def phases(self) -> tuple[PhaseFit, PhaseFit, PhaseFit, PhaseFit]:
        """An efficient pass: the reference's, phase by phase."""
        return (self.draft, self.verify_forward, self.verify, self.rest)

    @property
    def own_phases(self) -> tuple[PhaseFit, PhaseFit, PhaseFit, PhaseFit]:
        """The implementation's own pass: each phase as its calibration chunk timed it (every draft
        accepted: a timing that does not use the acceptance any point tests; a verifier that slows
        the loop around it, by evicting caches say, pays for that here too), plus what a rejection
        adds to that phase in an efficient pass (the residual row)."""
        if self.calibration is None:
            return self.phases
        return tuple(
            PhaseFit(own, max(0.0, own + fit.reject - fit.bonus))
            for own, fit in zip(self.calibration, self.phases, strict=True)
        )  # type: ignore[return-value]

    def pass_cost(self, rejected: float, phases: Sequence[PhaseFit] | None = None) -> float:
        """Seconds of a pass in which a share ``rejected`` of the rows ended in a rejection: an
        efficient pass, or the given phases'."""
        return sum(f.at(rejected) for f in phases or self.phases)

    def own_pass_cost(self, rejected: float) -> float:
        """The same pass at the implementation's own costs."""
        return self.pass_cost(rejected, self.own_phases)

    def pass_cost_without_verify(self, rejected: float) -> float:
        """What a pass would cost with a free verifier: no implementation can beat it."""
        return self.pass_cost(rejected) - self.verify.at(rejected)

    def cost_model(self, phases: Sequence[PhaseFit] | None = None) -> CostModel:
        """Leviathan et al.'s terms in target steps: c, d, o for a bonus pass and a rejected one,
        o_plain; for an efficient pass, or the given phases. Every fit is non-negative, so the
        terms are valid whatever the timings."""
        draft, verify_forward, verify, rest = phases or self.phases
        t1 = max(self.target_step, 1e-12)
        k = self.k
        overhead = max(0.0, (verify.bonus + rest.bonus) / t1)
        rejected = max(0.0, (verify.reject + rest.reject) / t1)
        return CostModel(
            cost_ratio=max(0.0, draft.at(0.5) / k / t1),
            verify_growth=max(0.0, (verify_forward.at(0.5) / t1 - 1) / k),
            overhead=overhead,
            rejection_overhead=rejected - overhead,
            plain_overhead=max(0.0, self.plain_token / t1 - 1),
        )

    def own_cost_model(self) -> CostModel:
        return self.cost_model(self.own_phases)

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


def round_costs(
    plains: Sequence[DecodeResult],
    references: Sequence[DecodeResult],
    k: int,
    calibration: DecodeResult | None = None,
) -> RoundCosts:
    phases = np.concatenate([r.phases for r in references])
    rejected = np.concatenate([rejected_fraction(r) for r in references])
    plain_phases = np.concatenate([p.phases for p in plains])
    fits = [PhaseFit.fit(phases[:, i], rejected) for i in range(4)]
    fitted = sum(f.at(rejected) for f in fits)
    totals = phases.sum(axis=1)
    scale = float(np.median(totals))
    return RoundCosts(
        k=k,
        target_step=float(plain_phases[:, 0].mean()),
        plain_token=sum(p.seconds for p in plains) / sum(p.phases.shape[0] for p in plains),
        draft=fits[0],
        verify_forward=fits[1],
        verify=fits[2],
        rest=fits[3],
        calibration=None if calibration is None else tuple(float(x) for x in np.median(calibration.phases, axis=0)),
        fit_residual=float(np.median(np.abs(totals - fitted))) / scale if scale > 0 else float("inf"),
        step_noise=relative_spread(plain_phases[:, 0]),
    )


@dataclass
class PointRound:
    """One acceptance point in one round: the implementation's chunk against the round's models."""

    round: int
    tokens: int  # emitted by the implementation, over all rows
    passes: int
    rejected: float  # fraction of (row, pass) ending in a rejection
    pass_cost: float  # measured seconds per pass
    model_pass_cost: float  # an efficient pass (the reference's verify) at this chunk's rejections
    free_verify_pass_cost: float  # the model with a free verifier
    plain_steps: float  # the chunk's time in plain decoding tokens of the same round
    predicted: float  # an efficient pass's speedup at the point's exact acceptance
    own_predicted: float = float("nan")  # the speedup the model predicts with the implementation's own costs
    fit_ok: bool = True  # the round's costs price a pass within its timing noise (see RoundCosts.fit_ok)

    @property
    def speedup(self) -> float:
        """Measured: tokens over the plain tokens the same time buys."""
        return self.tokens / self.plain_steps

    @property
    def cost_ratio(self) -> float:
        """Efficient pass cost over measured (below 1: the implementation's passes cost more)."""
        return self.model_pass_cost / self.pass_cost

    @property
    def agreement(self) -> float:
        """Measured speedup over the speedup its own costs predict (1: the model describes it)."""
        return self.speedup / self.own_predicted


@dataclass
class SpeedPoint:
    mix: float
    acceptance_exact: float
    rounds: list[PointRound] = field(default_factory=list)
    tokens_per_pass_counts: list[int] = field(default_factory=list)  # row-passes that emitted 1..K+1

    @property
    def judged(self) -> list[PointRound]:
        """The rounds whose costs priced a pass (all of them, when none did)."""
        return [r for r in self.rounds if r.fit_ok] or self.rounds

    @property
    def acceptance_measured(self) -> float:
        counts = np.array(self.tokens_per_pass_counts)
        passes = torch.as_tensor(np.repeat(np.arange(1, counts.size + 1), counts))
        return acceptance_from_passes(passes, counts.size - 1) if counts.sum() else float("nan")

    @property
    def speedup_measured(self) -> float:
        """All rounds pooled: tokens over the plain tokens their time would have bought."""
        return sum(r.tokens for r in self.judged) / sum(r.plain_steps for r in self.judged)

    @property
    def speedup_predicted(self) -> float:
        """An efficient pass's speedup (median over rounds)."""
        return statistics.median(r.predicted for r in self.judged)

    @property
    def speedup_own(self) -> float:
        """The speedup the implementation's own costs predict (median over rounds)."""
        return statistics.median(r.own_predicted for r in self.judged)

    @property
    def ratio(self) -> float:
        """Measured over an efficient pass's predicted speedup."""
        return self.speedup_measured / self.speedup_predicted

    @property
    def agreement(self) -> float:
        """Measured over the speedup predicted with the implementation's own costs."""
        return self.speedup_measured / self.speedup_own

    @property
    def pass_cost_ratio(self) -> float:
        """Efficient pass cost over measured (median over rounds): x0.4 means 2.5 times an efficient pass."""
        return statistics.median(r.cost_ratio for r in self.judged)

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
        # The last draft is the calibration one: equal to the target, every draft accepted.
        calibration = uniform_acceptance_pair(cfg.vocab, 0.0, seed=cfg.seed, device=self.device)
        self.drafts = [
            CostedMarkovLM(
                pair[1], hidden=cfg.draft_hidden, layers=cfg.layers, weight_mb=cfg.draft_mb, device=self.device, seed=2
            )
            for pair in [*self.pairs, calibration]
        ]
        self.history: list[RoundCosts] = []
        self.rounds_run = 0

    @property
    def calibration_index(self) -> int:
        return len(self.drafts) - 1

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

    def _speculative(self, verifier: Model, index: int, label: object, passes: int | None = None) -> DecodeResult:
        cfg = self.config
        return speculative_decode(
            self.target,
            self.drafts[index],
            verifier,
            batch=cfg.batch,
            tokens=0,
            passes=passes or cfg.passes,
            k=cfg.k,
            start=cfg.vocab,
            generator=self._generator(index, label),
            device=self.device,
            clock=self.clock,
            phases=True,
            timeout=self.timeout,
        )

    def timing_spread(self) -> float:
        """How much identical target steps spread on this machine (see :func:`timing_noise`)."""
        tokens = torch.zeros((self.config.batch, 1), dtype=torch.int64, device=self.device)
        with single_threaded():
            return timing_noise(lambda: self.target.forward(tokens), clock=self.clock, warm=5)

    def warm_up(self) -> None:
        with single_threaded():
            self._plain("warm-up")
            for verifier in (self.reference, self.model):
                self._speculative(verifier, len(self.points) - 1, "warm-up")

    def run_round(self, indices: Sequence[int]) -> list[PointRound]:
        """One round over the given points; returns each point's comparison with this round's models.

        Besides the points, the round times the implementation once with every draft accepted
        (the calibration chunk): its verify cost there is the implementation's own cost in the
        model, measured without the acceptance any point tests."""
        cfg = self.config
        label = self.rounds_run
        self.rounds_run += 1
        plains, references, chunks = [], [], []
        model_passes = cfg.implementation_passes
        with single_threaded():
            calibration = self._speculative(self.model, self.calibration_index, ("calibration", label))
            for i in indices:
                plains.append(self._plain((label, i)))
                # Alternate which of the two speculative chunks runs first, so neither always finds warm caches.
                if label % 2 == 0:
                    references.append(self._speculative(self.reference, i, ("reference", label)))
                    chunks.append(self._speculative(self.model, i, ("model", label), model_passes))
                else:
                    chunks.append(self._speculative(self.model, i, ("model", label), model_passes))
                    references.append(self._speculative(self.reference, i, ("reference", label)))
        costs = round_costs(plains, references, cfg.k, calibration)
        self.history.append(costs)
        out = []
        model, own = costs.cost_model(), costs.own_cost_model()
        for i, chunk in zip(indices, chunks, strict=True):
            point = self.points[i]
            r = float(rejected_fraction(chunk).mean())
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
                pass_cost=chunk.seconds / chunk.passes,
                model_pass_cost=costs.pass_cost(r),
                free_verify_pass_cost=costs.pass_cost_without_verify(r),
                plain_steps=chunk.seconds / costs.plain_token * cfg.batch,
                predicted=speedup(point.acceptance_exact, cfg.k, model),
                own_predicted=speedup(point.acceptance_exact, cfg.k, own),
                fit_ok=costs.fit_ok,
            )
            point.rounds.append(result)
            out.append(result)
        return out

    def pooled_costs(self, *, own: bool = False) -> CostModel:
        """The model with every round's costs pooled (medians of each term; rounds whose fit
        priced a pass, when there are any): an efficient pass's, or with ``own`` the implementation's."""
        rounds = [c for c in self.history if c.fit_ok] or self.history
        models = [c.own_cost_model() if own else c.cost_model() for c in rounds]
        return CostModel(**{name: statistics.median(getattr(m, name) for m in models) for name in COST_TERMS})

    @property
    def poor_fits(self) -> int:
        """Rounds whose costs did not price a pass within the round's timing noise."""
        return sum(not c.fit_ok for c in self.history)


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
        "predicted_own": point.speedup_own,
        "agreement": point.agreement,
        "pass_cost_ratio": point.pass_cost_ratio,
        "pass_cost": costs.pass_cost(k, point.acceptance_exact) / (1 + costs.plain_overhead),
        "rounds": len(point.rounds),
        "rounds_judged": sum(r.fit_ok for r in point.rounds),
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
