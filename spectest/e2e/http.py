"""One request to a running server, and what its failure says: every reply that is not a 200 with JSON, every
connection that fails or times out, becomes a :class:`ServerError` naming the server, the request (its
parameters and the start of its prompt) and what came back, with the URL's credentials masked.

Shared by the server adapter (:mod:`spectest.e2e.engines.openai_server`), the scorers that read a server's
``prompt_logprobs`` (:mod:`spectest.e2e.scoring`) and the twin comparison (:mod:`spectest.e2e.twin`).
"""

from __future__ import annotations

from typing import Any

from spectest.urls import redact


class ServerError(RuntimeError):
    """What a server did wrong on one request: the guarded call reports it as the engine's failure.
    ``status``: the HTTP status it answered with (None: no answer), ``reply``: the start of its reply's text."""

    def __init__(self, message: str, *, status: int | None = None, reply: str = "") -> None:
        super().__init__(message)
        self.status, self.reply = status, reply


def describe(body: dict[str, Any] | None) -> str:
    """A request as messages show it: its parameters, and its prompt cut to 16 ids."""
    if not body:
        return ""
    shown = {k: v for k, v in body.items() if k != "prompt"}
    prompt = body.get("prompt", [])
    return f"{shown}, prompt {prompt if len(prompt) <= 16 else [*prompt[:16], '...']}"


def no_reply(exc: Exception) -> bool:
    """Whether a request failed before any reply reached the client: the connection was refused, reset or closed
    while the request was written or its answer awaited (a keep-alive connection the server closed as the request
    went out is the common case: ``http.server`` closes idle ones). Such a request is sent once more: no token of
    it was seen, so a fresh draw cannot bias a verdict. A reply that came back wrong (a status, malformed JSON, a
    broken HTTP message) is never sent again: it is the server's."""
    import httpx

    if isinstance(exc, httpx.RemoteProtocolError):
        return "without sending a response" in str(exc)
    return isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.ConnectError)


async def send(
    client: Any,
    *,
    name: str,
    url: str,
    method: str,
    path: str,
    payload: Any,
    label: str,
    query: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> Any:
    """The JSON reply of ``method url+path`` (httpx's async ``client``), or a :class:`ServerError` saying what
    ``name`` did to the request ``label`` (``body``: the request as spectest drew it, for the message). A request
    that got no reply at all is sent once more (:func:`no_reply`), on a connection of its own
    (:func:`fresh_request`)."""
    import httpx

    what = f"{label} ({describe(body)})" if body else label
    for attempt in (1, 2):
        try:
            if attempt == 1:
                response = await client.request(method, url + path, json=payload, params=query or None)
            else:
                response = await fresh_request(client, method, url + path, payload, query)
            break
        except httpx.TimeoutException:
            raise ServerError(f"{name}: {what} got no answer within {client.timeout.read:g} s") from None
        except httpx.HTTPError as exc:
            detail = str(exc).replace(url, redact(url)) or "the connection closed without a reply"
            if attempt == 1 and no_reply(exc):
                continue  # nothing of it was seen: sending it again (on a fresh connection) biases nothing
            again = " (sent twice: no reply either time)" if attempt == 2 else ""
            raise ServerError(f"{name}: {what} failed{again}: {type(exc).__name__}: {detail}") from None
    if response.status_code != 200:
        raise ServerError(
            f"{name}: {what} got HTTP {response.status_code} from {method} {path}: {response.text[:500]}",
            status=response.status_code,
            reply=response.text[:2000],
        )
    try:
        return response.json()
    except ValueError:
        raise ServerError(f"{name}: {what} got malformed JSON from {path}: {response.text[:300]!r}") from None


async def fresh_request(client: Any, method: str, url: str, payload: Any, query: dict[str, str] | None) -> Any:
    """``client``'s request on a new connection, not one from its pool. A server that closes idle keep-alive
    connections closes those that went idle together at about the same moment (the replies to a batch of requests in
    flight), so a request that met one closing would, sent again from the pool, often meet another."""
    import httpx

    async with httpx.AsyncClient(timeout=client.timeout, headers=client.headers) as fresh:
        return await fresh.request(method, url, json=payload, params=query or None)
