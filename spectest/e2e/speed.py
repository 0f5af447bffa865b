"""End to end, pillar three: does an engine's measured speedup follow the tokens-per-pass model?

Rounds, on the own-time clock (:mod:`spectest.speed.clock`) with torch on one thread (an engine in
a process of its own, :mod:`spectest.e2e.isolated`, on its process's CPU time, every part run there): the same
requests through ``generate`` (speculative) and ``plain_generate``, in alternating order, and the
engine's components timed beside them (``spectest_components``: one pass's drafting, a target
pass over K + 1 positions, one pass's verification and bookkeeping, a target pass over one position),
each a median of repeated runs that do not use the outcome under test.

The model of a round: the passes the chain predicts along the round's own output (per emitted
token y_t the acceptance r_t = min(p_t, q_t)(y_t) / p_t(y_t), the probability it came from an
accepted draft; the renewal chain of :mod:`spectest.simulators.text` gives the expected passes of
each request exactly, the last passes cut by the end); a pass costs its parts (draft, target,
verify, and the loop's own work per iteration), and each request a fixed cost with and without
speculation (a 1-token request, less one plain step):

    speedup = plain seconds / (R spec_fixed + N / E[L] * pass)

The plain side is the round's own plain decoding of the same requests, not a model of it: a plain
step is what its N tokens cost beyond R 1-token requests, (plain seconds - R plain_one) / (N - R),
and the loop's own work per iteration is that step less a target step. Estimating the step from
two short calls instead ((a 9-token call - a 1-token call) / 8, medians of three) once put 19 of
21 rounds of the unpatched transformers loop short on a CI machine (a plain step 1.16 ms where its
rounds paid 0.97 ms; 0.363x measured, 0.424x predicted, 0.378x from the same timings now): 1 ms
too much in the 9-token call moved every round's prediction 7%; 1 ms in a 1-token call now moves
it 1% (spread over the round's N - R tokens), and nothing moves its plain side.

A sign test over rounds fails the engine when its measured speedup falls more than 10% short of
that prediction in most rounds, that is when its speculative decoding takes more than 1.1 times
what its passes' parts predict; the time no term accounts for (measured seconds per reported
pass minus the components) is reported either way. A loop that throws accepted drafts away needs
more passes than its acceptance predicts; one that runs the target twice per pass spends time no
component explains. The break-even acceptance and the optimal K for the pair follow from the
same costs (drafting scaled per draft step for other K).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from spectest.simulators import CostModel, acceptance_for_tokens_per_pass, optimal_k
from spectest.speed.clock import OWN_CLOCK

PARTS = ("draft", "target", "verify")  # one pass's parts, timed through the engine's spectest_components
# Optional: the target over one position; a plain step less that is the decoding loop's own work per
# iteration, which a speculative pass pays too ("loop").
TARGET_STEP = "target_step"
REPEATS = 7


def time_parts(
    parts: dict[str, Callable[[], object]], repeats: int = REPEATS, clock: Callable[[], float] = OWN_CLOCK
) -> dict[str, float]:
    """Median seconds of each part (after one warm-up run) on ``clock``; the caller holds ``single_threaded``."""
    out = {}
    for name in (*PARTS, TARGET_STEP):
        if name in parts:
            run = parts[name]
            run()
            out[name] = statistics.median(timed(run, clock) for _ in range(repeats))
    return out


@dataclass
class EngineRound:
    """One round: the engine's speculative and plain runs of the same requests, and the model.

    ``costs`` (seconds): the pass's parts timed by the engine (draft, target, verify, and a target
    step when it has one) and a 1-token request with and without speculation (``plain_one``,
    ``spec_one``). The round adds what follows from its own plain decoding: a plain step, the fixed
    cost of a request with and without speculation (its 1-token request less one plain step), and
    the loop's own work per iteration (a plain step less a target step)."""

    spec_seconds: float
    plain_seconds: float
    tokens: int
    requests: int
    passes: int  # reported by the engine
    expected_tokens_per_pass: float  # the chain's, from the round's measured acceptance
    costs: dict[str, float]

    def __post_init__(self) -> None:
        self.costs = costs = dict(self.costs)  # the derived costs are the round's: the caller's dict stays as given
        steps = max(1, self.tokens - self.requests)  # the tokens after each request's first
        costs["plain_step"] = max(1e-9, (self.plain_seconds - self.requests * costs["plain_one"]) / steps)
        costs["plain_fixed"] = max(0.0, costs["plain_one"] - costs["plain_step"])
        costs["spec_fixed"] = max(0.0, costs["spec_one"] - costs["plain_step"])
        if TARGET_STEP in costs:
            costs["loop"] = max(0.0, costs["plain_step"] - costs[TARGET_STEP])

    @property
    def pass_cost(self) -> float:
        return sum(self.costs[name] for name in PARTS) + self.costs.get("loop", 0.0)

    @property
    def measured(self) -> float:
        return self.plain_seconds / self.spec_seconds

    @property
    def predicted_spec(self) -> float:
        passes = self.tokens / self.expected_tokens_per_pass
        return self.requests * self.costs["spec_fixed"] + passes * self.pass_cost

    @property
    def predicted(self) -> float:
        """The round's plain decoding over the speculative decoding its passes' parts predict."""
        return self.plain_seconds / self.predicted_spec

    @property
    def unexplained_per_pass(self) -> float:
        """Seconds per reported pass the model's terms do not account for."""
        return (self.spec_seconds - self.requests * self.costs["spec_fixed"]) / max(1, self.passes) - self.pass_cost


@dataclass
class EngineSpeed:
    k: int
    rounds: list[EngineRound] = field(default_factory=list)

    def median(self, name: str) -> float:
        return float(statistics.median(getattr(r, name) for r in self.rounds))

    def median_cost(self, name: str, default: float | None = None) -> float:
        """Median over rounds of one cost (``default`` where a round has none: without it, every round must)."""
        return float(
            statistics.median(r.costs[name] if default is None else r.costs.get(name, default) for r in self.rounds)
        )

    def median_pass(self) -> float:
        return float(statistics.median(r.pass_cost for r in self.rounds))

    def interval(self, name: str) -> tuple[float, float]:
        """A distribution-free 95% interval of the median over rounds (order statistics)."""
        values = sorted(getattr(r, name) for r in self.rounds)
        n = len(values)
        if n < 6:
            return values[0], values[-1]
        from scipy import stats

        low = int(stats.binom.ppf(0.025, n, 0.5))
        return values[max(0, low - 1)], values[min(n - 1, n - low)]

    def cost_model(self) -> CostModel:
        """Leviathan's terms in plain steps: c per draft step, the target pass and verification as overhead."""
        step = self.median_cost("plain_step")
        return CostModel(
            cost_ratio=max(0.0, self.median_cost("draft") / self.k / step),
            overhead=max(0.0, (self.median_cost("target") + self.median_cost("verify")) / step - 1),
        )

    def mean_acceptance(self) -> float:
        """The i.i.d. acceptance whose chain gives the rounds' median expected tokens per pass."""
        return acceptance_for_tokens_per_pass(self.median("expected_tokens_per_pass"), self.k) or 0.0

    def break_even(self) -> float | None:
        """The i.i.d. acceptance at which speculation is as fast as plain decoding for these costs."""
        return acceptance_for_tokens_per_pass(self.median_pass() / self.median_cost("plain_step"), self.k)

    def optimal_k(self, acceptance: float) -> tuple[int, float]:
        return optimal_k(min(1.0, max(0.0, acceptance)), self.cost_model(), max_k=16)

    def as_record(self) -> dict[str, object]:
        return {
            "k": self.k,
            "rounds": len(self.rounds),
            "measured": [r.measured for r in self.rounds],
            "predicted": [r.predicted for r in self.rounds],
            "tokens_per_pass_measured": [r.tokens / max(1, r.passes) for r in self.rounds],
            "tokens_per_pass_expected": [r.expected_tokens_per_pass for r in self.rounds],
            "unexplained_per_pass_s": [r.unexplained_per_pass for r in self.rounds],
            "costs_s": {name: self.median_cost(name) for name in self.rounds[0].costs},
            "break_even": self.break_even(),
            "acceptance": self.mean_acceptance(),
        }


def timed(work: Callable[[], object], clock: Callable[[], float] = OWN_CLOCK) -> float:
    """Seconds of one run of ``work`` on ``clock`` (the own clock by default: the caller holds
    ``single_threaded``; an engine in a process of its own brings its process's clock)."""
    started = clock()
    work()
    return clock() - started


def median_time(work: Callable[[], object], repeats: int = 3, clock: Callable[[], float] = OWN_CLOCK) -> float:
    return float(statistics.median(timed(work, clock) for _ in range(repeats)))
