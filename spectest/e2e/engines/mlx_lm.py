"""MLX-LM's speculative decoding on MLX's Linux CPU backend, as spectest engines (``pip install -e '.[mlx]'``).

``mlx-lm-draft``: ``mlx_lm.generate.speculative_generate_step`` with the shared tiny pair's draft
(:mod:`spectest.e2e.tiny_pair`, loaded by ``mlx_lm.load`` straight from its Hugging Face folders,
float32 kept) and ``num_draft_tokens`` = 4. ``mlx-lm-off`` is ``mlx_lm.generate.generate_step`` on the same
target with the same sampler: the control. MLX-LM generates one sequence at a time, so a call's requests run
one after another, each with its sampler (``make_sampler(temp, top_p, min_p, top_k)``) and its seed
(``mx.random.seed``: its own, or one derived from the run's seed and its row). Teacher forcing runs the same
checkpoint in transformers.

Declared as its source has it (``mlx_lm/sample_utils.py``): top-p, then min-p, then top-k on the
untempered log-probabilities, then temperature; greedy is ``argmax`` (the lowest id on ties); ``seeded``
(one global key, seeded per request). Not ``standard-rejection``: it samples the target at every drafted
position and keeps a draft while it equals the target's sample (exact, but it accepts with sum p'q' rather
than sum min(p', q')): the tokens-per-pass property measures its acceptance efficiency and says so.

Passes come from the engine itself: each token it yields says whether it came from the draft, and a pass
drafts ``min(tokens left, 4)``. For the speed property the engine times one pass's parts with its own
models, caches and sampler (:func:`pass_components`), in its process. Compilation is off (``mx.disable_compile()``, documented): on the CPU, MLX
compiles each fused kernel with the system's C++ compiler for every new shape, thousands in a default run
(about half an hour on 2 cores before its disk cache is warm); the operations and their results are the
same, so the sampling is. The engine runs in a child process (:mod:`spectest.e2e.isolated`).
"""

from __future__ import annotations

from typing import Any

from spectest.availability import missing
from spectest.e2e.isolated import SPECULATION_OFF, IsolatedWithDraft
from spectest.e2e.protocol import SEEDED
from spectest.e2e.tiny_pair import TeacherForcedLogits

K = 4
ORDER = ("top_p", "min_p", "top_k", "temperature")


def unavailable() -> str | None:
    return missing("mlx", "mlx_lm", hint="pip install -e '.[mlx]', in an environment of its own")


def passes_from_flags(from_draft: list[bool], k: int, max_new_tokens: int) -> tuple[list[int], list[int]]:
    """(tokens per pass, drafts per pass) of one request from the ``from_draft`` flag of each token.

    A pass drafts ``min(tokens left, k)`` and ends at its first token not from the draft (the target's
    replacement of a rejected draft, or the bonus after k accepted ones), or where the request ends. The
    last pass's last token is the end of the output, not a trial the engine finished on its own terms (all
    its drafts accepted and no bonus, or a rejection: the two look alike there), so it is reported as that
    pass's bonus: one trial fewer, and the same whatever the outcome.
    """
    tokens, drafts = [], []
    emitted = current = 0
    for flag in from_draft:
        current += 1
        if not flag:
            tokens.append(current)
            drafts.append(min(max_new_tokens - emitted, k))
            emitted += current
            current = 0
    if current:
        tokens.append(current)
        drafts.append(min(max_new_tokens - emitted, k))
    if tokens:
        drafts[-1] = min(drafts[-1], tokens[-1] - 1)
    return tokens, drafts


class MLXEngine(TeacherForcedLogits):
    """The engine inside the child process."""

    def __init__(self, *, k: int = K, seed: int = 0, speculation: bool = True) -> None:
        import mlx.core as mx
        from mlx_lm import load

        mx.disable_compile()  # see the module's docstring
        from spectest.e2e import tiny_pair

        self.pair = tiny_pair.pair(seed)
        self.vocab_size = tiny_pair.VOCAB
        self.teacher = tiny_pair.TeacherForcing(self.pair)
        self.target, _ = load(str(self.pair.target))
        self.draft = load(str(self.pair.draft))[0] if speculation else None
        self.k, self.speculation = k, speculation
        self.passes = self.tokens_per_pass = self.draft_lengths = None

    def _sampler(self, params: Any, row: int) -> Any:
        from mlx_lm.sample_utils import make_sampler

        temperature = float(params.temperature[row])
        if temperature <= 0:
            return make_sampler(temp=0.0)
        top_k = int(params.top_k[row])
        return make_sampler(
            temp=temperature,
            top_p=float(params.top_p[row]),
            min_p=float(params.min_p[row]),
            top_k=top_k if 0 < top_k < self.vocab_size else 0,  # MLX refuses k >= V: the same as off
        )

    def _run(self, prompts, params, max_new_tokens, seed, *, draft: bool) -> list[list[int]]:
        import mlx.core as mx
        from mlx_lm.generate import generate_step, speculative_generate_step

        from spectest.e2e.cases import request_seed

        outputs, passes, tokens_per_pass, draft_lengths = [], [], [], []
        for row, prompt in enumerate(prompts):
            mx.random.seed(request_seed(params, row, seed))
            sampler = self._sampler(params, row)
            ids = mx.array(list(prompt), dtype=mx.uint32)
            if draft:
                steps = speculative_generate_step(
                    ids, self.target, self.draft, num_draft_tokens=self.k, max_tokens=max_new_tokens, sampler=sampler
                )
                emitted = [(int(token), bool(from_draft)) for token, _, from_draft in steps]
                tokens, drafts = passes_from_flags([f for _, f in emitted], self.k, max_new_tokens)
                outputs.append([t for t, _ in emitted])
                passes.append(len(tokens))
                tokens_per_pass.append(tokens)
                draft_lengths.append(drafts)
            else:
                steps = generate_step(ids, self.target, max_tokens=max_new_tokens, sampler=sampler)
                outputs.append([int(token) for token, _ in steps])
        if draft:
            self.passes, self.tokens_per_pass, self.draft_lengths = passes, tokens_per_pass, draft_lengths
        return outputs

    def generate(self, prompts, params, max_new_tokens, seed):
        return self._run(prompts, params, max_new_tokens, seed, draft=self.speculation)

    def plain_generate(self, prompts, params, max_new_tokens, seed):
        return self._run(prompts, params, max_new_tokens, seed, draft=False)

    @property
    def spectest_components(self) -> Any:
        """One pass's parts for the speed property (:func:`pass_components`); none without a draft."""
        if self.draft is None:
            raise AttributeError("mlx-lm without a draft has no speculative pass")
        return lambda context, params: pass_components(self, context, params)


def pass_components(engine: MLXEngine, context: list[int], params: Any) -> dict[str, Any]:
    """One pass of ``speculative_generate_step``, part by part, with the models, caches and sampler it
    uses, at ``context`` with the first request's sampler (both caches filled with the context first):
    the draft's K steps (one position each, sampled, as its ``_draft_generate`` runs them), the target's
    forward over K + 1 new positions, the verification (the K + 1 rows' log-softmax and sampling, the
    comparison with the drafts), and the target over one position with its sampling (what a plain step
    costs besides ``generate_step``'s loop). Each part undoes its cache entries, as the loop's rewind
    does. None decodes anything the speed property measures (MLX's global key draws what it draws;
    every timed request reseeds it)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    k, target, draft = engine.k, engine.target, engine.draft
    sampler = engine._sampler(params, 0)
    target_cache, draft_cache = make_prompt_cache(target), make_prompt_cache(draft)
    ids = mx.array(list(context), dtype=mx.uint32)
    for model, cache in ((target, target_cache), (draft, draft_cache)):
        model(ids[None], cache=cache)
        mx.eval([c.state for c in cache])
    chosen = np.random.default_rng(len(context)).integers(0, engine.vocab_size, k + 1)
    new = mx.array(chosen.tolist(), dtype=mx.uint32)
    proposed = chosen[:k].tolist()

    def sample(logits: Any) -> Any:
        return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    def drafting() -> None:
        y, drafts = new[:1], []
        for _ in range(k):
            y = sample(draft(y[None], cache=draft_cache)[:, -1, :])
            mx.async_eval(y)
            drafts.append(y)
        mx.eval(mx.concatenate(drafts))
        trim_prompt_cache(draft_cache, k)

    logits = target(new[None], cache=target_cache)
    mx.eval(logits)
    trim_prompt_cache(target_cache, k + 1)

    def target_pass() -> None:
        mx.eval(target(new[None], cache=target_cache))
        trim_prompt_cache(target_cache, k + 1)

    def verify() -> None:
        tokens = sample(logits.squeeze(0))
        mx.eval(tokens)
        kept = 0
        for drafted, sampled in zip(proposed, tokens.tolist(), strict=False):
            if drafted != sampled:
                break
            kept += 1

    def target_step() -> None:
        mx.eval(sample(target(new[None, :1], cache=target_cache)[:, -1, :]))
        trim_prompt_cache(target_cache, 1)

    return {"draft": drafting, "target": target_pass, "verify": verify, "target_step": target_step}


def build(**options: Any) -> MLXEngine:
    return MLXEngine(**options)


class MLXLM(IsolatedWithDraft):
    """The registered engine: the declarations, and the child that runs MLX."""

    spectest_engine_capabilities = frozenset({SEEDED})
    spectest_filter_order = ORDER

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options)

    @property
    def spectest_components_unavailable(self) -> str | None:
        return None if self.options.get("speculation", True) else SPECULATION_OFF

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()


MLX_DRAFT = MLXLM("mlx-lm-draft", k=K)
MLX_OFF = MLXLM("mlx-lm-off", speculation=False)  # the control: the same adapter, no draft
