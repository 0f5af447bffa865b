"""The one seeded model pair every CPU engine runs, and a cache of its conversions to each engine's format.

The pair is :func:`~spectest.e2e.pair.build_pair` (a 2-layer Llama target and a
1-layer draft made of its first layer plus seeded noise), at the shapes every engine here takes: a
vocabulary of 320 (three specials, the 256 byte tokens, 61 characters) and two heads of size 32 (vLLM's
CPU attention wants 32, 64, 80 or more). Its tokenizer is a Llama-2 style byte-fallback BPE built
offline with ``tokenizers``: engines that insist on one (OpenVINO GenAI, llama.cpp's converter) get
one, and prompts are token ids anyway. Nothing is downloaded. The target's second layer is small
beside its first, so the draft (its first layer, embeddings and head, plus a little noise) is accepted
about three quarters of the time at temperature 1 (sum min(p, q) 0.76, entropy 3.3 nats).

Everything is written once into a cache folder (``SPECTEST_CACHE``, default ``~/.cache/spectest``),
keyed by the pair's seed and recipe version and by each converter's version, atomically (a folder is
written beside its final name and renamed), so parallel test workers and later runs reuse it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from spectest.speed.clock import one_torch_thread

VOCAB = 320
HEADS = 2
K = 4
EOS = 2  # "</s>": engines are told to ignore it, never to mask it
DRAFT_NOISE = 0.1
RECIPE = 1  # bump when the pair's recipe changes: a new cache key
CHARACTERS = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[: VOCAB - 259]


def cache_root() -> Path:
    return Path(os.environ.get("SPECTEST_CACHE") or Path.home() / ".cache" / "spectest")


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "none"


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    from filelock import FileLock  # torch's own dependency

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        yield


def cached(key: str, make: Callable[[Path], None]) -> Path:
    """The cache folder ``key``, made by ``make(folder)`` the first time (under a lock, atomically)."""
    final = cache_root() / key
    if final.exists():
        return final
    with _lock(final):
        if final.exists():
            return final
        scratch = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
        try:
            make(scratch)
            scratch.rename(final)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return final


@dataclass(frozen=True)
class PairDirs:
    """Hugging Face folders of the target and the draft (config, float32 weights, tokenizer)."""

    target: Path
    draft: Path
    seed: int

    @property
    def key(self) -> str:
        return self.target.parent.name


def tokenizer():
    """A Llama-2 style byte-fallback BPE over the pair's 320 ids (no merges: characters or bytes)."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab |= {f"<0x{b:02X}>": 3 + b for b in range(256)}
    vocab |= {c: 259 + i for i, c in enumerate(CHARACTERS)}
    model = models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    raw = Tokenizer(model)
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def pair(seed: int = 0) -> PairDirs:
    """The seeded pair's folders, built on first use."""
    key = f"pair-seed{seed}-recipe{RECIPE}"

    def make(folder: Path) -> None:
        from spectest.e2e.pair import build_pair

        target, draft = build_pair(vocab=VOCAB, seed=seed, k=K, heads=HEADS, eos_token_id=EOS)
        seeded_weights(target, draft, seed)
        words = tokenizer()
        from transformers import GenerationConfig

        for name, model in (("target", target), ("draft", draft)):
            model.config.eos_token_id = EOS
            model.config.bos_token_id = 1
            model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=EOS)  # no spectest defaults
            model.save_pretrained(folder / name, safe_serialization=True)
            words.save_pretrained(folder / name)

    root = cached(key, make)
    return PairDirs(root / "target", root / "draft", seed)


def eagle_head(pairs: PairDirs) -> Path:
    """A seeded EAGLE-1 head for the pair's target, in the layout vLLM's ``EagleLlamaForCausalLM`` loads
    (``{"method": "eagle", "model": this folder}``): the target's config at one layer, ``fc`` (hidden from
    [token embedding, target hidden state]) and that one decoder layer; no embeddings or head of its own, so
    vLLM shares the target's. ``fc`` passes the target's hidden state through and the layer is small and
    random, so the head proposes roughly the target's distribution one position back: it is accepted now
    and then, and every path of verification (accepted drafts, rejections, bonus tokens) is taken. Its
    proposals depend on the target's hidden states, so no checkpoint can teacher-force them: an engine
    with it has no ``draft_logits``."""
    key = f"{pairs.key}/eagle-head-recipe{RECIPE}"

    def make(folder: Path) -> None:
        import json

        import torch
        from safetensors.torch import save_file
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig.from_pretrained(pairs.target)
        config.num_hidden_layers = 1
        config.architectures = ["LlamaForCausalLM"]
        layer = LlamaForCausalLM(config).model.layers[0]
        hidden = config.hidden_size
        weights = {}
        for name, weight in sorted(layer.state_dict().items()):
            if name.startswith("input_layernorm"):  # EAGLE-1's first layer has none (vLLM replaces it by identity)
                continue
            generator = named_generator(pairs.seed, b"eagle:" + name.encode())
            value = torch.ones_like(weight) if "norm" in name else torch.randn(weight.shape, generator=generator) * 0.02
            weights[f"layers.0.{name}"] = value.float().contiguous()
        fc = torch.randn((hidden, 2 * hidden), generator=named_generator(pairs.seed, b"eagle:fc")) * 0.02
        fc[:, hidden:] += torch.eye(hidden)
        weights["fc.weight"] = fc.contiguous()
        folder.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    return cached(key, make)


def named_generator(seed: int, name: bytes):
    """A torch generator for one weight, seeded by the pair's seed and the weight's name: the pair does not
    depend on the order or the library that draws its weights."""
    import zlib

    import torch

    return torch.Generator().manual_seed(seed * 7919 + zlib.crc32(name))


def seeded_weights(target, draft, seed: int) -> None:
    """Every weight drawn here, by name, from generators seeded by the pair's seed: the pair does not
    depend on how the installed transformers initialises a model, so every engine's venv builds the same
    one. Norm weights 1; others N(0, 0.02^2), the head at a logit scale of 2.5; the draft is the target's
    first layer, embeddings and head plus DRAFT_NOISE of their scale in noise."""

    import torch

    from spectest.e2e.pair import LOGIT_SCALE

    hidden = target.config.hidden_size
    with torch.no_grad():
        for name, weight in sorted(target.state_dict().items()):
            generator = named_generator(seed, name.encode())
            if "norm" in name:
                weight.fill_(1.0)
            else:
                std = LOGIT_SCALE / hidden**0.5 if name.startswith("lm_head") else 0.08
                std = std / 4 if ".layers." in name and ".layers.0." not in name else std  # what the draft lacks
                weight.copy_(torch.randn(weight.shape, generator=generator) * std)
        draft.load_state_dict(target.state_dict(), strict=False)
        for name, weight in sorted(draft.state_dict().items()):
            generator = named_generator(seed, b"draft:" + name.encode())
            weight.add_(torch.randn(weight.shape, generator=generator) * DRAFT_NOISE * weight.std().clamp_min(1e-3))


def converted(pairs: PairDirs, engine: str, converter: str, convert: Callable[[Path, Path], None]) -> Path:
    """``convert(hf_folder, out_folder)`` of the target and the draft into ``engine``'s format, cached
    under the pair's key and ``converter``'s installed version; returns the folder holding
    ``target`` and ``draft``."""
    key = f"{pairs.key}/{engine}-{converter}-{version(converter)}"

    def make(folder: Path) -> None:
        for name in ("target", "draft"):
            convert(getattr(pairs, name), folder / name)

    return cached(key, make)


class TeacherForcing:
    """Raw logits of the pair's target or draft along given sequences, from its transformers checkpoint
    (float32; the harness's teacher forcing for an engine that cannot give full-vocabulary logits itself)."""

    def __init__(self, pairs: PairDirs) -> None:
        self.pairs = pairs
        self.models: dict[str, object] = {}
        # Loaded with the engine, not in its first call: importing transformers and loading a checkpoint
        # take seconds of start-up that would count as the calls' time (the draft is a 1-layer model).
        self._model("target")
        self._model("draft")

    def _model(self, which: str):
        if which not in self.models:
            import torch
            from transformers import AutoModelForCausalLM

            folder = self.pairs.target if which == "target" else self.pairs.draft
            self.models[which] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return self.models[which]

    def logits(self, which: str, sequences):
        import torch

        model = self._model(which)
        longest = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), longest), dtype=torch.int64)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        with one_torch_thread(), torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits.float()


class TeacherForcedLogits:
    """The engine protocol's ``target_logits`` / ``draft_logits`` from ``self.teacher``, for an
    engine whose own API gives no full-vocabulary logits (every CPU engine on this pair)."""

    teacher: TeacherForcing

    def target_logits(self, sequences):
        return self.teacher.logits("target", sequences)

    def draft_logits(self, sequences):
        return self.teacher.logits("draft", sequences)
