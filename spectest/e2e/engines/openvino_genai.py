"""OpenVINO GenAI with a draft model, on the CPU, as a spectest engine (``pip install -e '.[openvino]'``).

``openvino-genai-draft`` (``num_assistant_tokens`` = 4) and ``openvino-genai-confidence`` (the draft
proposes until its own probability falls below ``assistant_confidence_threshold`` 0.3): one
``ContinuousBatchingPipeline`` per engine on the shared tiny pair (:mod:`spectest.e2e.tiny_pair`)
converted to OpenVINO IR with ``optimum-cli export openvino --weight-format fp32`` on first use, computing in
float32 with a float32 KV cache (the CPU plugin's default is bf16 with a u8 cache). A call's requests go in
one batch, each with its own ``GenerationConfig``: temperature, top-k, top-p, min-p, its seed as
``rng_seed`` (its own, or one derived from the run's seed and its row), ``ignore_eos``. The same pipeline
without its draft is ``plain_generate``, and ``openvino-genai-off`` generates with it: the control that
proves the adapter's declarations right (it must pass every output property).
Teacher forcing runs the same checkpoint in transformers (the exported IR matches it to about 3e-6 in
float32).

Declared as its source has it (``src/cpp/src/sampling/logit_processor.hpp``): top-k, then temperature, then
min-p, then top-p. Seeds: ``rng_seed`` is per request and documented, so ``seeded`` and ``batch-invariant``
are declared. Not ``standard-rejection``: its own validation is for spectest to find out.

The engine runs in a child process (:mod:`spectest.e2e.isolated`): a crash in the C++ runtime fails the
call that caused it, never the test session.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from spectest.availability import missing
from spectest.e2e.cases import request_seed
from spectest.e2e.isolated import SPECULATION_OFF, IsolatedWithDraft
from spectest.e2e.protocol import BATCH_INVARIANT, SEEDED
from spectest.e2e.tiny_pair import TeacherForcedLogits

K = 4
PRECISION = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
ORDER = ("top_k", "temperature", "min_p", "top_p")


def unavailable() -> str | None:
    return missing(
        "openvino_genai",
        "optimum.intel",
        "transformers",
        hint="pip install -e '.[openvino]', in an environment of its own",
    )


def export(hf_folder: Path, out: Path) -> None:
    """optimum-intel's exporter, as its command line runs it."""
    command = [
        sys.executable,
        "-m",
        "optimum.commands.optimum_cli",
        "export",
        "openvino",
        "--model",
        str(hf_folder),
        "--task",
        "text-generation-with-past",
        "--weight-format",
        "fp32",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "openvino_model.xml").exists():
        raise RuntimeError(f"optimum-cli export openvino failed ({done.returncode}): {done.stderr[-2000:]}")


class OpenVINOEngine(TeacherForcedLogits):
    """The engine inside the child process."""

    def __init__(
        self, *, k: int | None = K, confidence: float | None = None, seed: int = 0, speculation: bool = True
    ) -> None:
        import openvino_genai as og

        from spectest.e2e import tiny_pair

        self.og = og
        self.pair = tiny_pair.pair(seed)
        folders = tiny_pair.converted(self.pair, "openvino", "optimum-intel", export)
        self.target_ir, self.draft_ir = folders / "target", folders / "draft"
        self.vocab_size = tiny_pair.VOCAB
        self.k, self.confidence, self.speculation = k, confidence, speculation
        self.spec = self._pipeline(draft=True) if speculation else None
        self._plain: Any = None
        self.teacher = tiny_pair.TeacherForcing(self.pair)
        self.counters: dict[str, int] | None = None

    def _pipeline(self, *, draft: bool) -> Any:
        og = self.og
        scheduler = og.SchedulerConfig()
        scheduler.cache_size = 1  # GB of KV cache
        properties = dict(PRECISION)
        if draft:
            properties["draft_model"] = og.draft_model(str(self.draft_ir), "CPU", **PRECISION)
        return og.ContinuousBatchingPipeline(str(self.target_ir), scheduler, "CPU", properties)

    def _configs(self, params: Any, max_new_tokens: int, seed: int, *, draft: bool) -> list[Any]:
        configs = []
        for row in range(params.batch_size):
            config = self.og.GenerationConfig()
            config.max_new_tokens = max_new_tokens
            config.ignore_eos = True
            temperature = float(params.temperature[row])
            if temperature > 0:
                config.do_sample = True
                config.temperature = temperature
                config.top_k = int(params.top_k[row]) if int(params.top_k[row]) > 0 else 2**31 - 1
                config.top_p = float(params.top_p[row])
                config.min_p = float(params.min_p[row])
            else:
                config.do_sample = False
            config.rng_seed = request_seed(params, row, seed)
            if draft and self.confidence is not None:
                config.assistant_confidence_threshold = self.confidence
            elif draft:
                config.num_assistant_tokens = self.k
            configs.append(config)
        return configs

    def _run(self, pipeline: Any, prompts, params, max_new_tokens, seed, *, draft: bool) -> list[list[int]]:
        import numpy as np
        import openvino as ov

        tensors = [ov.Tensor(np.asarray([prompt], dtype=np.int64)) for prompt in prompts]
        results = pipeline.generate(tensors, self._configs(params, max_new_tokens, seed, draft=draft))
        if draft and results:
            metrics = results[0].extended_perf_metrics  # accumulated over the call's batch
            self.counters = {
                "draft_tokens": int(metrics.get_num_draft_tokens()),
                "accepted_tokens": int(metrics.get_num_accepted_tokens()),
                "generated_tokens": int(metrics.get_num_generated_tokens()),
            }
        return [[int(t) for t in result.m_generation_ids[0]] for result in results]

    def generate(self, prompts, params, max_new_tokens, seed):
        if not self.speculation:  # the control: the same adapter and declarations, no draft
            return self.plain_generate(prompts, params, max_new_tokens, seed)
        return self._run(self.spec, prompts, params, max_new_tokens, seed, draft=True)

    def plain_generate(self, prompts, params, max_new_tokens, seed):
        if self._plain is None:
            self._plain = self._pipeline(draft=False)
        return self._run(self._plain, prompts, params, max_new_tokens, seed, draft=False)


def build(**options: Any) -> OpenVINOEngine:
    return OpenVINOEngine(**options)


class OpenVINOGenAI(IsolatedWithDraft):
    """The registered engine: the declarations, and the child that runs OpenVINO."""

    spectest_engine_capabilities = frozenset({SEEDED, BATCH_INVARIANT})
    spectest_filter_order = ORDER

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options)

    @property
    def spectest_components_unavailable(self) -> str:
        if not self.options.get("speculation", True):
            return SPECULATION_OFF
        return (
            "OpenVINO GenAI runs a whole generation in one C++ call (continuous batching over paged attention): no "
            "API runs one pass's drafting, target pass or verification alone, and a model compiled apart would time "
            "other kernels"
        )

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()


OPENVINO_DRAFT = OpenVINOGenAI("openvino-genai-draft", k=K)
OPENVINO_CONFIDENCE = OpenVINOGenAI("openvino-genai-confidence", confidence=0.3)
# The control: the same pipeline, adapter and declarations with speculative decoding off.
OPENVINO_OFF = OpenVINOGenAI("openvino-genai-off", speculation=False)
