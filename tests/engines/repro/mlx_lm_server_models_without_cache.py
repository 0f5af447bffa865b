"""Reproduction without spectest: ``mlx_lm.server``'s ``GET /v1/models`` on a machine with no Hugging Face cache
folder answers ``200 OK`` and then closes the connection with an empty body.

Its handler (``APIHandler.handle_models_request``) sends the status line and headers first, then calls
``huggingface_hub.scan_cache_dir()``, which raises ``CacheNotFound`` when the cache folder does not exist; the
exception ends the handler after the headers went out, so a client sees a success with no JSON at all (and the
server's log shows the traceback). Completions are served normally meanwhile. Here the cache folder is pointed at
a path that does not exist (``HF_HUB_CACHE``); a fresh machine that never downloaded a model is the same case.

    .venv-native/bin/python tests/engines/repro/mlx_lm_server_models_without_cache.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from spectest.e2e import tiny_pair
from tests.engines.servers import mlx_server


def main() -> None:
    pair = tiny_pair.pair(0)
    with tempfile.TemporaryDirectory() as scratch:
        missing = str(Path(scratch) / "no-such-cache")
        log = Path(scratch) / "server.log"
        with mlx_server(str(pair.target), None, str(log), env={"HF_HUB_CACHE": missing}) as url:
            models = httpx.get(url + "/v1/models", timeout=30)
            completion = httpx.post(url + "/v1/completions", json={"prompt": "ab", "max_tokens": 4}, timeout=120)
        raised = [line for line in log.read_text().splitlines() if "CacheNotFound" in line or "Error" in line]
    print(f"GET /v1/models: HTTP {models.status_code}, {len(models.content)} bytes of body: {models.content[:80]!r}")
    print(f"POST /v1/completions: HTTP {completion.status_code}, {len(completion.content)} bytes")
    print("server log:", *raised[-3:], sep="\n  ")
    if models.status_code == 200 and not models.content:
        print("reproduced: a 200 with an empty body where the model list should be")
    else:
        print("not reproduced")


if __name__ == "__main__":
    main()
