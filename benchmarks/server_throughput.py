"""Benchmark of spectest as a server's load (not a timed test): run it in the vLLM venv, read the ratios.

Starts ``vllm serve`` of the tiny pair on loopback (without speculation: the server spectest's default run
passes; then, for the plain figure only, with the pair's draft model), and measures in the same run:

1. the server's throughput under a plain load generator: ``--concurrency`` completions always in flight
   (token-id prompts of 1-8 tokens, 16 new tokens, temperature 1, EOS ignored), for ``--seconds``;
2. the throughput the server reaches while spectest's default run judges it
   (``pytest --spec-engine openai+vllm:URL#seeded --spec-target DIR``, the same concurrency), and the run's
   wall time, start-up of the server included.

Both throughputs come from the server's own counter (``vllm:generation_tokens_total`` on ``/metrics``) over
the same server process, so the ratio is spectest's share of what the server can do: the rest of
spectest's wall time goes to scoring, statistics and the calls that send one request alone.

    .venv-vllm/bin/python benchmarks/server_throughput.py [--seconds 30] [--concurrency 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.engines.servers import vllm_server  # noqa: E402

COUNTER = "vllm:generation_tokens_total"


def generated_tokens(url: str) -> float:
    """The server's own count of generated tokens so far (Prometheus text from ``/metrics``)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(COUNTER + "{"))


async def plain_load(url: str, seconds: float, concurrency: int, vocab: int) -> int:
    """Keep ``concurrency`` completions in flight for ``seconds``; the number completed."""
    import httpx

    rng = np.random.default_rng(0)
    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    deadline = time.monotonic() + seconds
    done = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < deadline:
            body = {
                "model": model,
                "prompt": rng.integers(0, vocab, size=int(rng.integers(1, 9))).tolist(),
                "max_tokens": 16,
                "temperature": 1.0,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            reply = await client.post(url + "/v1/completions", json=body)
            reply.raise_for_status()
            done += 1

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return done


def measure_plain(url: str, seconds: float, concurrency: int, vocab: int) -> dict[str, float]:
    asyncio.run(plain_load(url, 3, concurrency, vocab))  # warm-up
    before, started = generated_tokens(url), time.perf_counter()
    requests = asyncio.run(plain_load(url, seconds, concurrency, vocab))
    wall = time.perf_counter() - started
    return {"requests": requests, "tokens_per_s": (generated_tokens(url) - before) / wall, "wall_s": wall}


def measure_spectest(url: str, target: str, concurrency: int, workdir: Path) -> dict[str, float]:
    before, started = generated_tokens(url), time.perf_counter()
    command = [
        sys.executable, "-m", "pytest", "--spec-engine", f"openai+vllm:{url}#seeded", "--spec-target", target,
        "--spec-seed", "1", "--spec-concurrency", str(concurrency), "-n", "2", "-q", "-p", "no:cacheprovider",
        "--spec-results", str(workdir / "results.json"),
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    return {"tokens_per_s": (generated_tokens(url) - before) / wall, "wall_s": wall, "pytest": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each plain load (default 30)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    from spectest.e2e import tiny_pair

    pair = tiny_pair.pair(0)
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        with vllm_server(str(pair.target), None, f"{tmp}/off.log") as url:
            startup = time.perf_counter() - started
            plain = measure_plain(url, args.seconds, args.concurrency, tiny_pair.VOCAB)
            spectest = measure_spectest(url, str(pair.target), args.concurrency, Path(tmp))
        figures["off"] = {
            "startup_s": startup,
            "plain": plain,
            "spectest": spectest,
            "spectest_share_of_plain_throughput": spectest["tokens_per_s"] / plain["tokens_per_s"],
            "verdict_with_startup_s": startup + spectest["wall_s"],
        }
        draft = {"model": str(pair.draft), "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
        with vllm_server(str(pair.target), draft, f"{tmp}/draft.log") as url:
            figures["draft"] = {"plain": measure_plain(url, args.seconds, args.concurrency, tiny_pair.VOCAB)}
    figures["draft"]["throughput_over_off"] = figures["draft"]["plain"]["tokens_per_s"] / plain["tokens_per_s"]
    off = figures["off"]
    print(
        f"vllm serve, no speculation: start-up {off['startup_s']:.0f} s; plain load {plain['tokens_per_s']:.0f} "
        f"tokens/s ({args.concurrency} in flight); under spectest's default run {spectest['tokens_per_s']:.0f} "
        f"tokens/s = {off['spectest_share_of_plain_throughput']:.2f} of plain, verdict in {spectest['wall_s']:.0f} s "
        f"({off['verdict_with_startup_s']:.0f} s with start-up): {spectest['pytest']}"
    )
    print(
        f"vllm serve with the draft model (K=4): plain load {figures['draft']['plain']['tokens_per_s']:.0f} "
        f"tokens/s = {figures['draft']['throughput_over_off']:.2f} of no speculation"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
