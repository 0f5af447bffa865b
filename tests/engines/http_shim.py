"""A small OpenAI-compatible server of our own around the exact Markov engine, for the server tests.

``POST /v1/completions`` and ``GET /v1/models`` in vLLM's dialect (token-id prompts, ``token_ids`` back,
``top_k``/``min_p``/``seed``/``ignore_eos``), on 127.0.0.1, one thread per connection (the standard
library's ``ThreadingHTTPServer``). Two flavours:

* ``exact``: each request decodes on its own, with its own parameters and seed (an unseeded request
  draws its seed from the shim's seeded generator): exact;
* ``shares_parameters``: "the request being prepared" is one slot the handler threads share (the bug class
  of servers that hand one request's parameters and random stream to another under load). A request
  samples with the sampling parameters and seed of the latest other request that arrived within
  ``WINDOW_S`` of it, before or after (it overwrote the slot, or the slot was its and it took the one
  before): every request of a crowd is handed a neighbour's, whatever order they reach the server in,
  while a request alone is exact. It fails only when requests overlap, and then whatever the request.

* ``text``: ``mlx_lm.server``'s dialect: a text ``prompt``, encoded by :class:`LetterTokenizer` (which puts a
  word marker, id 0, before every text), and the ids back in ``logprobs.content``; exact, sampling the
  Markov target step by step in MLX-LM's order (top-p, min-p, top-k, then temperature). Scored by
  ``text_scorer`` (the Markov target with the same tokenizer), as ``--spec-target`` would be the checkpoint.

* ``llamacpp``: ``llama-server``'s own ``POST /completion`` (token-id ``prompt``, ``n_predict``, the ids back in
  ``tokens`` only with ``return_tokens``), exact, sampling the Markov target in the chain the request names
  (``samplers``), with llama-server's defaults for whatever it leaves out: top-k 40, top-p 0.95, min-p 0.05,
  temperature 0.8, a 1.1 repeat penalty over the last 64 ids. A client that forgets one samples the wrong law.
  ``llamacpp_loses_min_p``: the same, but min-p is lost between the HTTP layer and the sampler (its default,
  0.05, applies whatever the request asks): the bug class of a server that drops a parameter.

Deployments that refuse a parameter: ``refuses_min_p`` (HTTP 400 naming min-p on every request with it, as vLLM
answers with speculative decoding on; otherwise exact: the parameter is learned and left out, and it passes),
``refuses_min_p_later`` (takes min-p on its first request, refuses it after: a failure), ``errors_on_min_p`` (HTTP
500 on min-p: a failure, never learned as a refusal). ``empty_models``: ``GET /v1/models`` answers 200 and closes the
connection with no body (``mlx_lm.server`` without a Hugging Face cache folder): ``openai:URL`` cannot detect a dialect.
``closes_idle``: exact, on HTTP/1.1 keep-alive connections that it closes after ``IDLE_S`` without a request, the
way ``http.server`` does (a socket timeout); a request written to a connection at the moment it closes it gets no
reply (the stale-pool race every keep-alive client meets). ``drops_reused``: that race's outcome every time, without
its timing: the first request on a connection that has already answered one gets no reply and the connection closes
(a test of the client's resend cannot depend on when a loaded machine wakes it).

Misbehaving flavours for the client's reliability: ``drops_connections`` (closes every completion's
connection without a reply), ``malformed_json``,
``stops_early`` (one token short of ``max_tokens``), ``hangs`` (never answers) and ``caps_logprobs`` (refuses
``prompt_logprobs`` beyond 20 ids, as vLLM started without ``--max-logprobs -1`` does; every other vLLM-dialect
flavour answers them with the full vocabulary, as ``--spec-target server`` reads them): each must give a failing
verdict naming the server, the request and what came back, never a harness traceback or a hang. ``python tests/engines/http_shim.py
FLAVOUR PORT`` serves one from the command line.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spectest.sampling import make_generator, sample_categorical
from spectest.sampling_params import SamplingParams, process_logits
from tests.engines.markov import MarkovEngine, processed_row

MODEL = "markov-shim"
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"  # ids 1-47; id 0 is the word marker


class LetterTokenizer:
    """One letter per id, and a marker (id 0, no text of its own) before every encoded text: like a
    SentencePiece tokenizer, not every id survives decoding and encoding again."""

    eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [0, *(LETTERS.index(c) + 1 for c in text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(LETTERS[i - 1] for i in ids if i != 0)


class TextScorer(MarkovEngine):
    """The Markov target with the text shim's tokenizer: what ``--spec-target`` gives for a text server."""

    tokenizer = LetterTokenizer()


text_scorer = TextScorer()
LLAMA_SERVER_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 64,
    "n_predict": -1, "samplers": ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
}  # fmt: skip
LLAMA_SAMPLERS = {"top_k", "top_p", "min_p", "temperature"}  # the chain's samplers the shim implements
WINDOW_S = 0.05  # how long a request is prepared before it samples; requests this close share the slot
IDLE_S = 0.2  # closes_idle: how long a keep-alive connection may wait for its next request


def params_of(bodies: list[dict[str, Any]], seeds: list[int]) -> SamplingParams:
    return SamplingParams.build(
        len(bodies),
        temperature=[float(b.get("temperature", 1.0)) for b in bodies],
        top_k=[int(b.get("top_k", 0) or 0) if int(b.get("top_k", 0) or 0) > 0 else 0 for b in bodies],
        top_p=[float(b.get("top_p", 1.0)) for b in bodies],
        min_p=[float(b.get("min_p", 0.0)) for b in bodies],
        seed=seeds,
    )


class Shim:
    """The engine behind the server, and how it takes requests."""

    def __init__(self, flavour: str, seed: int = 0) -> None:
        self.flavour = flavour
        self.engine = MarkovEngine()
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, dict[str, Any], int]] = []  # (time, body, seed), newest last
        self.min_p_requests = 0  # refuses_min_p_later: how many requests with min-p it has taken

    def seed_for(self, body: dict[str, Any]) -> int:
        with self.lock:
            drawn = int(self.rng.integers(0, 2**31 - 1))
        return int(body["seed"]) if body.get("seed") is not None else drawn

    def complete(self, body: dict[str, Any]) -> list[int]:
        seed = self.seed_for(body)
        if self.flavour == "text":
            return self.sample_in_mlx_order(body, seed)
        if self.flavour == "llamacpp":
            return self.sample_as_llama_server(body, seed)
        if self.flavour == "llamacpp_loses_min_p":
            return self.sample_as_llama_server({**body, "min_p": LLAMA_SERVER_DEFAULTS["min_p"]}, seed)
        if self.flavour == "shares_parameters":
            body, seed = self.neighbours_parameters(body, seed)
        return self.engine.generate([body["prompt"]], params_of([body], [seed]), int(body["max_tokens"]), 0)[0]

    def neighbours_parameters(self, body: dict[str, Any], seed: int) -> tuple[dict[str, Any], int]:
        """The bug: the parameters and seed of the latest other request within ``WINDOW_S`` of this one."""
        with self.lock:
            mine = (time.monotonic(), body, seed)
            self.arrivals = [a for a in self.arrivals if mine[0] - a[0] < 10 * WINDOW_S] + [mine]
        time.sleep(WINDOW_S)  # the work before sampling, while requests arriving now take the slot
        with self.lock:
            near = [a for a in self.arrivals if a is not mine and abs(a[0] - mine[0]) < WINDOW_S]
        if not near:
            return body, seed  # alone: exact
        _, other, other_seed = near[-1]
        return {**other, "prompt": body["prompt"], "max_tokens": body["max_tokens"]}, other_seed

    def sample_as_llama_server(self, body: dict[str, Any], seed: int) -> list[int]:
        """llama-server's sampling: its defaults for what the request leaves out, the repeat penalty (logits
        of ids among the last ``repeat_last_n`` divided by it when positive, multiplied when negative), then
        the named chain; temperature 0 is the argmax."""
        settings = LLAMA_SERVER_DEFAULTS | body
        chain = tuple(settings["samplers"])
        params, generator = params_of([settings], [seed]), make_generator(seed)
        out = list(body["prompt"])
        for _ in range(int(settings["n_predict"])):
            logits = self.engine.target[out[-1]].clone()
            penalty, window = float(settings["repeat_penalty"]), int(settings["repeat_last_n"])
            if penalty != 1.0 and window > 0:
                recent = torch.tensor(sorted(set(out[-window:])))
                logits[recent] = torch.where(logits[recent] > 0, logits[recent] / penalty, logits[recent] * penalty)
            if float(settings["temperature"]) <= 0:
                out.append(int(logits.argmax()))
                continue
            p = process_logits(logits.view(1, 1, -1), params, order=chain).view(1, -1)
            out.append(int(sample_categorical(p, generator)))
        return out[len(body["prompt"]) :]

    def sample_in_mlx_order(self, body: dict[str, Any], seed: int) -> list[int]:
        from spectest.e2e.engines.openai_server import MLX_ORDER

        params, generator = params_of([body], [seed]), make_generator(seed)
        out = list(body["prompt"])
        for _ in range(int(body["max_tokens"])):
            p = processed_row(self.engine.target, out[-1], params, MLX_ORDER).unsqueeze(0)
            out.append(int(sample_categorical(p, generator)))
        return out[len(body["prompt"]) :]


def handler(shim: Shim) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.answered, self.idle_since = self.answered + 1, time.monotonic()

        def setup(self) -> None:
            self.answered, self.idle_since = 0, time.monotonic()
            if shim.flavour == "closes_idle":
                self.timeout = IDLE_S  # http.server's idle keep-alive close: a socket timeout between requests
            super().setup()

        def parse_request(self) -> bool:
            """``closes_idle``: a request arriving on a connection idle past half its limit finds it closing, and
            gets no reply (the request raced the server's close; its body is never read). ``drops_reused``: any
            request on a connection that has answered before, whenever it arrives."""
            closing = shim.flavour == "drops_reused" or (
                shim.flavour == "closes_idle" and time.monotonic() - self.idle_since > IDLE_S / 2
            )
            if self.answered and closing:
                self.close_connection = True
                return False
            return super().parse_request()

        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/v1/models" and shim.flavour == "empty_models":
                # mlx_lm.server sends its 200 and headers, then its handler raises (CacheNotFound): no body at all
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.close_connection = True
                return None
            if urlsplit(self.path).path == "/v1/models":
                owner = "llamacpp" if shim.flavour.startswith("llamacpp") else "vllm"
                self.reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": owner}]})
            else:
                self.reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if shim.flavour.startswith("llamacpp"):
                return self.llama_server_completion(body)
            if urlsplit(self.path).path != "/v1/completions":
                return self.reply(404, {"error": f"no route {self.path}"})
            if shim.flavour == "drops_connections":
                self.close_connection = True
                self.connection.close()
                return None
            if shim.flavour == "text":
                if not isinstance(body.get("prompt"), str):
                    return self.reply(400, {"error": "prompt must be text"})
                ids = shim.complete({**body, "prompt": LetterTokenizer().encode(body["prompt"])})
                content = [{"id": i, "logprob": 0.0} for i in ids]
                return self.reply(200, {"choices": [{"index": 0, "logprobs": {"content": content}}]})
            if not isinstance(body.get("prompt"), list):
                return self.reply(400, {"error": "prompt must be a list of token ids"})
            if shim.flavour == "refuses_min_p" and body.get("min_p"):
                message = (
                    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
                )
                return self.reply(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
            if shim.flavour == "refuses_min_p_later" and body.get("min_p"):
                with shim.lock:
                    shim.min_p_requests += 1
                    taken = shim.min_p_requests == 1
                if not taken:
                    return self.reply(400, {"error": "min_p is not supported with speculative decoding"})
            if shim.flavour == "errors_on_min_p" and body.get("min_p"):
                return self.reply(500, {"error": "Internal Server Error: min_p"})
            if shim.flavour == "malformed_json":
                data = b'{"choices": [{"token_ids": [1, 2'
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return None
            if shim.flavour == "hangs":
                time.sleep(3600)
            if body.get("prompt_logprobs") is not None:
                return self.reply_prompt_logprobs(body)
            ids = shim.complete(body)
            if shim.flavour == "stops_early":
                ids = ids[:-1]
            return self.reply(
                200, {"object": "text_completion", "model": MODEL, "choices": [{"index": 0, "token_ids": ids}]}
            )

        def llama_server_completion(self, body: dict[str, Any]) -> None:
            if urlsplit(self.path).path != "/completion":
                return self.reply(404, {"error": f"no route {self.path}"})
            if not isinstance(body.get("prompt"), list) or int(body.get("n_predict", -1)) < 0:
                return self.reply(400, {"error": "this shim wants a token-id prompt and n_predict >= 0"})
            chain = [s for s in body.get("samplers", LLAMA_SERVER_DEFAULTS["samplers"]) if s in LLAMA_SAMPLERS]
            unused = {"dry", "typ_p", "xtc"} & set(body.get("samplers", LLAMA_SERVER_DEFAULTS["samplers"]))
            if unused and (
                body.get("typical_p", 1.0) != 1.0 or body.get("xtc_probability", 0.0) or body.get("dry_multiplier", 0.0)
            ):
                return self.reply(400, {"error": f"this shim does not implement {sorted(unused)}"})
            ids = shim.complete({**body, "samplers": chain})
            tokens = ids if body.get("return_tokens") else []
            return self.reply(200, {"content": "".join(chr(97 + i % 26) for i in ids), "tokens": tokens, "stop": True})

        def reply_prompt_logprobs(self, body: dict[str, Any]) -> None:
            """vLLM's ``prompt_logprobs``: per prompt position after the first, every id's log-probability
            under the target given the ids before it (``caps_logprobs``: refused beyond 20, vLLM's default)."""
            wanted, prompt = int(body["prompt_logprobs"]), body["prompt"]
            if shim.flavour == "caps_logprobs" and not 0 <= wanted <= 20:
                message = f"Requested prompt logprobs of {wanted}, which is greater than max allowed: 20"
                return self.reply(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
            rows = torch.log_softmax(shim.engine.target_logits([prompt])[0].float(), dim=-1)
            entries: list[Any] = [None]
            for t in range(1, len(prompt)):
                order = torch.argsort(rows[t - 1], descending=True).tolist()
                rank = {i: r + 1 for r, i in enumerate(order)}
                entries.append({str(i): {"logprob": float(rows[t - 1, i]), "rank": rank[i]} for i in order})
            choice = {"index": 0, "token_ids": [int(rows[-1].argmax())], "prompt_logprobs": entries}  # greedy
            return self.reply(200, {"object": "text_completion", "model": MODEL, "choices": [choice]})

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 resets connections beyond it when many arrive at once


def serve(flavour: str, port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """A running shim on 127.0.0.1 (port 0: a free one) in a daemon thread, and its URL."""
    server = Server(("127.0.0.1", port), handler(Shim(flavour)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


if __name__ == "__main__":
    running, url = serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(url, flush=True)
    threading.Event().wait()
