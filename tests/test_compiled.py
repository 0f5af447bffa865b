"""reference-compiled (spectest.implementations.compiled): the reference's chain with its long CPU rows' block sums
from one loop compiled by torch.compile. Held token for token to the eager reference where it fuses (rejected rows,
bonus rows, a residual that rounds to nothing, a short last block, ragged rows, float32 and float64), and shown to
take its own path there and the reference's elsewhere; a compiler that fails leaves the reference's passes, said
once. The suite at the default budget runs on it in the slow tier (tests/test_meta.py)."""

from __future__ import annotations

import pytest
import torch

from spectest.availability import compiler_missing
from spectest.sampling import make_generator

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))


def long_rows_case(dtype: torch.dtype, vocab: int):
    """(ids, q, p, lengths): rows rejected at every position, rows that take the bonus (q = p), a row rejected where
    p = q (its residual is empty: the fallback to p), ragged rows, at ``vocab`` cells."""
    generator = make_generator(23, "cpu")
    batch, k = 12, 3
    p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(dtype)
    q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(dtype)
    ids = torch.randint(0, vocab, (batch, k), generator=generator)
    q[0::4] = p[0::4, :k]  # every draft accepted: bonus rows
    ids[1, 0] = 0
    p[1, 0, 0] = q[1, 0, 0] = 0  # rejected at 0 (q = p = 0 there) with p = q: the residual is empty
    q[1, 0] = p[1, 0]
    p[2::4, :, -20:] *= 1e4  # most of these rows' mass in the short last block
    lengths = torch.tensor([3, 3, 2, 3, 0, 3, 1, 3, 3, 2, 3, 3])
    return ids, q, p, lengths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_reference_fuses_long_rows_and_draws_what_the_reference_draws(monkeypatch, dtype):
    from spectest.implementations import compiled, reference

    vocab = compiled.FUSED_FROM + 300  # a short last block of 44 cells
    ids, q, p, lengths = long_rows_case(dtype, vocab)
    fused = []
    compile_once = compiled.compiled

    def spy(fn):
        fused.append(fn.__name__)
        return compile_once(fn)

    monkeypatch.setattr(compiled, "compiled", spy)
    for seed in range(3):
        want = reference.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        got = compiled.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        assert torch.equal(got, want), (seed, got, want)
    assert "residual_and_bonus_block_sums" in fused, fused
    assert compiled.FusedChain.failed is None
    assert bool((want[[0, 8], 3] >= 0).all()), "the rows with q = p and three drafts take the bonus"


def test_rows_of_a_kind_are_fused_two_or_more_at_a_time(monkeypatch):
    """No bonus rows: the residuals alone are fused. One bonus row or one rejected row: the reference's passes, as a
    compiled function would specialise for one row (a compile of its own)."""
    from spectest.implementations import compiled, reference

    fused = []
    compile_once = compiled.compiled
    monkeypatch.setattr(compiled, "compiled", lambda fn: fused.append(fn.__name__) or compile_once(fn))
    ids, q, p, _ = long_rows_case(torch.float32, compiled.FUSED_FROM + 300)
    q[:, 0, 5], p[:, 0, 5] = 1.0, 0.0
    ids[:, 0] = 5  # token 5 is never accepted at the first draft: every row rejects there
    every, one_bonus, one_rejected = torch.tensor([3] * 12), torch.tensor([3] * 11 + [0]), torch.tensor([0] * 11 + [3])
    for lengths, expected in ((every, ["residual_block_sums"]), (one_bonus, []), (one_rejected, [])):
        fused.clear()
        want = reference.verify(ids, q, p, generator=make_generator(8, "cpu"), num_draft_tokens=lengths)
        got = compiled.verify(ids, q, p, generator=make_generator(8, "cpu"), num_draft_tokens=lengths)
        assert torch.equal(got, want) and fused == expected, (lengths, fused)


def test_the_compiled_reference_builds_other_rows_as_the_reference_does(monkeypatch):
    """Short rows, half-precision rows and a layout whose first two dimensions do not merge are the reference's."""
    from spectest.implementations import compiled, reference

    monkeypatch.setattr(compiled, "compiled", lambda fn: pytest.fail(f"{fn.__name__} compiled"))
    ids, q, p, lengths = long_rows_case(torch.float32, compiled.FUSED_FROM + 300)
    position_major = p.transpose(0, 1).contiguous().transpose(0, 1), q.transpose(0, 1).contiguous().transpose(0, 1)
    short = long_rows_case(torch.float32, 300)
    cases = [(ids, q.bfloat16(), p.bfloat16(), lengths), (ids, position_major[1], position_major[0], lengths), short]
    for ids_, q_, p_, lengths_ in cases:
        want = reference.verify(ids_, q_, p_, generator=make_generator(4, "cpu"), num_draft_tokens=lengths_)
        got = compiled.verify(ids_, q_, p_, generator=make_generator(4, "cpu"), num_draft_tokens=lengths_)
        assert torch.equal(got, want)


def test_a_compiler_that_fails_leaves_the_references_passes_and_says_so(monkeypatch):
    from spectest.implementations import compiled, reference

    def broken(fn):
        def call(*args):
            raise RuntimeError("InductorError: no compiler today")

        return call

    monkeypatch.setattr(compiled, "compiled", broken)
    monkeypatch.setattr(compiled.FusedChain, "failed", None)
    ids, q, p, lengths = long_rows_case(torch.float32, compiled.FUSED_FROM + 300)
    with pytest.warns(RuntimeWarning, match="torch.compile failed, its rows are built eagerly: RuntimeError"):
        got = compiled.verify(ids, q, p, generator=make_generator(6, "cpu"), num_draft_tokens=lengths)
    assert torch.equal(got, reference.verify(ids, q, p, generator=make_generator(6, "cpu"), num_draft_tokens=lengths))
    assert "no compiler today" in compiled.FusedChain.failed
