"""The acceptance profiler: exact identities, the text chain model, and agreement with real decoding."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from spectest.simulators import expected_passes, expected_tokens_iid, slot_acceptance, tokens_per_pass_along

from spectest.cases.toy_models import markov_pair
from spectest.cli import main
from spectest.profiler.acceptance import build_pair, profile_tokens
from spectest.resolve import resolve_model
from spectest.sampling import make_generator
from spectest.speed.decoding import CostedMarkovLM, plain_decode, speculative_decode

ALPHA = 1e-4


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Training and held-out text that exists on any machine: this package's own sources."""
    import spectest

    root = tmp_path_factory.mktemp("corpus")
    sources = sorted(p for p in __import__("pathlib").Path(spectest.__file__).parent.glob("*.py"))
    train = root / "train.py"
    train.write_bytes(b"".join(p.read_bytes() for p in sources[:-3]))
    held = root / "held.py"
    held.write_bytes(b"".join(p.read_bytes() for p in sources[-3:])[:3000])
    return train, held


def test_a_draft_equal_to_the_target_is_accepted_everywhere(corpus):
    train, held = corpus
    pair = build_pair("ngram:3", "ngram:3", train=[train])
    profile = profile_tokens(pair.target, pair.draft, list(held.read_bytes()), name="held", label="code")
    assert np.allclose(profile.acceptance, 1.0, atol=1e-12) and np.allclose(profile.realized, 1.0, atol=1e-12)
    assert expected_passes(profile.realized, 4) == pytest.approx(math.ceil(profile.tokens.size / 5))


def test_a_uniform_draft_is_accepted_with_the_sum_of_min_p_and_one_over_v(corpus):
    train, held = corpus
    pair = build_pair("ngram:3", "uniform", train=[train])
    tokens = list(held.read_bytes())
    profile = profile_tokens(pair.target, pair.draft, tokens, name="held", label="code")
    p = pair.target.next_probs(tokens)
    assert np.allclose(profile.acceptance, np.minimum(p, 1 / 256).sum(-1), atol=1e-12)


def test_models_without_a_shared_vocabulary_are_a_clear_error(corpus, capsys):
    train, held = corpus
    with pytest.raises(SystemExit) as info:
        main(["profile", "--target", "ngram:2", "--draft", "toy:far", "--train", str(train), "--text", str(held)])
    assert info.value.code == 2
    assert "do not share a vocabulary" in capsys.readouterr().err


def test_constant_acceptance_reduces_to_the_iid_formula():
    for k in (1, 4, 8):
        for a in (0.0, 0.3, 0.8, 1.0):
            length = 200_000
            tokens_per_pass = tokens_per_pass_along(np.full(length, a), k)
            closed = expected_tokens_iid(a, k)
            # Only the last pass can differ from the infinite text: at most one pass of K + 1 tokens.
            assert abs(length / tokens_per_pass - length / closed) <= 1.0 + 1e-9
            assert np.allclose(slot_acceptance(np.full(1000, a), k), a)


def test_predicted_tokens_per_pass_match_speculative_decoding():
    """Welch test at ALPHA: passes per sequence predicted from target-sampled texts (the exact
    conditional expectation given each text) against passes counted by the decode loop on the
    same pair. With 3000 sequences each side the standard error of the difference is about
    0.06 passes on ~34, so a 1% error in the predicted tokens per pass fails it."""
    vocab, length, k, n = 6, 48, 3, 3000
    target, draft = markov_pair(np.random.default_rng(5), vocab, "dirichlet", "far")
    target_lm = CostedMarkovLM(target.table, hidden=4, layers=1)
    draft_lm = CostedMarkovLM(draft.table, hidden=4, layers=1)
    device = torch.device("cpu")
    texts = plain_decode(target_lm, batch=n, tokens=length, start=vocab, generator=make_generator(1), device=device)
    pair = build_pair("toy:dirichlet", "toy:far", vocab=vocab, seed=5)
    predicted = np.array(
        [
            expected_passes(profile_tokens(pair.target, pair.draft, row.tolist(), name="s", label="s").realized, k)
            for row in texts.tokens
        ]
    )
    decoded = speculative_decode(
        target_lm,
        draft_lm,
        resolve_model("reference"),
        batch=n,
        tokens=length,
        k=k,
        start=vocab,
        generator=make_generator(2),
        device=device,
    )
    cumulative = decoded.tokens_per_pass.cumsum(dim=1)
    measured = ((cumulative < length).sum(dim=1) + 1).numpy()
    test = stats.ttest_ind(measured, predicted, equal_var=False)
    assert test.pvalue >= ALPHA, (
        f"expected {predicted.mean():.3f} passes per {length}-token sequence, decoding took {measured.mean():.3f} "
        f"(difference {measured.mean() - predicted.mean():+.3f}, Welch p={test.pvalue:.2g}, alpha {ALPHA})"
    )


def test_cli_reports_by_file_and_label_with_json_and_plot(corpus, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    train, held = corpus
    out, plot = tmp_path / "p.json", tmp_path / "p.png"
    code = main(
        [
            "profile",
            "--target",
            "ngram:4",
            "--draft",
            "ngram:2",
            "--train",
            str(train),
            "--text",
            f"code={held}",
            f"prose={train}",
            "--max-tokens",
            "2000",
            "--gamma",
            "3",
            "--cost-ratio",
            "0.1",
            "--json",
            str(out),
            "--plot",
            str(plot),
        ]
    )
    assert code == 0 and plot.stat().st_size > 0
    document = json.loads(out.read_text())
    assert document["schema"] == "spectest.profile/2" and {r["name"] for r in document["labels"]} == {"code", "prose"}
    row = document["files"][0]
    assert 0 < row["mean_acceptance"] < 1 and len(row["slot_acceptance"]) == 3 and 1 <= row["tokens_per_pass"] <= 4
    assert row["speedup"] == pytest.approx(row["tokens_per_pass"] / (3 * 0.1 + 1))
    assert "by label:" in capsys.readouterr().out


def test_temperature_changes_acceptance_and_greedy_is_argmax_agreement(corpus):
    from spectest.sampling_params import SamplingParams

    train, held = corpus
    pair = build_pair("ngram:4", "ngram:2", train=[train])
    tokens = list(held.read_bytes()[:800])
    greedy = profile_tokens(
        pair.target, pair.draft, tokens, name="h", label="h", params=SamplingParams.build(1, temperature=0.0)
    )
    agree = pair.target.next_probs(tokens).argmax(-1) == pair.draft.next_probs(tokens).argmax(-1)
    assert np.array_equal(greedy.acceptance, agree.astype(float))


def test_toy_models_profile_generated_text(capsys):
    assert (
        main(["profile", "--target", "toy:dirichlet", "--draft", "toy:close", "--generate", "500", "--json", "-"]) == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["files"][0]["tokens"] == 500 and document["files"][0]["mean_acceptance"] > 0.5


def save_tiny_lm(path, seed: int, alphabet_size: int = 256):
    """A randomly initialised GPT-2 and a byte-level tokenizer, saved locally (no downloads)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[:alphabet_size]
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token=alphabet[0])
    torch.manual_seed(seed)  # transformers initialises weights from torch's global RNG
    config = transformers.GPT2Config(vocab_size=len(alphabet), n_positions=512, n_embd=32, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_local_transformers_models_profile_text_and_a_vocabulary_mismatch_is_an_error(tmp_path, capsys):
    target = save_tiny_lm(tmp_path / "target", 0)
    draft = save_tiny_lm(tmp_path / "draft", 1)
    other = save_tiny_lm(tmp_path / "other", 2, alphabet_size=200)
    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 4)
    assert (
        main(["profile", "--target", f"hf:{target}", "--draft", f"hf:{draft}", "--text", str(text), "--json", "-"]) == 0
    )
    row = json.loads(capsys.readouterr().out)["files"][0]
    assert row["tokens"] == len(text.read_bytes()) and 0 < row["mean_acceptance"] < 1
    with pytest.raises(SystemExit):
        main(["profile", "--target", f"hf:{target}", "--draft", f"hf:{other}", "--text", str(text)])
    assert "do not share a vocabulary" in capsys.readouterr().err
