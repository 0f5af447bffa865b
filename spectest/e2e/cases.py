"""Request batches for an engine: prompts and per-request sampling parameters, drawn from a seed.

A case is a small recipe Hypothesis draws and shrinks (requests per call, tokens to generate,
prompt lengths, which parameters the requests use, a seed); every call of the case draws fresh
prompts and parameters from a generator seeded by the case and the call, so any failure replays
from the run's seed.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from spectest.sampling_params import NO_SEED, PARAMETERS, SamplingParams

MIXES = ("mixed", "sampled", "filtered", "greedy")


@dataclass(frozen=True)
class EngineCase:
    """``requests`` prompts per generate call, ``max_new_tokens`` each, prompts of
    ``prompt_lengths`` tokens; ``mix``: which parameters the requests draw: "mixed" (greedy,
    plain and filtered requests side by side), "sampled" (temperature only), "filtered" (every
    request uses top-k, top-p or min-p) or "greedy"; ``seeded``: share of requests with their own seed."""

    requests: int
    max_new_tokens: int
    prompt_lengths: tuple[int, int]
    mix: str
    seed: int
    seeded: float = 0.5

    def describe(self) -> str:
        return (
            f"{self.requests} requests per call, {self.max_new_tokens} new tokens each, prompts of "
            f"{self.prompt_lengths[0]}-{self.prompt_lengths[1]} tokens, {self.mix} parameters"
        )


@st.composite
def engine_cases(
    draw: st.DrawFn,
    *,
    requests: tuple[int, int] = (4, 8),
    new_tokens: tuple[int, int] = (8, 24),
    mixes: tuple[str, ...] = ("mixed", "sampled", "filtered"),
) -> EngineCase:
    low = draw(st.integers(1, 8))
    return EngineCase(
        requests=draw(st.integers(*requests)),
        max_new_tokens=draw(st.integers(*new_tokens)),
        prompt_lengths=(low, low + draw(st.integers(0, 8))),
        mix=draw(st.sampled_from(mixes)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@dataclass(frozen=True)
class Requests:
    """One generate call's worth of requests."""

    prompts: list[list[int]]
    params: SamplingParams
    seed: int  # the run-level seed handed to generate (requests without their own use it)

    def describe(self, row: int) -> str:
        prompt = self.prompts[row]
        shown = prompt if len(prompt) <= 16 else [*prompt[:16], "..."]
        return f"request {row} ({self.params.describe_row(row)}), prompt {shown}"


def draw_prompt(
    rng: np.random.Generator, size: int, vocab: int, tokens: tuple[int, ...] = (), prefix: tuple[int, ...] = ()
) -> list[int]:
    """``size`` ids drawn uniformly from the vocabulary (or from ``tokens``, the ids an engine's prompts may
    hold), after ``prefix``."""
    if not tokens:
        return [*prefix, *rng.integers(0, vocab, size=size).tolist()]
    return [*prefix, *np.asarray(tokens)[rng.integers(0, len(tokens), size=size)].tolist()]


def draw_requests(
    case: EngineCase,
    vocab: int,
    call: int,
    supported: tuple[str, ...] = PARAMETERS,
    *,
    tokens: tuple[int, ...] = (),
    prefix: tuple[int, ...] = (),
) -> Requests:
    """The ``call``-th batch of requests of ``case`` over a vocabulary of ``vocab`` ids; a filter the
    engine does not take (``supported``: its ``spectest_sampling_params``) is drawn, then left off;
    prompts hold only ``tokens`` (if named) after ``prefix``."""
    rng = np.random.default_rng([case.seed, call])
    n = case.requests
    prompts = [
        draw_prompt(rng, int(rng.integers(case.prompt_lengths[0], case.prompt_lengths[1] + 1)), vocab, tokens, prefix)
        for _ in range(n)
    ]
    temperature = np.round(rng.uniform(0.4, 1.5, n), 3)
    top_k = np.zeros(n, dtype=np.int64)
    top_p = np.ones(n)
    min_p = np.zeros(n)
    if case.mix == "greedy":
        temperature[:] = 0.0
    elif case.mix in ("mixed", "filtered"):
        if case.mix == "mixed":
            temperature[rng.random(n) < 0.2] = 0.0
        which = rng.integers(0, 3, n) if case.mix == "filtered" else rng.integers(0, 5, n)  # 3, 4: unfiltered
        mask = which == 0
        top_k[mask] = rng.integers(1, max(2, vocab // 4), int(mask.sum()))
        mask = which == 1
        top_p[mask] = np.round(rng.uniform(0.5, 0.98, int(mask.sum())), 3)
        mask = which == 2
        min_p[mask] = np.round(rng.uniform(0.01, 0.2, int(mask.sum())), 3)
        both = rng.random(n) < 0.2  # some requests stack two filters
        top_p[both & (which == 0)] = 0.9
    seeds = np.where(rng.random(n) < case.seeded, rng.integers(0, 2**31 - 1, n), NO_SEED)
    top_k[:] = top_k if "top_k" in supported else 0
    top_p[:] = top_p if "top_p" in supported else 1.0
    min_p[:] = min_p if "min_p" in supported else 0.0
    params = SamplingParams.build(
        n,
        temperature=temperature.tolist(),
        top_k=top_k.tolist(),
        top_p=top_p.tolist(),
        min_p=min_p.tolist(),
        seed=seeds,
    )
    return Requests(prompts, params, int(rng.integers(0, 2**31 - 1)))


def crowd_request(
    rng: np.random.Generator, vocab: int, max_tokens: int, tokens: tuple[int, ...] = (), prefix: tuple[int, ...] = ()
) -> dict[str, Any]:
    """One unscored request beside the call's own: greedy or sampled, maybe filtered, maybe seeded."""
    body: dict[str, Any] = {
        "prompt": draw_prompt(rng, int(rng.integers(1, 9)), vocab, tokens, prefix),
        "max_tokens": int(max_tokens),
        "temperature": 0.0 if rng.random() < 0.25 else round(float(rng.uniform(0.3, 2.0)), 3),
    }
    kind = int(rng.integers(0, 4))
    if kind == 1:
        body["top_p"] = round(float(rng.uniform(0.3, 0.95)), 3)
    elif kind == 2:
        body["top_k"] = int(rng.integers(1, max(2, vocab // 8)))
    if rng.random() < 0.5:
        body["seed"] = int(rng.integers(0, 2**31 - 1))
    return body


def request_seed(params: SamplingParams, row: int, seed: int) -> int:
    """A request's own seed, or one derived from the run's seed and its row (as every adapter derives it)."""
    own = int(params.seed[row])
    return own if own >= 0 else zlib.crc32(f"{seed}:{row}".encode())


def most_random_request(params: SamplingParams) -> int | None:
    """The row whose output depends most on its parameters and random stream: sampled, unfiltered if any
    row is, at the highest temperature (None if every row is greedy). A request that is greedy, or whose
    filter leaves one token, comes out the same whoever's parameters or uniforms it is handed, so it
    cannot show that a batch mixed them up."""
    sampled = [row for row in range(len(params.temperature)) if float(params.temperature[row]) > 0]
    if not sampled:
        return None

    def filtered(row: int) -> bool:
        return int(params.top_k[row]) > 0 or float(params.top_p[row]) < 1 or float(params.min_p[row]) > 0

    return max(sampled, key=lambda row: (not filtered(row), float(params.temperature[row]), -row))
