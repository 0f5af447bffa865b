"""reference-compiled (spectest.implementations.compiled): the reference's chain compiled whole by torch.compile.
Held token for token to the eager reference where it compiles (rejected rows, bonus rows, a short last block, ragged
rows, float32 and float64), a residual that rounds to nothing and every other input taken by the reference's own
passes on the same uniforms; a compiler that fails leaves the reference, said once. The suite at the default budget
runs on it in the slow tier (tests/test_meta.py)."""

from __future__ import annotations

import pytest
import torch

from spectest.availability import compiler_missing
from spectest.sampling import make_generator

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))


def long_rows_case(dtype: torch.dtype, vocab: int, *, empty_residual: bool):
    """(ids, q, p, lengths): rows rejected at every position, rows that take the bonus (q = p), ragged rows, most of
    some rows' mass in the short last block, at ``vocab`` cells; with ``empty_residual``, a row rejected where p = q
    (its residual is empty: it is drawn from p)."""
    generator = make_generator(23, "cpu")
    batch, k = 12, 3
    p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(dtype)
    q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(dtype)
    ids = torch.randint(0, vocab, (batch, k), generator=generator)
    q[0::4] = p[0::4, :k]  # every draft accepted: bonus rows
    if empty_residual:
        ids[1, 0] = 0
        p[1, 0, 0] = q[1, 0, 0] = 0  # rejected at 0 (q = p = 0 there) with p = q: the residual is empty
        q[1, 0] = p[1, 0]
    p[2::4, :, -20:] *= 1e4  # most of these rows' mass in the short last block
    lengths = torch.tensor([3, 3, 2, 3, 0, 3, 1, 3, 3, 2, 3, 3])
    return ids, q, p, lengths


@pytest.fixture
def calls(monkeypatch):
    """The names of the functions compiled, and whether each compiled call's result was handed back (False: the
    reference's passes served it)."""
    from spectest.implementations import compiled

    seen: dict[str, list] = {"compiled": [], "served": []}
    compile_once, run = compiled.compiled, compiled.compiled_chain

    def spy(*args):
        emitted = run(*args)
        seen["served"].append(emitted is not None)
        return emitted

    monkeypatch.setattr(compiled, "compiled", lambda fn: seen["compiled"].append(fn.__name__) or compile_once(fn))
    monkeypatch.setattr(compiled, "compiled_chain", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ragged", [False, True])
def test_the_compiled_chain_draws_what_the_reference_draws(calls, dtype, ragged):
    from spectest.implementations import compiled, reference

    vocab = compiled.FUSED_FROM + 300  # a short last block of 44 cells
    ids, q, p, lengths = long_rows_case(dtype, vocab, empty_residual=False)
    lengths = lengths if ragged else None
    for seed in range(3):
        want = reference.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        got = compiled.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        assert torch.equal(got, want), (seed, got, want)
    assert calls["compiled"] == ["chain"] * 3 and calls["served"] == [True] * 3, calls
    assert compiled.failed is None
    bonus = want[[0, 8], 3] if not ragged else want[8, 3:]
    assert bool((bonus >= 0).all()), "the rows with q = p and three drafts take the bonus"
    assert int((want[:, 0] >= 0).sum()) >= 10 and bool((want[1:4, 1:] == -1).any()), "some rows are rejected early"


def test_an_empty_residual_is_drawn_from_p_by_the_references_passes(calls):
    from spectest.implementations import compiled, reference

    ids, q, p, lengths = long_rows_case(torch.float32, compiled.FUSED_FROM + 300, empty_residual=True)
    for seed in range(3):
        want = reference.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        got = compiled.verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths)
        assert torch.equal(got, want), (seed, got, want)
        assert p[1, 0, int(got[1, 0])] > 0, "row 1's token is drawn from p"
    assert calls["served"] == [False] * 3, calls


def test_other_inputs_are_the_references(monkeypatch):
    """Short rows, half-precision rows, a layout whose first two dimensions do not merge, one row, one draft: the
    reference's own, nothing compiled."""
    from spectest.implementations import compiled, reference

    monkeypatch.setattr(compiled, "compiled", lambda fn: pytest.fail(f"{fn.__name__} compiled"))
    ids, q, p, lengths = long_rows_case(torch.float32, compiled.FUSED_FROM + 300, empty_residual=False)
    position_major = p.transpose(0, 1).contiguous().transpose(0, 1), q.transpose(0, 1).contiguous().transpose(0, 1)
    cases = [
        (ids, q.bfloat16(), p.bfloat16(), lengths),
        (ids, position_major[1], position_major[0], lengths),
        long_rows_case(torch.float32, 300, empty_residual=False),
        (ids[:1], q[:1], p[:1], lengths[:1]),
        (ids[:, :1], q[:, :1], p[:, :2], None),
    ]
    for ids_, q_, p_, lengths_ in cases:
        want = reference.verify(ids_, q_, p_, generator=make_generator(4, "cpu"), num_draft_tokens=lengths_)
        got = compiled.verify(ids_, q_, p_, generator=make_generator(4, "cpu"), num_draft_tokens=lengths_)
        assert torch.equal(got, want)


def test_a_compiler_that_fails_leaves_the_reference_and_says_so(monkeypatch):
    from spectest.implementations import compiled, reference

    def broken(fn):
        def call(*args):
            raise RuntimeError("InductorError: no compiler today")

        return call

    monkeypatch.setattr(compiled, "compiled", broken)
    monkeypatch.setattr(compiled, "failed", None)
    ids, q, p, lengths = long_rows_case(torch.float32, compiled.FUSED_FROM + 300, empty_residual=False)
    with pytest.warns(RuntimeWarning, match="torch.compile failed, the reference serves: RuntimeError"):
        got = compiled.verify(ids, q, p, generator=make_generator(6, "cpu"), num_draft_tokens=lengths)
    assert torch.equal(got, reference.verify(ids, q, p, generator=make_generator(6, "cpu"), num_draft_tokens=lengths))
    assert "no compiler today" in compiled.failed
    monkeypatch.setattr(compiled, "compiled", lambda fn: pytest.fail("compiled again after a failure"))
    compiled.verify(ids, q, p, generator=make_generator(7, "cpu"), num_draft_tokens=lengths)


@pytest.mark.parametrize("compile_it", [False, True])
@pytest.mark.parametrize("top", [1 - 2.0**-53, 1.0])
def test_a_search_past_the_last_cells_keeps_to_the_vocabulary(compile_it, top):
    """Uniforms a rounding below 1: each row's search lands at its last block's end, where the block's float32 sum and
    its cells' float64 running sum part by rounding, and about half the rows overshoot (the search is clamped to the
    last cell with weight); at 1 itself (a rounding of a product can reach it) the block search overshoots too. The
    short last block's cells past V are read as its last cell and weighted zero, so no token is past V or of zero
    weight; run eagerly, the chain is the reference's token for token."""
    from spectest.implementations import compiled
    from spectest.implementations.reference import ExtraToken, merged, verify_at

    vocab = compiled.FUSED_FROM + 300
    ids, q, p, lengths = long_rows_case(torch.float32, vocab, empty_residual=False)
    p[:, :, -20:] *= 1e4  # every row's mass mostly in the short last block
    q[:, :, -20:] = p[:, :3, -20:] / 2
    batch, k = ids.shape
    for seed in range(4):
        u = torch.rand((batch, k), generator=make_generator(seed, "cpu"))
        v = torch.full((batch,), top, dtype=torch.float64)
        run = compiled.compiled(compiled.chain) if compile_it else compiled.chain
        got, empty = run(ids, merged(q), merged(p), u, v, lengths)
        assert not bool(empty)
        n = (got >= 0).sum(dim=1) - 1
        extra = got[torch.arange(batch), n]
        assert bool((extra < vocab).all()), got
        at = p[torch.arange(batch), n, extra]
        assert bool((at > 0).all()), (got, at)
        if not compile_it:
            want = verify_at(ids, q, p, u, ExtraToken(v), lengths=lengths)
            assert torch.equal(got, want), (got, want)
