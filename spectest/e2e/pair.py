"""The seeded Llama pair in transformers, built from configs (nothing is downloaded): a target and a 1-layer
draft made of its first layer, embeddings and head, the generation config that adds nothing a request does not
ask for, a user's own checkpoints loaded the same way, and raw logits along given sequences (teacher forcing).

Shared by transformers' own loops (:mod:`spectest.e2e.engines.transformers_loops`), vLLM on a GPU
(:mod:`spectest.e2e.engines.vllm_gpu`) and the tiny pair every CPU engine runs (:mod:`spectest.e2e.tiny_pair`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

VOCAB = 256
K = 4  # drafts per pass
LOGIT_SCALE = 2.5  # lm_head weights ~ N(0, (scale / sqrt(hidden))^2): logits of std about 2.5


def build_pair(
    *,
    vocab: int = VOCAB,
    seed: int = 0,
    draft_noise: float = 0.0,
    k: int = K,
    target_layers: int = 2,
    heads: int = 4,
    eos_token_id: int | None = None,
) -> tuple[Any, Any]:
    """A seeded Llama target of ``target_layers`` layers and a 1-layer draft sharing its first layer,
    embeddings and head, with ``draft_noise`` times their scale of seeded noise on every draft weight;
    hidden size 64 over ``heads`` heads (2 gives the head size 32 vLLM's CPU attention wants)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def config(layers: int) -> Any:
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=512,
            bos_token_id=None,
            eos_token_id=eos_token_id,
            pad_token_id=None,
            tie_word_embeddings=False,
        )

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config(target_layers)).eval()
        target.lm_head.weight.normal_(0.0, LOGIT_SCALE / target.config.hidden_size**0.5)
        draft = LlamaForCausalLM(config(1)).eval()
        draft.load_state_dict(target.state_dict(), strict=False)  # the target's first layer, embeddings, head
        if draft_noise:
            for weight in draft.parameters():
                weight.add_(torch.randn_like(weight) * draft_noise * weight.std().clamp_min(1e-3))
    neutral(target, k)
    neutral(draft, k)
    return target, draft


def neutral(model: Any, k: int) -> None:
    """A generation config that adds nothing the request does not ask for: no EOS, no default top-k
    of 50, and for a draft a constant K with no early stop on its own confidence."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        eos_token_id=None,
        pad_token_id=None,
        bos_token_id=None,
        do_sample=False,
        top_k=0,
        num_assistant_tokens=k,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
    )


def load_checkpoint(path: str, k: int) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    model.config.eos_token_id = None
    neutral(model, k)
    return model


def teacher_forced(model: Any, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Raw logits [N, L, V] of ``model`` at every position; sequences right-padded with id 0 (causal: the
    padding never reaches an earlier position)."""
    longest = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), longest), dtype=torch.int64)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.int64)
    with torch.no_grad():
        return model(input_ids=ids).logits.float()
