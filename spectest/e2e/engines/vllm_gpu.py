"""vLLM's ``LLM`` with speculative decoding on, as a spectest engine (``vllm-e2e``): CUDA only.

The target and draft are the same small seeded Llama pair as ``transformers-assisted``
(:func:`spectest.e2e.pair.build_pair`), saved to a temporary directory and loaded
by vLLM in float32 (``skip_tokenizer_init``: prompts and outputs are token ids). ``method``:
"draft_model" (the pair) or "ngram" (prompt lookup). Requests map onto vLLM's
``SamplingParams`` one to one, with ``ignore_eos=True`` (EOS disabled by configuration, never
masked) and a per-request seed (its own, or one derived from the run's seed and its index).
The target logits for teacher forcing come from the same weights in transformers, in float32
(a kernel's rounding differs from vLLM's; the 1e-4 ambiguity rule absorbs filter edges).

Without vLLM or a GPU it resolves, the header says why, and every property skips. Not yet run on
a GPU (no device was lent to the session that wrote it).
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from spectest.availability import missing
from spectest.e2e.pair import K, build_pair, teacher_forced
from spectest.e2e.protocol import BATCH_INVARIANT, SEEDED, TOKEN_WISE
from spectest.sampling_params import NO_SEED, SamplingParams


class VllmEngine:
    spectest_engine_capabilities = frozenset({SEEDED, BATCH_INVARIANT, TOKEN_WISE})

    def __init__(self, *, method: str = "draft_model", k: int = K, seed: int = 0) -> None:
        if method not in ("draft_model", "ngram"):
            raise ValueError(f"method must be 'draft_model' or 'ngram', got {method!r}")
        self.method, self.k, self.seed = method, k, seed
        self._llm: Any = None
        self._pair: tuple[Any, Any] | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None

    @property
    def spectest_unavailable(self) -> str | None:
        return missing("vllm", gpu=True) or missing("transformers", hint="the pair is built with it")

    @property
    def pair(self) -> tuple[Any, Any]:
        if self._pair is None:
            self._pair = build_pair(seed=self.seed, k=self.k)
        return self._pair

    @property
    def vocab_size(self) -> int:
        return int(self.pair[0].config.vocab_size)

    @property
    def llm(self) -> Any:
        if self._llm is None:
            from vllm import LLM

            self._directory = tempfile.TemporaryDirectory(prefix="spectest-vllm-")
            target_dir, draft_dir = f"{self._directory.name}/target", f"{self._directory.name}/draft"
            target, draft = self.pair
            target.save_pretrained(target_dir)
            draft.save_pretrained(draft_dir)
            speculative = {"method": self.method, "num_speculative_tokens": self.k}
            if self.method == "draft_model":
                speculative["model"] = draft_dir
            else:
                speculative["prompt_lookup_max"] = 3
            self._llm = LLM(
                model=target_dir,
                skip_tokenizer_init=True,
                dtype="float32",
                speculative_config=speculative,
                enforce_eager=True,
                gpu_memory_utilization=0.3,
                seed=self.seed,
            )
        return self._llm

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: int, seed: int
    ) -> list[list[int]]:
        from vllm import SamplingParams as VllmParams
        from vllm.inputs import TokensPrompt

        requests = []
        for row in range(len(prompts)):
            own = int(params.seed[row])
            requests.append(
                VllmParams(
                    temperature=float(params.temperature[row]),
                    top_k=int(params.top_k[row]) or -1,
                    top_p=float(params.top_p[row]),
                    min_p=float(params.min_p[row]),
                    seed=own if own != NO_SEED else zlib.crc32(f"{seed}:{row}".encode()),
                    max_tokens=max_new_tokens,
                    ignore_eos=True,
                    detokenize=False,
                )
            )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests, use_tqdm=False)
        return [list(out.outputs[0].token_ids) for out in outputs]

    def target_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        return teacher_forced(self.pair[0], sequences)

    def draft_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        if self.method != "draft_model":
            raise NotImplementedError("an n-gram draft has no logits")
        return teacher_forced(self.pair[1], sequences)


VLLM_E2E = VllmEngine()
