"""Server URLs as spectest reads and shows them: which ``--spec-engine`` values name a running server
(``openai[+dialect]:URL[#declarations]``), and the URL with its credentials masked, which is all that a report,
a message or a replay command ever shows.

Low in the house on purpose: the run's configuration (:mod:`spectest.session`), the engine resolver and the
results file read these rules without reaching into the server adapter (:mod:`spectest.e2e.engines.openai_server`).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

SCHEMES = {"openai": None, "openai+vllm": "vllm", "openai+mlx": "mlx", "openai+llamacpp": "llamacpp"}
DIALECTS = ("vllm", "mlx", "llamacpp")


def is_server_spec(spec: str) -> bool:
    return spec.partition(":")[0] in SCHEMES


def redact(url: str) -> str:
    """``url`` with its user, password and query masked: what reports and messages show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = ("***@" if parts.username or parts.password else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


def server_name(spec: str) -> str:
    """A server engine's name as reports show it: the scheme and the redacted URL, without its declarations."""
    scheme, _, url = spec.partition(":")
    return f"{scheme}:{redact(url.partition('#')[0])}"
