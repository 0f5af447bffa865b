"""A running server, by its URL, as a spectest engine: ``--spec-engine openai+vllm:http://host:port``.

Speaks the OpenAI-compatible completions API (``POST /v1/completions``) with token-id prompts and reads token
ids back (never text: detokenising and re-tokenising is lossy), through httpx's async client
(``pip install -e '.[server]'``). One request per prompt, each with its own ``temperature``, ``top_k``,
``top_p``, ``min_p``, ``seed`` and ``max_tokens``, EOS ignored by configuration (``ignore_eos``).

**Concurrency is part of the test.** A ``generate`` call keeps ``--spec-concurrency`` requests in flight
(default 16): the call's own, and crowd requests beside them (greedy and sampled, filtered, seeded and
unseeded, drawn from the call's seed; their outputs are never scored, so none is chosen by its outcome);
a call of one request goes alone.
A server that lets one request's parameters or random stream reach another fails the output property;
``seeded requests ignore the batch`` (declared ``batch-invariant``) compares a request sent alone with
the same request inside the crowd.

Dialects: ``openai+vllm`` (vLLM's ``return_token_ids``, ``top_k``, ``min_p``, ``ignore_eos``, ``seed``);
``openai:URL`` detects it from ``GET /v1/models`` (``owned_by``). ``openai+mlx`` (``mlx_lm.server``) takes
prompts as text only and stops on EOS: prompts are drawn from the ids whose text the served tokenizer (the
one in ``--spec-target``'s folder) encodes back to themselves, after the ids it puts before every prompt
(declared as ``spectest_prompt_tokens`` and ``spectest_prompt_prefix``; every prompt's round trip is
checked before it is sent), EOS is kept out by ``logit_bias`` and declared masked, the ids come back from
``logprobs``, and its sampling order (top-p, min-p, top-k, then temperature) is declared.
``openai+llamacpp`` (llama.cpp's ``llama-server``) is served through its own ``POST /completion``: token-id
prompts (no BOS added), ``n_predict``, ``ignore_eos`` and ``return_tokens`` (the ids back in ``tokens``),
every sampler llama-server would otherwise apply by default set neutral (top-k 40, top-p 0.95, min-p 0.05 and a
1.1 repeat penalty are its defaults) and its sampler chain named, top-k, top-p, min-p, then temperature, as
declared; EOS is masked (llama-server's ``ignore_eos`` is a -inf bias on it). A server that refuses a parameter (an HTTP 400) fails the call with its own words and the request
that carried it.

Declarations after ``#``: ``openai+vllm:http://host:port#seeded,batch-invariant,standard-rejection``
(what the deployment promises; none by default). Scoring never trusts the server's sampler: the target's
logits come from ``--spec-target``, a local checkpoint of the same model (transformers), ``path.py:attr`` (an
object with ``target_logits`` and ``vocab_size``), or a vLLM endpoint's ``prompt_logprobs`` (``server``: the
one under test; ``openai+vllm:URL``: another, :mod:`spectest.e2e.scoring`); ``--spec-draft``
likewise for the draft's. Where
neither exists, ``--spec-reference-url`` names a twin endpoint of the same model with speculation off
(same dialect): the output is compared with the twin's by a two-sample test (:mod:`spectest.e2e.twin`),
the scoring properties skip, and ``vocab=N`` after ``#`` gives the vocabulary prompts are drawn from.

Credentials never reach a report: the URL's user and password and its query are masked in the engine's
name, and the API key comes from ``--spec-api-key`` or ``SPECTEST_API_KEY``, sent as a bearer token only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import zlib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import numpy as np

from spectest.e2e.cases import crowd_request, request_seed
from spectest.e2e.http import ServerError, describe, send
from spectest.e2e.protocol import ENGINE_CAPABILITIES
from spectest.e2e.scoring import OWN, CheckpointScorer, ServerScorer
from spectest.sampling_params import PARAMETERS
from spectest.urls import SCHEMES, redact

MLX_ORDER = ("top_p", "min_p", "top_k", "temperature")  # mlx_lm/sample_utils.py: filters on untempered log-probs
LLAMACPP_ORDER = ("top_k", "top_p", "min_p", "temperature")  # the sampler chain spectest asks llama-server for
# llama-server's defaults that are not the target's distribution (top-k 40, top-p 0.95, min-p 0.05, a 1.1 repeat
# penalty, ...): every request sets them neutral, and names its sampler chain.
LLAMACPP_NEUTRAL = {
    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "repeat_last_n": 0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "mirostat": 0,
    "dynatemp_range": 0.0, "samplers": list(LLAMACPP_ORDER),
}  # fmt: skip
# The filters a deployment may refuse (temperature it must take): before any property, one request with each
# (at these values) shows whether it does; a clear refusal (HTTP 400 or 422 naming it) leaves it out of the plan.
FILTERS = ("top_k", "top_p", "min_p")
PROBES = {"top_k": 2, "top_p": 0.9, "min_p": 0.05}
REFUSALS = (400, 422)
MASKED_BIAS = -1e9  # a logit bias that leaves a masked id probability exactly 0 in float32
CONCURRENCY = 16
TIMEOUT_S = 120.0
PROBE_TIMEOUT_S = 30.0
API_KEY_ENV = "SPECTEST_API_KEY"


def parse_server_spec(spec: str) -> tuple[str | None, str, frozenset[str]]:
    """(dialect or None to detect, URL, declared capabilities) of ``openai[+dialect]:URL[#caps]``."""
    scheme, _, rest = spec.partition(":")
    url, _, declared = rest.partition("#")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ValueError(f"{scheme}: {redact(url)!r} is not an http(s) URL")
    capabilities = frozenset(c.strip() for c in declared.split(",") if c.strip() and "=" not in c)
    unknown = capabilities - set(ENGINE_CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown declarations {sorted(unknown)} after '#'; known: {ENGINE_CAPABILITIES}")
    return SCHEMES[scheme], url, capabilities


def declared_settings(spec: str) -> tuple[int | None, frozenset[str]]:
    """The settings after ``#``: ``vocab=N``, the vocabulary of a server judged against its twin alone (no
    scorer), and ``without=PARAM`` (repeatable), a sampling parameter the deployment does not take, left out of
    the plan without asking the server."""
    vocab: int | None = None
    without: set[str] = set()
    for item in spec.partition("#")[2].split(","):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not equals:
            continue
        if key == "vocab":
            if not value.isdigit() or int(value) < 2:
                raise ValueError(f"vocab= wants a vocabulary size of at least 2, got {value!r}")
            vocab = int(value)
        elif key == "without":
            if value not in FILTERS:
                raise ValueError(
                    f"without= names a filter the deployment does not take, one of {FILTERS}; got {value!r}"
                )
            without.add(value)
        else:
            raise ValueError(f"unknown setting {key!r} after '#'; known: vocab=N, without=PARAM")
    return vocab, frozenset(without)


def load_scorer(location: str, *, which: str, engine: ServerEngine) -> Any:
    """``--spec-target``/``--spec-draft`` for a server: a checkpoint directory (transformers),
    ``path.py:attr`` / ``module:attr`` (an object with ``target_logits``), or a vLLM endpoint's
    ``prompt_logprobs``: ``server`` (the engine's own, target only) or ``openai+vllm:URL``."""
    if location == OWN:
        if which != "target":
            raise ValueError(f"--spec-{which} {OWN}: the server serves the target; name the draft's own endpoint")
        if engine.dialect in ("mlx", "llamacpp"):
            raise ValueError(f"--spec-target {OWN}: only vLLM returns prompt log-probabilities over the vocabulary")
        return ServerScorer(engine, own=True)
    if location.partition(":")[0] in SCHEMES:
        endpoint = ServerEngine(
            location, api_key=engine._api_key, concurrency=engine.concurrency, timeout=engine.timeout
        )
        if endpoint.dialect in ("mlx", "llamacpp"):
            raise ValueError(
                f"--spec-{which} {endpoint.name}: only vLLM returns prompt log-probabilities to score with"
            )
        return ServerScorer(endpoint, own=False)
    if Path(location).is_dir():
        if not (Path(location) / "config.json").is_file():
            raise ValueError(f"{location!r} is not a checkpoint directory (no config.json there)")
        return CheckpointScorer(location)
    from spectest.resolve import load_object

    obj, _ = load_object(location, {}, option=f"--spec-{which}")
    if not callable(getattr(obj, "target_logits", None)):
        raise ValueError(f"{location!r} has no target_logits method to score with")
    return obj


class PromptText:
    """How token-id prompts travel to a server that takes text: through the served tokenizer (``encode``,
    ``decode``). ``tokens``: the ids whose text encodes back to the id alone, after ``prefix``, the ids the
    encoder puts before any text (a SentencePiece word marker, a BOS)."""

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        self.tokenizer = tokenizer
        after: dict[int, tuple[int, ...]] = {}
        for i in range(vocab):
            ids = self.encode(self.tokenizer.decode([i]))
            if ids and ids[-1] == i:
                after[i] = tuple(ids[:-1])
        prefixes = Counter(after.values())
        self.prefix = prefixes.most_common(1)[0][0] if prefixes else ()
        self.tokens = tuple(i for i, before in after.items() if before == self.prefix)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text)]

    def text(self, ids: list[int]) -> str:
        """The text that the server's tokenizer encodes to exactly ``ids`` (checked)."""
        text = self.tokenizer.decode(ids[len(self.prefix) :])
        if ids[: len(self.prefix)] != list(self.prefix) or self.encode(text) != ids:
            raise ServerError(
                f"the prompt {ids[:40]} does not survive the trip through text ({text!r} encodes to "
                f"{self.encode(text)[:40]}): its ids lie outside spectest_prompt_tokens {self.tokens[:20]}..."
            )
        return text


class ServerEngine:
    """An OpenAI-compatible server under test (see the module docstring)."""

    def __init__(
        self,
        spec: str,
        *,
        target: str | None = None,
        draft: str | None = None,
        api_key: str | None = None,
        concurrency: int = CONCURRENCY,
        timeout: float = TIMEOUT_S,
        reference: str | None = None,
    ) -> None:
        self.spec = spec
        self.dialect, url, self.spectest_engine_capabilities = parse_server_spec(spec)
        parts = urlsplit(url)
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))  # requests append paths
        self.query = dict(parse_qsl(parts.query))  # sent with every request, never shown
        self.name = f"{spec.partition(':')[0]}:{redact(url)}"
        if concurrency < 1:
            raise ValueError(f"--spec-concurrency must be >= 1, got {concurrency}")
        self.concurrency, self.timeout = concurrency, timeout
        self._api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self.probe_failures: list[str] = []  # what a probe met that was not a refusal (a 5xx, no reply)
        if self.dialect is None and importlib.util.find_spec("httpx") is not None:
            self.dialect = self._detect()
        self.target = load_scorer(target, which="target", engine=self) if target else None
        self.draft = load_scorer(draft, which="draft", engine=self) if draft else None
        if self.draft is not None:
            self.draft_logits = lambda sequences: self.draft.target_logits(sequences)
        self.model_name: str | None = None
        self._codec: PromptText | None = None
        self.declared_vocab, self.declared_without = declared_settings(spec)
        self._left_out: dict[str, str] | None = None
        self.twin: ServerEngine | None = None  # the same model without speculation, to compare with
        if reference is not None:
            scheme = spec.partition(":")[0]
            self.twin = ServerEngine(f"{scheme}:{reference}", api_key=api_key, concurrency=concurrency, timeout=timeout)
            self.twin.target, self.twin.declared_vocab = self.target, self.declared_vocab  # one scorer, loaded once

    def __repr__(self) -> str:
        return f"<ServerEngine {self.name}>"

    @property
    def spectest_unavailable(self) -> str | None:
        if importlib.util.find_spec("httpx") is None:
            return "httpx is not installed (pip install -e '.[server]')"
        if self.target is None and self.twin is None:
            return (
                f"{self.name} needs --spec-target (a local checkpoint or scorer of the served target) or "
                "--spec-reference-url (a twin endpoint without speculation)"
            )
        if self.target is None and self.declared_vocab is None:
            return f"{self.name} has no --spec-target to read its vocabulary from: declare it after '#' (vocab=N)"
        for scorer in (self.target, self.draft):
            refused = scorer.unavailable() if callable(getattr(scorer, "unavailable", None)) else None
            if refused:
                return refused
        if self.dialect == "mlx" and getattr(self.target, "tokenizer", None) is None:
            return (
                f"{self.name} takes text prompts: --spec-target must be the served checkpoint's folder (its tokenizer)"
            )
        return None

    @property
    def codec(self) -> PromptText | None:
        """The text route of prompts, for a server that takes no token ids (mlx_lm.server)."""
        if self._codec is None and self.dialect == "mlx" and self.target is not None:
            tokenizer = getattr(self.target, "tokenizer", None)
            self._codec = PromptText(tokenizer, self.vocab_size) if tokenizer is not None else None
        return self._codec

    @property
    def spectest_prompt_tokens(self) -> tuple[int, ...]:
        return self.codec.tokens if self.codec else ()

    @property
    def spectest_prompt_prefix(self) -> tuple[int, ...]:
        return self.codec.prefix if self.codec else ()

    @property
    def spectest_filter_order(self) -> tuple[str, ...] | None:
        return {"mlx": MLX_ORDER, "llamacpp": LLAMACPP_ORDER}.get(self.dialect or "")

    @property
    def spectest_masked_tokens(self) -> tuple[int, ...]:
        """EOS, where the server keeps it out: mlx_lm.server stops on it, so spectest masks it by ``logit_bias``;
        llama-server implements ``ignore_eos`` itself by a -inf bias on EOS (its ``generation_settings`` show it).
        The id comes from the served checkpoint's tokenizer (``--spec-target DIR``)."""
        if self.dialect == "mlx" and self.codec:
            tokenizer = self.codec.tokenizer
        elif self.dialect == "llamacpp":
            tokenizer = getattr(self.target, "tokenizer", None)
        else:
            return ()
        eos = getattr(tokenizer, "eos_token_id", None)
        return () if eos is None else (int(eos),)

    @property
    def spectest_left_out(self) -> dict[str, str]:
        """The sampling parameters this deployment does not take, each with why: declared after ``#``
        (``without=min_p``), or refused up front in the server's own words (one request per filter, before any
        property). Left out of the plan, exactly as a Python adapter's ``spectest_sampling_params`` leaves them;
        a parameter accepted here and refused later, a 5xx, a crash or a hang stay the server's failures."""
        if self._left_out is None:
            self._left_out = {
                name: "declared after '#' (without=" + name + ")" for name in sorted(self.declared_without)
            }
            if self.spectest_unavailable is None:
                asked = [name for name in FILTERS if name not in self.declared_without]
                self._left_out |= asyncio.run(self._refused(asked))
        return self._left_out

    @property
    def spectest_sampling_params(self) -> tuple[str, ...]:
        return tuple(name for name in PARAMETERS if name not in self.spectest_left_out)

    async def _refused(self, names: list[str]) -> dict[str, str]:
        """Of ``names``, those the server refuses with a clear client error naming them, with its words."""
        async with self._client(min(self.timeout, PROBE_TIMEOUT_S)) as client:
            try:
                await self._know_model(client)
            except ServerError:
                return {}  # it does not answer: nothing is learned, and the properties' calls say so
            replies = await asyncio.gather(*(self._probe(client, name) for name in names))
        return {name: why for name, why in zip(names, replies, strict=True) if why is not None}

    async def _probe(self, client: Any, name: str) -> str | None:
        """One small request with ``name`` set: None if the server takes it (or fails otherwise: that is for the
        properties to meet), else the server's refusal."""
        prompt = [*self.spectest_prompt_prefix, *(self.spectest_prompt_tokens[:1] or (1,))]
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 1.0, name: PROBES[name], "seed": 0}
        try:
            await self._complete(client, body, f"probe of {name}")
        except ServerError as exc:
            if exc.status in REFUSALS and name in exc.reply:
                return f"HTTP {exc.status}: {' '.join(exc.reply.split())[:300]}"
            # Not a refusal: the parameter stays in the plan, and what the probe met is said with every later
            # failure (a probe that crashes the server leaves the properties only a closed port to report).
            self.probe_failures.append(f"before any property, {' '.join(str(exc).split())[:400]}")
        return None

    @property
    def spectest_unscored(self) -> str | None:
        """Why nothing scores this server's tokens (judged against its twin alone), or None."""
        return None if self.target is not None else "no --spec-target: judged against its twin only"

    @property
    def vocab_size(self) -> int:
        return int(self.target.vocab_size) if self.target is not None else int(self.declared_vocab or 0)

    def target_logits(self, sequences):
        if self.target is None:
            raise ServerError(f"{self.name} has no scorer (--spec-target)")
        return self.target.target_logits(sequences)

    def generate(self, prompts, params, max_new_tokens, seed):
        bodies = [self._body(params, row, list(prompt), max_new_tokens, seed) for row, prompt in enumerate(prompts)]
        rng = np.random.default_rng([zlib.crc32(b"crowd"), seed & 0xFFFFFFFF, len(prompts)])
        # A call of one request goes alone (the properties that compare send it so); any other brings a crowd.
        extra = self.concurrency - len(bodies) if len(bodies) > 1 else 0
        alphabet = (self.spectest_prompt_tokens, self.spectest_prompt_prefix)
        crowd = [crowd_request(rng, self.vocab_size, max_new_tokens, *alphabet) for _ in range(extra)]
        return asyncio.run(self._send_all(bodies, crowd))[: len(bodies)]

    def _body(self, params, row: int, prompt: list[int], max_new_tokens: int, seed: int) -> dict[str, Any]:
        temperature = float(params.temperature[row])
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": int(max_new_tokens), "temperature": temperature}
        if temperature > 0:
            if int(params.top_k[row]) > 0:
                body["top_k"] = int(params.top_k[row])
            if float(params.top_p[row]) < 1:
                body["top_p"] = float(params.top_p[row])
            if float(params.min_p[row]) > 0:
                body["min_p"] = float(params.min_p[row])
        body["seed"] = request_seed(params, row, seed)
        return body

    def _client(self, timeout: float | None = None) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        limits = httpx.Limits(max_connections=self.concurrency)
        return httpx.AsyncClient(timeout=timeout or self.timeout, headers=headers, limits=limits)

    async def _know_model(self, client: Any) -> None:
        if self.model_name is None and self.dialect == "mlx":
            self.model_name = "default_model"  # the model it was started with
        elif self.model_name is None and self.dialect == "llamacpp":
            self.model_name = "served"  # its /completion serves the one model it was started with
        elif self.model_name is None:
            await self._discover(client)

    async def post_all(
        self, payloads: list[dict[str, Any]], labels: list[str], *, timeout: float | None = None
    ) -> list[Any]:
        """Each payload (with the served model's name) to ``/v1/completions``, ``concurrency`` in flight: the
        replies, in order (the scorer's requests: :mod:`spectest.e2e.scoring`)."""
        async with self._client(timeout) as client:
            await self._know_model(client)
            return await asyncio.gather(
                *(
                    self._request(client, "POST", "/v1/completions", {"model": self.model_name, **payload}, label)
                    for payload, label in zip(payloads, labels, strict=True)
                )
            )

    async def _send_all(self, bodies: list[dict[str, Any]], crowd: list[dict[str, Any]]) -> list[list[int]]:
        async with self._client() as client:
            await self._know_model(client)
            everything = [*bodies, *crowd]
            labels = [f"request {i}" for i in range(len(bodies))] + [f"crowd request {i}" for i in range(len(crowd))]
            return await asyncio.gather(
                *(self._complete(client, b, label) for b, label in zip(everything, labels, strict=True))
            )

    async def _discover(self, client: Any) -> None:
        """The served model's name, from ``GET /v1/models``."""
        reply = await self._request(client, "GET", "/v1/models", None, "model list")
        try:
            self.model_name = str(reply["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.name}: GET /v1/models returned {str(reply)[:300]}, not a model list") from None

    def _detect(self) -> str:
        """``openai:URL``'s dialect, before any property: vLLM lists itself as the owner in ``GET /v1/models``.
        What cannot be told (no answer, an error, an empty or malformed list, another owner) is for the user to
        name: a ``ValueError`` (a usage error, one line), never a verdict on the server."""

        async def models() -> Any:
            async with self._client(min(self.timeout, PROBE_TIMEOUT_S)) as client:
                return await self._request(client, "GET", "/v1/models", None, "model list")

        named = ", ".join(f"{scheme}:{redact(self.url)}" for scheme, dialect in SCHEMES.items() if dialect)
        try:
            reply = asyncio.run(models())
            model = reply["data"][0]
            owner = str(model.get("owned_by", "")) if isinstance(model, dict) else ""
            seen = f"GET /v1/models lists {str(model.get('id', '?')) if isinstance(model, dict) else model!r} owned by {owner!r}"
        except ServerError as exc:
            owner, seen = "", str(exc).removeprefix(f"{self.name}: ")
        except (KeyError, IndexError, TypeError, AttributeError):
            owner, seen = "", f"GET /v1/models returned {str(reply)[:200]}, not a model list"
        if owner == "vllm":
            return "vllm"
        seen = " ".join(seen.split())
        raise ValueError(f"cannot tell the server's dialect ({seen[:400]}); name it: {named}")

    def _payload(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` in the server's dialect."""
        if self.dialect == "llamacpp":  # llama-server's own /completion: ids in, ids out
            request = {k: v for k, v in body.items() if k != "max_tokens"} | {"n_predict": body["max_tokens"]}
            return LLAMACPP_NEUTRAL | request | {"ignore_eos": True, "return_tokens": True}
        if self.dialect != "mlx":
            return {"model": self.model_name, **body, "ignore_eos": True, "return_token_ids": True}
        filters = {"top_k": 0, "top_p": 1.0, "min_p": 0.0} | body  # its command line's defaults never apply
        payload = {**filters, "prompt": self.codec.text(body["prompt"]), "logprobs": True}
        if self.spectest_masked_tokens:  # it stops on EOS and has no ignore_eos
            payload["logit_bias"] = {str(i): MASKED_BIAS for i in self.spectest_masked_tokens}
        return payload

    def _token_ids(self, reply: Any) -> list[int]:
        if self.dialect == "llamacpp":
            return [int(t) for t in reply["tokens"]]
        choice = reply["choices"][0]
        if self.dialect == "mlx":
            return [int(entry["id"]) for entry in choice["logprobs"]["content"]]
        return [int(t) for t in choice["token_ids"]]

    async def _complete(self, client: Any, body: dict[str, Any], label: str) -> list[int]:
        try:
            payload = self._payload(body)
        except ServerError as exc:
            raise ServerError(f"{self.name}: {label}: {exc}") from None
        path = "/completion" if self.dialect == "llamacpp" else "/v1/completions"
        reply = await self._request(client, "POST", path, payload, label, body)
        try:
            ids = self._token_ids(reply)
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(
                f"{self.name}: {label} ({describe(body)}) came back without token ids: {str(reply)[:300]}"
            ) from None
        if len(ids) != body["max_tokens"]:
            raise ServerError(
                f"{self.name}: {label} ({describe(body)}) returned {len(ids)} token ids for max_tokens="
                f"{body['max_tokens']} with ignore_eos: {ids[:40]}"
            )
        return ids

    async def _request(
        self, client: Any, method: str, path: str, payload: Any, label: str, body: dict[str, Any] | None = None
    ) -> Any:
        try:
            return await send(
                client,
                name=self.name,
                url=self.url,
                method=method,
                path=path,
                payload=payload,
                label=label,
                query=self.query,
                body=body,
            )
        except ServerError as exc:
            if not self.probe_failures:
                raise
            raise ServerError(f"{exc}; {'; '.join(self.probe_failures)}", status=exc.status, reply=exc.reply) from None
