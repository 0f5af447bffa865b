"""Inputs as engines pass them (half precision, layouts): the harness's definitions, tested on
their own; the properties that use them run through the plugin in tests/test_meta.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectest.cases.layouts import LAYOUTS, lay_out
from spectest.cases.tensors import as_given
from spectest.implementations.reference import verify
from spectest.statistics.chisquare import Group, chisquare_groups

LEVEL = 1e-6


def test_half_precision_target_is_the_normalised_given_values():
    p = np.array([[0.40, 0.35, 0.25 - 1e-9, 1e-9]])
    tensor, exact = as_given(p, device=torch.device("cpu"), dtype="bfloat16")
    given = tensor.double().numpy()
    np.testing.assert_allclose(exact, given / given.sum(), rtol=0, atol=0)
    assert np.abs(exact - p).max() > 3e-4  # bf16 rounding moved the distribution (0.35 -> 0.3496)
    _, fp16 = as_given(p, device=torch.device("cpu"), dtype="float16")
    assert fp16[0, 3] == 0.0  # below fp16's smallest subnormal: the token becomes impossible
    _, same = as_given(p, device=torch.device("cpu"), dtype="float32")
    assert same is p


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reference_follows_the_half_precision_definition(dtype):
    """The reference on half-precision inputs against the target computed in float64 from the
    given values: per position, chi-square at 1e-6, and never a token rounded to zero."""
    rng = np.random.default_rng(4)
    v, k, n = 6, 2, 200_000
    p = rng.dirichlet(np.ones(v) * 0.7, size=k + 1)
    p[:, -1] = 2e-8  # rounds to 0 in fp16
    p /= p.sum(axis=1, keepdims=True)
    q = rng.dirichlet(np.ones(v), size=k)
    target, target_exact = as_given(p, device=torch.device("cpu"), dtype=dtype)
    draft, draft_exact = as_given(q, device=torch.device("cpu"), dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    drafts = torch.multinomial(torch.tensor(draft_exact), n, replacement=True, generator=gen).T
    out = verify(drafts, draft.expand(n, k, v), target.expand(n, k + 1, v), generator=gen).numpy()
    reached = np.ones(n, dtype=bool)
    for position in range(k + 1):
        tokens = out[reached, position]
        counts = np.bincount(tokens, minlength=v)
        assert not (counts[target_exact[position] == 0]).any(), "a token of given probability 0 came out"
        fit = chisquare_groups(f"{dtype} position {position}", [Group(counts, target_exact[position])], alpha=LEVEL)
        assert fit.p_value > LEVEL / (k + 1), fit.summary()
        if position < k:
            reached &= out[:, position] == drafts[:, position].numpy()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_keep_the_values_and_the_reference_ignores_strides(layout):
    rng = np.random.default_rng(2)
    b, k, v = 7, 3, 130
    p = torch.tensor(rng.dirichlet(np.ones(v), size=(b, k + 1)), dtype=torch.float32)
    q = torch.tensor(rng.dirichlet(np.ones(v), size=(b, k)), dtype=torch.float32)
    ids = torch.multinomial(q.view(-1, v), 1).view(b, k)
    views = [lay_out(t, layout) for t in (ids, q, p)]
    for original, view in zip((ids, q, p), views, strict=True):
        assert torch.equal(original, view)
        assert view.is_contiguous() == (layout == "contiguous")
        # Every strided layout starts inside its buffer: a kernel that drops the offset reads padding.
        assert (view.storage_offset() > 0) == (layout != "contiguous")
    contiguous = verify(ids, q, p, generator=torch.Generator().manual_seed(5))
    strided = verify(*views, generator=torch.Generator().manual_seed(5))
    assert torch.equal(contiguous, strided)


def test_every_layout_dtype_and_padding_form_is_an_explicit_case_of_every_run():
    """Coverage that does not depend on what Hypothesis draws: each strided layout, each declared dtype
    and each ragged padding scheme is an explicit case (a layout bug fails every run, not one in three)."""
    from types import SimpleNamespace

    from spectest.properties.test_exactness import layout_cases, ragged_explicit

    from spectest.cases.layouts import STRIDED_LAYOUTS
    from spectest.cases.ragged import PADDING_IDS, PADDING_ROWS
    from spectest.protocol import STRIDED

    dtypes = ("float32", "float64", "bfloat16", "float16")
    spec = SimpleNamespace(model=SimpleNamespace(capabilities=frozenset({STRIDED}), dtypes=dtypes))
    cases = layout_cases(spec)
    assert {c.layout for c in cases} == set(STRIDED_LAYOUTS)
    assert {c.dtype for c in cases} == set(dtypes)
    ragged = ragged_explicit(spec)
    assert {c.padding_ids for c in ragged} == set(PADDING_IDS)
    assert {c.draft_padding for c in ragged} == {c.target_padding for c in ragged} == set(PADDING_ROWS)
    assert {c.chain.dtype for c in ragged} == set(dtypes)
    contiguous_only = SimpleNamespace(model=SimpleNamespace(capabilities=frozenset(), dtypes=("float32",)))
    assert layout_cases(contiguous_only) == []  # their layouts would all be contiguous
