"""Real causal LMs from ``transformers`` through the decoding loops (randomly initialised tiny
GPT-2 configs: no downloads). Skipped when transformers is not installed."""

from __future__ import annotations

import pytest
import torch

from spectest.implementations.reference import verify
from spectest.protocol import Model
from spectest.sampling import make_generator
from spectest.speed.decoding import TransformersLM, plain_decode, speculative_decode

transformers = pytest.importorskip("transformers")
CPU = torch.device("cpu")


def tiny_gpt2(seed: int) -> TransformersLM:
    torch.manual_seed(seed)  # transformers initialises weights from torch's global RNG: seed it explicitly
    config = transformers.GPT2Config(vocab_size=16, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=0)
    return TransformersLM(transformers.GPT2LMHeadModel(config))


class Recorder:
    """A verifier that records what each pass hands it, then runs the reference."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def __call__(self, draft_token_ids, draft_probs, target_probs, *, generator):
        emitted = verify(draft_token_ids, draft_probs, target_probs, generator=generator)
        self.calls.append((draft_token_ids.clone(), draft_probs.clone(), target_probs.clone(), emitted.clone()))
        return emitted


def test_passes_hand_the_verifier_the_right_distributions():
    target, draft = tiny_gpt2(0), tiny_gpt2(1)
    recorder = Recorder()
    k = 3
    result = speculative_decode(
        target,
        draft,
        Model("recorder", recorder),
        batch=1,
        tokens=12,
        k=k,
        start=target.start_token,
        generator=make_generator(0),
        device=CPU,
    )
    history = [target.start_token]
    for drafts, draft_probs, target_probs, emitted in recorder.calls:
        prefix = torch.tensor([history + drafts[0].tolist()])
        assert torch.allclose(target_probs[0], target.forward(prefix)[0, -(k + 1) :], atol=1e-6)
        for i in range(k):
            assert torch.allclose(draft_probs[0, i], draft.forward(prefix[:, : len(history) + i])[0, -1], atol=1e-6)
        history += [t for t in emitted[0].tolist() if t != -1]
    assert result.tokens[0].tolist() == history[1:13]


def test_identical_draft_is_always_accepted_and_batches_need_a_window():
    target = tiny_gpt2(2)
    same = speculative_decode(
        target,
        target,
        Model("reference", verify),
        batch=1,
        tokens=20,
        k=4,
        start=target.start_token,
        generator=make_generator(1),
        device=CPU,
    )
    assert (same.tokens_per_pass == 5).all() and same.acceptance == 1.0
    plain = plain_decode(target, batch=1, tokens=8, start=target.start_token, generator=make_generator(2), device=CPU)
    assert plain.tokens.shape == (1, 8) and ((plain.tokens >= 0) & (plain.tokens < 16)).all()
    with pytest.raises(ValueError, match="decodes with batch 1"):
        plain_decode(target, batch=2, tokens=2, start=0, generator=make_generator(3), device=CPU)
