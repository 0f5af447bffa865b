"""transformers' own speculative loops as spectest engines: assisted generation and prompt lookup.

``transformers-assisted``: ``target.generate(assistant_model=draft)`` on a small Llama-architecture
target and draft built from configs with seeded random weights (nothing is downloaded): vocabulary
256, a 2-layer target, and a 1-layer draft made of the target's first layer, embeddings and head
(plus seeded noise: ``draft_noise``), so the two agree often but not always. Logits are scaled so
the distributions are neither flat nor one-hot (entropy about 3 nats of a possible 5.5).
``transformers-prompt-lookup``: prompt lookup decoding (n-gram drafts from the prompt) on the
same target. A user's own pair: ``--spec-target DIR --spec-draft DIR`` (local checkpoints).

Adapters convert conventions and fix nothing in the loop. transformers runs assisted generation
one request at a time, so each request is its own ``generate`` call: its parameters map onto the
generation config (top-k 0 always passed: transformers' default is 50), EOS is disabled by
configuration (``eos_token_id=None``: no processor masks it), and its randomness comes from the
global torch RNG seeded per request inside ``fork_rng`` (its own seed, or one derived from the run's
seed and its index). The draft length is fixed (``num_assistant_tokens``, schedule "constant",
confidence threshold 0) and every pass is recorded: tokens it emitted and drafts it proposed.

Found while building it (transformers 5.24): the target's warpers (temperature, top-k, top-p,
min-p) reach the draft twice, once handed over and once rebuilt from the copied generation
config, so the draft samples from softmax(logits / T^2) at temperature T. Exact (the draft is
sampled from the q it reports), but the draft is sharper than asked.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from spectest.availability import missing
from spectest.e2e.pair import K, build_pair, load_checkpoint, teacher_forced
from spectest.e2e.protocol import BATCH_INVARIANT, SEEDED, TOKEN_WISE
from spectest.sampling_params import NO_SEED, SamplingParams
from spectest.speed.clock import one_torch_thread


def _unavailable() -> str | None:
    return missing("transformers", hint="pip install 'spectest[hf]'")


@contextlib.contextmanager
def recording_passes(log: list[tuple[int, int]]) -> Iterator[None]:
    """Every pass of the loop appends (drafts proposed, drafts accepted): transformers calls
    ``update_candidate_strategy`` once per target forward, with what it verified."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator, CandidateGenerator

    originals = {
        cls: cls.__dict__["update_candidate_strategy"] for cls in (CandidateGenerator, AssistedCandidateGenerator)
    }

    def wrap(original: Any) -> Any:
        def update_candidate_strategy(self: Any, input_ids: Any, scores: Any, num_matches: Any) -> Any:
            log.append((int(scores.shape[1]) - 1, int(num_matches)))
            return original(self, input_ids, scores, num_matches)

        return update_candidate_strategy

    for cls, original in originals.items():
        cls.update_candidate_strategy = wrap(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.update_candidate_strategy = original


class TransformersLoop:
    """What both engines share: per-request generate calls, seeds, teacher-forced logits, pass records."""

    spectest_engine_capabilities = frozenset({SEEDED, BATCH_INVARIANT, TOKEN_WISE})
    spectest_draft_warps = 2  # transformers applies a request's warpers twice to the draft (see the module docstring)

    def __init__(
        self,
        *,
        k: int = K,
        seed: int = 0,
        draft_noise: float = 0.0,
        target_layers: int = 2,
        target: str | None = None,
        draft: str | None = None,
    ) -> None:
        self.k, self.seed, self.draft_noise, self.target_layers = k, seed, draft_noise, target_layers
        self.target_path, self.draft_path = target, draft
        self._models: tuple[Any, Any] | None = None
        self.passes: list[int] | None = None
        self.tokens_per_pass: list[list[int]] | None = None
        self.draft_lengths: list[list[int]] | None = None

    @property
    def spectest_unavailable(self) -> str | None:
        return _unavailable()

    def with_checkpoints(self, *, target: str | None = None, draft: str | None = None) -> TransformersLoop:
        """The same engine on local checkpoints (``--spec-target DIR --spec-draft DIR``): each must be
        a directory ``save_pretrained`` wrote (nothing downloads from a hub), checked before any test runs."""
        if target is None:
            raise ValueError("--spec-draft needs --spec-target (the draft is checked against that target)")
        for option, path in (("--spec-target", target), ("--spec-draft", draft)):
            if path is not None and not (Path(path) / "config.json").is_file():
                raise ValueError(f"{option} {path!r} is not a checkpoint directory (no config.json there)")
        return type(self)(k=self.k, seed=self.seed, target=target, draft=draft)

    @property
    def models(self) -> tuple[Any, Any]:
        if self._models is None:
            if self.target_path is None:
                self._models = build_pair(
                    seed=self.seed, draft_noise=self.draft_noise, k=self.k, target_layers=self.target_layers
                )
            else:
                target = load_checkpoint(self.target_path, self.k)
                draft = load_checkpoint(self.draft_path, self.k) if self.draft_path else None
                if draft is not None and draft.config.vocab_size != target.config.vocab_size:
                    raise ValueError(
                        f"target vocabulary {target.config.vocab_size} != draft vocabulary {draft.config.vocab_size}"
                    )
                self._models = (target, draft)
        return self._models

    @property
    def vocab_size(self) -> int:
        return int(self.models[0].config.vocab_size)

    def speculation(self) -> dict[str, Any]:
        """generate's keywords that turn speculative decoding on."""
        raise NotImplementedError

    def patches(self) -> contextlib.AbstractContextManager[None]:
        """Changes to transformers around each request (none: the known-buggy engines in tests/ override it)."""
        return contextlib.nullcontext()

    def request_seed(self, params: SamplingParams, row: int, seed: int) -> int:
        own = int(params.seed[row])
        return own if own != NO_SEED else zlib.crc32(f"{seed}:{row}".encode())

    def _run(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_new_tokens: int,
        seed: int,
        speculative: bool,
    ) -> list[list[int]]:
        from transformers.utils import logging

        target = self.models[0]
        outputs, passes, tokens, drafts = [], [], [], []
        verbosity = logging.get_verbosity()
        logging.set_verbosity_error()
        try:
            for row, prompt in enumerate(prompts):
                sampling = self.sampling(params, row)
                log: list[tuple[int, int]] = []
                ids = torch.tensor([list(prompt)], dtype=torch.int64)
                with (
                    one_torch_thread(),
                    torch.random.fork_rng(devices=[]),
                    torch.no_grad(),
                    recording_passes(log),
                    self.patches(),
                ):
                    torch.manual_seed(self.request_seed(params, row, seed))
                    out = target.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=max_new_tokens,
                        eos_token_id=None,
                        pad_token_id=None,
                        **sampling,
                        **(self.speculation() if speculative else {}),
                    )
                outputs.append(out[0, ids.shape[1] :].tolist())
                passes.append(len(log))
                tokens.append([accepted + 1 for _, accepted in log])
                drafts.append([proposed for proposed, _ in log])
        finally:
            logging.set_verbosity(verbosity)
        if speculative:
            self.passes, self.tokens_per_pass, self.draft_lengths = passes, tokens, drafts
        return outputs

    @staticmethod
    def sampling(params: SamplingParams, row: int) -> dict[str, Any]:
        """generate's keywords for one request (top-k 0 always passed: transformers' default is 50)."""
        temperature = float(params.temperature[row])
        if temperature == 0:
            return {"do_sample": False, "top_k": 0}
        min_p = float(params.min_p[row])
        return {
            "do_sample": True,
            "temperature": temperature,
            "top_k": int(params.top_k[row]),
            "top_p": float(params.top_p[row]),
            "min_p": min_p if min_p > 0 else None,
        }

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> list[list[int]]:
        return self._run(prompts, params, max_new_tokens, seed, speculative=True)

    def plain_generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> list[list[int]]:
        return self._run(prompts, params, max_new_tokens, seed, speculative=False)

    def target_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        return teacher_forced(self.models[0], sequences)


class TransformersAssisted(TransformersLoop):
    """``generate(assistant_model=draft)``: assisted generation with a draft model."""

    def speculation(self) -> dict[str, Any]:
        return {"assistant_model": self.models[1]}

    def draft_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        return teacher_forced(self.models[1], sequences)

    def spectest_components(self, context: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        """Timed parts of one pass, for the end-to-end speed property (see :func:`assisted_components`)."""
        return assisted_components(self, context, params)


def warpers(sampling: dict[str, Any]) -> Any:
    """The logits warpers transformers builds for these generate keywords, in its order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out = LogitsProcessorList()
    if not sampling.get("do_sample"):
        return out
    if sampling["temperature"] != 1.0:
        out.append(TemperatureLogitsWarper(sampling["temperature"]))
    if sampling["top_k"]:
        out.append(TopKLogitsWarper(sampling["top_k"]))
    if sampling["top_p"] < 1.0:
        out.append(TopPLogitsWarper(sampling["top_p"]))
    if sampling["min_p"]:
        out.append(MinPLogitsWarper(sampling["min_p"]))
    return out


def assisted_components(engine: TransformersAssisted, context: Sequence[int], params: SamplingParams) -> dict[str, Any]:
    """One pass of transformers' assisted loop, part by part, at ``context`` with the first request's
    parameters: the draft's ``generate`` of K tokens (as the candidate generator calls it), the
    target's forward over K + 1 new positions on a cache of the context, and the verification (the
    request's warpers on the K + 1 rows, then ``_speculative_sampling``); and the target's forward
    over one position (what a plain step costs besides the loop around it). Each a callable the
    harness times; none decodes anything the speed property measures."""
    import transformers.generation.utils as generation_utils
    from transformers import DynamicCache

    target, draft = engine.models
    k, vocab = engine.k, engine.vocab_size
    sampling = engine.sampling(params, 0)
    ids = torch.tensor([list(context)], dtype=torch.int64)
    generator = torch.Generator().manual_seed(len(context))
    new = torch.randint(0, vocab, (1, k + 1), generator=generator)
    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=ids, cache=cache, use_cache=True)
    new_logits = torch.randn((1, k + 1, vocab), generator=generator)
    candidate_logits = torch.randn((1, k, vocab), generator=generator)
    candidate_ids = torch.cat([ids, new[:, :k]], dim=1)
    chain = warpers(sampling)

    def drafting() -> None:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            draft.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=k,
                eos_token_id=None,
                pad_token_id=None,
                **sampling,
            )

    def target_pass() -> None:
        with torch.no_grad():
            target(input_ids=new, cache=cache, use_cache=True)
        cache.crop(-(k + 1))

    def target_step() -> None:
        with torch.no_grad():
            target(input_ids=new[:, :1], cache=cache, use_cache=True)
        cache.crop(-1)

    def verify() -> None:
        processed = new_logits.clone()
        for i in range(k + 1):
            processed[:, i] = chain(candidate_ids[:, : ids.shape[1] + i], processed[:, i])
        with torch.random.fork_rng(devices=[]):
            generation_utils._speculative_sampling(candidate_ids, candidate_logits, k, processed)

    return {"draft": drafting, "target": target_pass, "verify": verify, "target_step": target_step}


class TransformersPromptLookup(TransformersLoop):
    """``generate(prompt_lookup_num_tokens=K)``: drafts copied from n-grams of the prompt."""

    def speculation(self) -> dict[str, Any]:
        return {"prompt_lookup_num_tokens": self.k}


TRANSFORMERS_ASSISTED = TransformersAssisted()
TRANSFORMERS_PROMPT_LOOKUP = TransformersPromptLookup()
# A draft further from the target (seeded noise on every weight): a lower acceptance, for the speed figures.
TRANSFORMERS_ASSISTED_FAR = TransformersAssisted(draft_noise=1.0)
