"""llama.cpp's speculative decoding through llama-cpp-python, as spectest engines (``pip install -e '.[llamacpp]'``).

``llama-cpp-draft``: ``Llama.generate`` on the shared tiny pair's target
(:mod:`spectest.e2e.engines.tiny_pair`) converted to GGUF (float32) with ``convert_hf_to_gguf.py``, with a
second GGUF, the pair's draft, plugged in as its ``draft_model`` (a ``LlamaDraftModel`` proposing the
draft's 4 greedy tokens, as llama.cpp's own speculative example drafts). ``llama-cpp-prompt-lookup``: the
built-in ``LlamaPromptLookupDecoding`` (n-grams up to 3, 4 tokens). ``llama-cpp-off``: the same ``Llama``
without a draft, the control. The converter and its ``gguf`` package come from llama-cpp-python's own sdist
(``pip download`` of the installed version, once, into the cache): the converter of the llama.cpp it runs.

One thread (two spin-wait on shared cores), ``logits_all``, a 512-token context, a float32 KV cache (its
default is f16). llama-cpp-python runs one
sequence at a time: a call's requests run one after another on the same ``Llama`` (as a server reuses it,
KV-cache prefix reuse included), each with its seed (``set_seed``: its own, or one derived from the run's
seed and its row) and explicit ``temp``, ``top_k``, ``top_p``, ``min_p`` (overriding the defaults
``top_k=40``, ``min_p=0.05``) and ``repeat_penalty=1``. It adds no BOS and never stops on EOS.

Declared as its source has it (``llama_cpp/llama.py``, ``_init_sampler``): top-k, top-p, min-p on the
untempered logits, then temperature; greedy is the sampler chain's ``greedy`` (the lowest id on ties);
``seeded`` (a fresh sampler seeded by ``set_seed`` per request). It samples the target and keeps a draft
while it equals the sample: not ``standard-rejection``, and its drafts are greedy (no draft
distribution to model), so neither engine exposes ``draft_logits``. Teacher forcing runs the checkpoint in
transformers. The engine runs in a child process (:mod:`spectest.e2e.isolated`).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from spectest.e2e.engines.tiny_pair import TeacherForcedLogits
from spectest.e2e.isolated import IsolatedWithPlain
from spectest.e2e.protocol import SEEDED

K = 4
ORDER = ("top_k", "top_p", "min_p", "temperature")
CONTEXT = 512
F32 = 0  # GGML_TYPE_F32


def unavailable() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("transformers") is None:
        return "llama-cpp-python is not installed (pip install -e '.[llamacpp]', in an environment of its own)"
    return None


def converter_folder() -> Path:
    """``vendor/llama.cpp`` of the installed llama-cpp-python's sdist (the converter, ``conversion/`` and
    ``gguf-py``), fetched once with pip into the cache."""
    from spectest.e2e.engines.tiny_pair import cached, version

    release = version("llama-cpp-python")

    def make(folder: Path) -> None:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d"]
        done = subprocess.run([*command, str(folder), f"llama-cpp-python=={release}"], capture_output=True, text=True)
        archives = list(folder.glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(
                f"pip download of llama-cpp-python's sdist failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        wanted = ("vendor/llama.cpp/convert_hf_to_gguf.py", "vendor/llama.cpp/conversion/", "vendor/llama.cpp/gguf-py/")
        with tarfile.open(archives[0]) as sdist:
            members = [m for m in sdist.getmembers() if any(w in m.name for w in wanted)]
            sdist.extractall(folder, members=members, filter="data")
        archives[0].unlink()

    root = cached(f"llama-cpp-python-{release}-converter", make)
    return next(root.glob("*/vendor/llama.cpp"))


def to_gguf(hf_folder: Path, out: Path) -> None:
    """``convert_hf_to_gguf.py DIR --outfile model.gguf --outtype f32``, as its command line runs it."""
    out.mkdir(parents=True, exist_ok=True)
    script = converter_folder() / "convert_hf_to_gguf.py"
    command = [sys.executable, str(script), str(hf_folder), "--outfile", str(out / "model.gguf"), "--outtype", "f32"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "model.gguf").exists():
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({done.returncode}): {done.stderr[-2000:]}")


def _llama(path: Path, draft_model: Any = None) -> Any:
    from llama_cpp import Llama

    return Llama(
        model_path=str(path),
        n_ctx=CONTEXT,
        n_threads=1,
        n_threads_batch=1,
        logits_all=True,
        seed=0,
        type_k=F32,  # llama.cpp keeps its KV cache in f16 by default
        type_v=F32,
        draft_model=draft_model,
        verbose=False,
    )


def gguf_draft(path: Path, k: int) -> Any:
    """A second GGUF as a ``LlamaDraftModel``: its ``k`` greedy tokens after the ids it is given."""
    import numpy as np
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GGUFDraft(LlamaDraftModel):
        def __init__(self) -> None:
            self.model = _llama(path)

        def __call__(self, input_ids, /, **kwargs):
            proposed = []
            for token in self.model.generate(
                [int(t) for t in input_ids], temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0
            ):
                proposed.append(int(token))
                if len(proposed) == k:
                    break
            return np.array(proposed, dtype=np.intc)

    return GGUFDraft()


class LlamaCppEngine(TeacherForcedLogits):
    """The engine inside the child process."""

    def __init__(self, *, draft: str | None = "gguf", k: int = K, seed: int = 0) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from spectest.e2e.engines import tiny_pair

        self.pair = tiny_pair.pair(seed)
        folders = tiny_pair.converted(self.pair, "gguf", "llama-cpp-python", to_gguf)
        self.vocab_size = tiny_pair.VOCAB
        self.teacher = tiny_pair.TeacherForcing(self.pair)
        proposer = None
        if draft == "gguf":
            proposer = gguf_draft(folders / "draft" / "model.gguf", k)
        elif draft == "prompt-lookup":
            proposer = LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=k)
        self.target_gguf = folders / "target" / "model.gguf"
        self.llm = _llama(self.target_gguf, proposer)
        self._plain: Any = None if proposer else self.llm
        if self.llm.n_vocab() != self.vocab_size:
            raise RuntimeError(f"the GGUF holds {self.llm.n_vocab()} tokens, the pair {self.vocab_size}")

    def _run(self, llm: Any, prompts, params, max_new_tokens, seed) -> list[list[int]]:
        from spectest.e2e.engines.tiny_pair import request_seed

        outputs = []
        for row, prompt in enumerate(prompts):
            llm.set_seed(request_seed(params, row, seed))
            temperature = float(params.temperature[row])
            sampled = temperature > 0
            tokens = []
            for token in llm.generate(
                list(prompt),
                temp=temperature if sampled else 0.0,
                top_k=int(params.top_k[row]) if sampled else 0,
                top_p=float(params.top_p[row]) if sampled else 1.0,
                min_p=float(params.min_p[row]) if sampled else 0.0,
                repeat_penalty=1.0,
            ):
                tokens.append(int(token))
                if len(tokens) == max_new_tokens:
                    break
            outputs.append(tokens)
        return outputs

    def generate(self, prompts, params, max_new_tokens, seed):
        return self._run(self.llm, prompts, params, max_new_tokens, seed)

    def plain_generate(self, prompts, params, max_new_tokens, seed):
        if self._plain is None:
            self._plain = _llama(self.target_gguf)
        return self._run(self._plain, prompts, params, max_new_tokens, seed)


def build(**options: Any) -> LlamaCppEngine:
    return LlamaCppEngine(**options)


class LlamaCpp(IsolatedWithPlain):
    """The registered engine: the declarations, and the child that runs llama.cpp."""

    spectest_engine_capabilities = frozenset({SEEDED})
    spectest_filter_order = ORDER

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options)

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()


LLAMA_CPP_DRAFT = LlamaCpp("llama-cpp-draft", draft="gguf")
LLAMA_CPP_PROMPT_LOOKUP = LlamaCpp("llama-cpp-prompt-lookup", draft="prompt-lookup")
LLAMA_CPP_OFF = LlamaCpp("llama-cpp-off", draft=None)  # the control: no draft model
