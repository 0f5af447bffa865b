"""llama.cpp's speculative decoding through llama-cpp-python, as spectest engines (``pip install -e '.[llamacpp]'``).

``llama-cpp-draft``: ``Llama.generate`` on the shared tiny pair's target
(:mod:`spectest.e2e.tiny_pair`) converted to GGUF (float32) with ``convert_hf_to_gguf.py``, with a
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
while it equals the sample: not ``standard-rejection``. The GGUF draft proposes its argmax
(``spectest_draft_sampling = "greedy"``: q is a point mass, whose logits come from teacher forcing the draft
checkpoint), so ``llama-cpp-draft`` exposes ``draft_logits``; a looked-up draft has no distribution.
Teacher forcing runs the checkpoints in transformers. The engine runs in a child process
(:mod:`spectest.e2e.isolated`).

Passes come from the plug-in point llama-cpp-python offers: ``Llama.generate`` calls its draft model
once per target pass after the prompt's (which samples the first token: ``prefill``), with the sequence
so far, so a counting wrapper around the draft model (:func:`counted`) gives each request's passes, the
tokens each emitted and the drafts each verified. ``llama-cpp-draft`` times one pass's parts for the speed
property on fresh objects of the same GGUFs (:func:`pass_components`).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from spectest.availability import missing
from spectest.e2e.isolated import IsolatedWithDraft, IsolatedWithPlain
from spectest.e2e.protocol import SEEDED
from spectest.e2e.tiny_pair import TeacherForcedLogits

K = 4
ORDER = ("top_k", "top_p", "min_p", "temperature")
CONTEXT = 512
F32 = 0  # GGML_TYPE_F32


def unavailable() -> str | None:
    return missing(
        "llama_cpp", "transformers", hint="llama-cpp-python: pip install -e '.[llamacpp]', in an environment of its own"
    )


def converter_folder() -> Path:
    """``vendor/llama.cpp`` of the installed llama-cpp-python's sdist (the converter, ``conversion/`` and
    ``gguf-py``), fetched once with pip into the cache."""
    from spectest.e2e.tiny_pair import cached, version

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


def counted(proposer: Any) -> Any:
    """``proposer`` (any ``LlamaDraftModel``) noting each call: the length of the sequence it drafts after
    and how many drafts ``Llama.generate`` keeps (it cuts them at the context's end). ``Llama.generate``
    calls its draft model once per target pass after the prompt's, so the calls are the passes: counted at
    the plug-in point llama-cpp-python offers, the engine's loop untouched."""
    from llama_cpp.llama_speculative import LlamaDraftModel

    class Counted(LlamaDraftModel):
        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []

        def __call__(self, input_ids, /, **kwargs):
            proposed = proposer(input_ids, **kwargs)
            self.calls.append((len(input_ids), min(len(proposed), CONTEXT - len(input_ids))))
            return proposed

    return Counted()


def passes_from_calls(calls: list[tuple[int, int]], prompt: int, emitted: int) -> tuple[list[int], list[int]]:
    """(tokens per pass, drafts per pass) of one request from its draft model's calls (sequence length,
    drafts kept). The prompt's pass samples the first token with no drafts (``prefill``); each call starts
    a pass that emits the tokens up to the next call's sequence, the last one up to the output's end. The
    last pass's last token ends the output, not a trial (see :func:`mlx_lm.passes_from_flags`): reported
    as that pass's bonus."""
    if emitted == 0:
        return [], []
    tokens, drafts = [1], [0]
    starts = [length - prompt for length, _ in calls] + [emitted]
    for i, (_, kept) in enumerate(calls):
        tokens.append(starts[i + 1] - starts[i])
        drafts.append(kept)
    if sum(tokens) != emitted or min(tokens) < 1:
        raise RuntimeError(
            f"llama.cpp's draft calls {calls} do not tile {emitted} tokens after a {prompt}-token prompt"
        )
    drafts[-1] = min(drafts[-1], tokens[-1] - 1)
    return tokens, drafts


def sampling(params: Any, row: int) -> dict[str, Any]:
    """``Llama.generate``'s sampling keywords for one request (greedy: ``temp=0``, filters off)."""
    temperature = float(params.temperature[row])
    sampled = temperature > 0
    return {
        "temp": temperature if sampled else 0.0,
        "top_k": int(params.top_k[row]) if sampled else 0,
        "top_p": float(params.top_p[row]) if sampled else 1.0,
        "min_p": float(params.min_p[row]) if sampled else 0.0,
        "repeat_penalty": 1.0,
    }


class LlamaCppEngine(TeacherForcedLogits):
    """The engine inside the child process."""

    def __init__(self, *, draft: str | None = "gguf", k: int = K, seed: int = 0) -> None:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from spectest.e2e import tiny_pair

        self.pair = tiny_pair.pair(seed)
        folders = tiny_pair.converted(self.pair, "gguf", "llama-cpp-python", to_gguf)
        self.vocab_size = tiny_pair.VOCAB
        self.teacher = tiny_pair.TeacherForcing(self.pair)
        self.k, self.draft = k, draft
        self.draft_gguf = folders / "draft" / "model.gguf"
        proposer = None  # counted: _run reads its calls through self.llm.draft_model
        if draft == "gguf":
            proposer = counted(gguf_draft(self.draft_gguf, k))
        elif draft == "prompt-lookup":
            proposer = counted(LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=k))
        self.target_gguf = folders / "target" / "model.gguf"
        self.llm = _llama(self.target_gguf, proposer)
        self._plain: Any = None if proposer else self.llm
        self.passes = self.tokens_per_pass = self.draft_lengths = None
        if self.llm.n_vocab() != self.vocab_size:
            raise RuntimeError(f"the GGUF holds {self.llm.n_vocab()} tokens, the pair {self.vocab_size}")

    def _run(self, llm: Any, prompts, params, max_new_tokens, seed) -> list[list[int]]:
        from spectest.e2e.cases import request_seed

        outputs, tokens_per_pass, draft_lengths = [], [], []
        proposer = llm.draft_model
        for row, prompt in enumerate(prompts):
            llm.set_seed(request_seed(params, row, seed))
            if proposer is not None:
                proposer.calls.clear()
            tokens = []
            for token in llm.generate(list(prompt), **sampling(params, row)):
                tokens.append(int(token))
                if len(tokens) == max_new_tokens:
                    break
            outputs.append(tokens)
            if proposer is not None:
                emitted, drafted = passes_from_calls(proposer.calls, len(prompt), len(tokens))
                tokens_per_pass.append(emitted)
                draft_lengths.append(drafted)
        if proposer is not None:
            self.tokens_per_pass, self.draft_lengths = tokens_per_pass, draft_lengths
            self.passes = [len(row) for row in tokens_per_pass]
        return outputs

    def generate(self, prompts, params, max_new_tokens, seed):
        return self._run(self.llm, prompts, params, max_new_tokens, seed)

    @property
    def spectest_components(self) -> Any:
        """One pass's parts for the speed property (:func:`pass_components`): the GGUF draft's only (a
        looked-up draft is not a model's to time, and has no distribution to predict passes from)."""
        if self.draft != "gguf":
            raise AttributeError("only llama-cpp-draft times its parts")
        return lambda context, params: pass_components(self, context, params)

    def plain_generate(self, prompts, params, max_new_tokens, seed):
        if self._plain is None:
            self._plain = _llama(self.target_gguf)
        return self._run(self._plain, prompts, params, max_new_tokens, seed)


def pass_components(engine: LlamaCppEngine, context: list[int], params: Any) -> dict[str, Any]:
    """One pass of ``Llama.generate`` with a draft model, part by part, on a fresh ``Llama`` of the same
    GGUF and settings and a fresh GGUF draft (the engine's own objects keep their caches for its requests):
    the draft's call (K greedy tokens after the context, as the loop calls it), the target's ``eval`` of
    K + 1 new positions on a cache of the context, the verification (sampling the K + 1 rows with the first
    request's sampler chain, as ``generate`` builds it, and comparing them with the drafts), and the target
    over one position with its sampling (a plain step less the loop's own work). Sampling reads the last
    ``eval``'s rows, so ``verify`` follows ``target``, as the harness times them; each part rolls the
    target's cache back as the loop does after a rejection. The verification samples all K + 1 rows, where
    the loop stops at the first mismatch: the model's pass is never cheaper than the engine's."""
    import numpy as np

    k = engine.k
    target, proposer = _llama(engine.target_gguf), gguf_draft(engine.draft_gguf, k)
    settings = sampling(params, 0)
    target._sampler = target._init_sampler(  # what generate() builds for a request, with its defaults
        **settings,
        typical_p=1.0,
        frequency_penalty=0.0,
        presence_penalty=0.0,
        tfs_z=1.0,
        mirostat_mode=0,
        mirostat_tau=5.0,
        mirostat_eta=0.1,
        penalize_nl=True,
        logits_processor=None,
        grammar=None,
    )
    target.eval(list(context))
    base = target.n_tokens
    chosen = np.random.default_rng(len(context)).integers(0, engine.vocab_size, k + 1).tolist()
    drafts = proposer(np.array([*context, chosen[0]], dtype=np.intc)).tolist()
    state = {"rows": 0}

    def rewind() -> None:
        target.n_tokens = base
        target._ctx.kv_cache_seq_rm(-1, base, -1)

    def drafting() -> None:
        proposer(np.array([*context, chosen[0]], dtype=np.intc))

    def target_pass() -> None:
        target.eval([chosen[0], *drafts])
        state["rows"] = len(drafts) + 1
        rewind()

    def verify() -> None:
        rows = state["rows"]
        if rows != len(drafts) + 1:
            raise RuntimeError("llama.cpp's verify part samples the rows of its target part: time target first")
        sampled = [target._sampler.sample(target._ctx, j - rows) for j in range(rows)]
        kept = 0
        for drafted, token in zip(drafts, sampled, strict=False):
            if drafted != token:
                break
            kept += 1

    def target_step() -> None:
        target.eval(chosen[:1])
        state["rows"] = 1
        target._sampler.sample(target._ctx, -1)
        rewind()

    return {"draft": drafting, "target": target_pass, "verify": verify, "target_step": target_step}


def build(**options: Any) -> LlamaCppEngine:
    return LlamaCppEngine(**options)


class LlamaCpp(IsolatedWithPlain):
    """The registered engine: the declarations, and the child that runs llama.cpp."""

    spectest_engine_capabilities = frozenset({SEEDED})
    spectest_filter_order = ORDER
    spectest_first_token = "prefill"  # the prompt's pass samples the first token; the draft model is called after it

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, f"{__name__}:build", options)

    @property
    def spectest_unavailable(self) -> str | None:
        return unavailable()


class LlamaCppWithDraftModel(LlamaCpp, IsolatedWithDraft):
    """A second GGUF drafting greedily: its logits (by teacher forcing) give the draft's point mass."""

    spectest_draft_sampling = "greedy"


LLAMA_CPP_DRAFT = LlamaCppWithDraftModel("llama-cpp-draft", draft="gguf")
LLAMA_CPP_PROMPT_LOOKUP = LlamaCpp("llama-cpp-prompt-lookup", draft="prompt-lookup")
LLAMA_CPP_OFF = LlamaCpp("llama-cpp-off", draft=None)  # the control: no draft model
