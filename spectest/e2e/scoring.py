"""Scorers: the target's (or the draft's) logits along given sequences, for an engine whose own API gives none.

A local checkpoint (:class:`CheckpointScorer`, ``--spec-target DIR``: transformers, float32) or a vLLM server's
``prompt_logprobs`` (:class:`ServerScorer`). ``--spec-target server`` scores a vLLM server's tokens with the server itself; ``--spec-target
openai+vllm:URL`` with another endpoint of the same model (a replica without speculation, a bigger
machine). Either must run with ``--max-logprobs -1``: one completion of the sequence with
``prompt_logprobs=-1`` returns, at every position, the log-probability of every id given the tokens
before it, computed by the target's forward pass over the prompt (vLLM's default ``logprobs_mode``,
``raw_logprobs``: before temperature, filters or any processor, which the harness then applies itself).

What it trusts and what it does not. The prompt's forward pass never goes through the rejection
sampler, the draft or the decoding loop's caches, so every bug of speculative decoding the output
properties look for (residuals, bonus tokens, mixed rows, reused uniforms, parameters crossing
requests) shows up against it exactly as against a local checkpoint. What it cannot see is a wrong
target: weights, a broken forward pass, a wrong model served; a local checkpoint
(``--spec-target DIR``) can.

Log-probabilities differ from logits by one constant per row, which no temperature or filter sees;
the harness's ambiguity rule perturbs each value by 1e-4 of itself, so on these larger magnitudes it
treats more boundary tokens as ambiguous (fewer tokens judged at a filter's edge, none judged wrongly).
Every position moves V values as JSON: about 70 bytes an id, fine at the tiny pair's 320 ids, about
10 MB a position at a 128k vocabulary (use a local checkpoint there).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from spectest.e2e.http import ServerError
from spectest.protocol import OutsideTheImplementation

if TYPE_CHECKING:
    import torch

OWN = "server"  # --spec-target server: the engine under test scores its own tokens
PROBE = [0, 0]  # the shortest sequence whose one scored position shows the vocabulary
PROBE_TIMEOUT_S = 30.0


class ScorerError(OutsideTheImplementation):
    """A scoring endpoint other than the engine failed: no verdict on the engine."""


def scored_rows(reply: Any, length: int) -> list[dict[str, Any]]:
    """The ``length`` log-probability rows of a completion of ``length + 1`` prompt ids: row t is the
    distribution of the id after the first t + 1 (vLLM gives none for the first id)."""
    entries = reply["choices"][0]["prompt_logprobs"]
    if not isinstance(entries, list) or len(entries) != length + 1:
        raise ValueError(f"prompt_logprobs holds {len(entries) if isinstance(entries, list) else entries!r} entries")
    return entries[1:]


class CheckpointScorer:
    """Teacher-forced raw logits of a local transformers checkpoint (float32)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._model: Any = None

    @property
    def model(self) -> Any:
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32).eval()
        return self._model

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.folder)

    def target_logits(self, sequences):
        import torch

        longest = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), longest), dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        with torch.no_grad():
            return self.model(input_ids=ids, attention_mask=mask).logits.float()


class Endpoint(Protocol):
    """What a :class:`ServerScorer` needs of a server (a
    :class:`~spectest.e2e.engines.openai_server.ServerEngine` is one)."""

    name: str

    async def post_all(
        self, payloads: list[dict[str, Any]], labels: list[str], *, timeout: float | None = None
    ) -> list[Any]: ...


class ServerScorer:
    """``target_logits`` (float32 [N, L, V] log-probabilities) from a vLLM server's ``prompt_logprobs``.

    ``endpoint`` is the engine under test (``own``: its failures are its own) or another server (its
    failures raise :class:`ScorerError`, a harness-side error naming it)."""

    def __init__(self, endpoint: Endpoint, *, own: bool) -> None:
        self.endpoint, self.own = endpoint, own
        self._vocab: int | None = None
        self._refused: str | None = None
        self.describe = "the server itself (prompt_logprobs)" if own else f"{endpoint.name} (prompt_logprobs)"

    def unavailable(self) -> str | None:
        """Why this endpoint cannot score (it refuses full-vocabulary ``prompt_logprobs``), or None; an
        endpoint that does not answer is left to the calls (the engine's failure when it is the engine)."""
        if self._vocab is None and self._refused is None:
            try:
                self._vocab = self._probe()
            except ServerError as exc:
                refused = "HTTP 400" in str(exc) or "full vocabulary" in str(exc)
                if refused or not self.own:
                    self._refused = (
                        f"{self.endpoint.name} cannot score with full-vocabulary prompt_logprobs (start vLLM with "
                        f"--max-logprobs -1, or score with --spec-target DIR, a local checkpoint): {exc}"
                    )
        return self._refused

    @property
    def vocab_size(self) -> int:
        if self._vocab is None:
            self._vocab = self._guard(self._probe)
        return self._vocab

    def _probe(self) -> int:
        """The vocabulary: the number of ids scored at one position."""
        (row,) = self._score([PROBE], timeout=PROBE_TIMEOUT_S)
        return len(row[0])

    def target_logits(self, sequences: list[list[int]]) -> torch.Tensor:
        import torch

        vocab = self.vocab_size
        rows = self._guard(lambda: self._score(sequences))
        longest = max(len(s) for s in sequences)
        out = torch.zeros((len(sequences), longest, vocab), dtype=torch.float32)
        for i, positions in enumerate(rows):
            for t, entry in enumerate(positions):
                ids = [int(k) for k in entry]
                if len(ids) != vocab or min(ids) < 0 or max(ids) >= vocab:
                    raise self._error(
                        f"sequence {i} position {t}: prompt_logprobs scored {len(ids)} ids, not the full vocabulary "
                        f"of {vocab} (is it running with --max-logprobs -1?)"
                    )
                out[i, t, ids] = torch.tensor([float(v["logprob"]) for v in entry.values()])
        return out

    def _score(self, sequences: list[list[int]], timeout: float | None = None) -> list[list[dict[str, Any]]]:
        """Per sequence, its log-probability rows: a completion of the sequence and one more id (any:
        its own row is never read) returns a row for every position of the sequence."""
        payloads = [
            {"prompt": [*map(int, s), 0], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": -1} for s in sequences
        ]
        labels = [f"scoring request {i} ({len(s)} ids)" for i, s in enumerate(sequences)]
        replies = asyncio.run(self.endpoint.post_all(payloads, labels, timeout=timeout))
        out = []
        for label, sequence, reply in zip(labels, sequences, replies, strict=True):
            try:
                out.append(scored_rows(reply, len(sequence)))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ServerError(
                    f"{self.endpoint.name}: {label} came back without its prompt log-probabilities ({exc}): "
                    f"{str(reply)[:300]}"
                ) from None
        return out

    def _guard(self, work):
        try:
            return work()
        except ServerError as exc:
            raise self._error(str(exc)) from None

    def _error(self, message: str) -> Exception:
        if self.own:
            return ServerError(message)
        return ScorerError(f"the scoring endpoint (--spec-target) failed, so there is no verdict: {message}")
