"""``--spec-engine`` values to engines (spectest.e2e.resolve): a bad name and a bad checkpoint are usage errors."""

from __future__ import annotations

import pytest

from spectest.e2e.protocol import call_generate
from spectest.sampling_params import SamplingParams


def test_a_bad_engine_name_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--spec-engine", "no_such_engine")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --spec-engine 'no_such_engine' is not a registered name (known: *"])


def test_checkpoints_load_from_directories_and_a_bad_one_is_a_usage_error(tmp_path):
    """``--spec-target DIR --spec-draft DIR``: a pair saved with ``save_pretrained`` loads and
    generates; a directory without a checkpoint is refused before any test runs, naming the option."""
    pytest.importorskip("transformers")
    from transformers import GenerationConfig

    from spectest.e2e.pair import build_pair
    from spectest.e2e.resolve import resolve_engine
    from spectest.resolve import ModelSpecError

    target, draft = build_pair(vocab=48, seed=5)
    for model, name in ((target, "big"), (draft, "small")):
        model.generation_config = GenerationConfig()  # as a user's checkpoint has it
        model.save_pretrained(tmp_path / name)
    engine = resolve_engine("transformers-assisted", target=str(tmp_path / "big"), draft=str(tmp_path / "small"))
    assert engine.vocab_size == 48
    rows = call_generate(engine, [[1, 2, 3]], SamplingParams.build(1, seed=[7]), 6, 0)
    assert len(rows[0]) == 6 and all(0 <= x < 48 for x in rows[0])
    with pytest.raises(ModelSpecError, match=r"--spec-draft .*nowhere.* is not a checkpoint directory"):
        resolve_engine("transformers-assisted", target=str(tmp_path / "big"), draft=str(tmp_path / "nowhere"))
