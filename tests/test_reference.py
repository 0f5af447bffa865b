"""The reference sampler and the sampling helper: exact rules, dtypes, devices, no zero-probability draws."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spectest import strategies as sst
from spectest.cases.tensors import draw_drafts, to_tensor
from spectest.implementations.reference import verify
from spectest.protocol import Model, call_verify
from spectest.sampling import make_generator, sample_categorical

REFERENCE = Model("reference", verify)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2**32), st.integers(2, 300), st.floats(0, 0.9))
def test_sample_categorical_never_draws_zero_weight(seed, vocab, zero_fraction):
    rng = np.random.default_rng(seed)
    weights = rng.random((64, vocab))
    weights[rng.random((64, vocab)) < zero_fraction] = 0
    weights[:, rng.integers(vocab)] = 1e-30
    draws = sample_categorical(torch.as_tensor(weights), make_generator(seed))
    assert (torch.as_tensor(weights).gather(1, draws.unsqueeze(1)) > 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=15, deadline=None)
@given(
    case=sst.chain_cases(batch=st.integers(1, 96), k=sst.draft_lengths(max_k=16), vocab=sst.vocab_sizes(max_size=4097))
)
def test_reference_obeys_the_contract(device, dtype, case):
    target_np, draft_np = sst.build_chain(case)
    dev = torch.device(device)
    target, draft = to_tensor(target_np, device=dev, dtype=dtype), to_tensor(draft_np, device=dev, dtype=dtype)
    drafts = draw_drafts(draft, make_generator(case.seed, dev))
    emitted = call_verify(REFERENCE, drafts, draft, target, make_generator(case.seed + 1, dev))
    assert emitted.shape == (case.batch, case.k + 1)
    n = (emitted != -1).sum(1)
    rows = torch.arange(case.batch, device=dev)
    last = emitted[rows, n - 1]
    assert (target[rows, n - 1, last] > 0).all(), "the extra token must have target probability > 0"


def test_reference_accepts_equal_probabilities_with_certainty():
    gen = make_generator(0)
    q = torch.rand((256, 8, 50), generator=gen).softmax(-1)
    target = torch.cat([q, q[:, :1]], dim=1)
    drafts = draw_drafts(q, gen)
    emitted = verify(drafts, q, target, generator=gen)
    assert (emitted[:, :8] == drafts).all()


def test_reference_matches_hand_computed_acceptance():
    """p(d)/q(d) = 0.25: the acceptance rate over 40k rows lies in a 1e-6 binomial interval."""
    n = 40_000
    q = torch.tensor([[[0.8, 0.2]]]).expand(n, 1, 2).contiguous()
    p = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]]).expand(n, 2, 2).contiguous()
    emitted = verify(torch.zeros((n, 1), dtype=torch.int64), q, p, generator=make_generator(3))
    accepted = int(((emitted != -1).sum(1) == 2).sum())
    from scipy.stats import binomtest

    assert binomtest(accepted, n, 0.25).pvalue > 1e-6
    # On rejection the residual max(0, p - q) = [0, 0.6] forces token 1.
    assert (emitted[(emitted != -1).sum(1) == 1, 0] == 1).all()


@pytest.mark.parametrize("vocab", [2, 5, 255, 256, 257, 1000, 32000, 128256])
def test_blocked_inverse_cdf_lands_on_the_cell_whose_step_holds_the_uniform(vocab):
    """Exact: a uniform in the middle of cell i's CDF step must return i, zero cells included in
    the rows; and the largest uniform never returns a zero-weight cell."""
    from spectest.sampling import inverse_cdf_blocked

    gen = torch.Generator().manual_seed(vocab)
    rows = 64
    weights = torch.rand((rows, vocab), generator=gen)
    weights[torch.rand((rows, vocab), generator=gen) < 0.5] = 0
    weights[:, 0] += (weights.sum(-1) == 0).float()
    cdf = weights.double().cumsum(-1)
    cell = torch.multinomial((weights > 0).float(), 1, generator=gen).squeeze(1)
    low = torch.where(cell > 0, cdf.gather(1, (cell - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    high = cdf.gather(1, cell.unsqueeze(1)).squeeze(1)
    assert torch.equal(inverse_cdf_blocked(weights, (low + high) / 2 / cdf[:, -1]), cell)
    top = inverse_cdf_blocked(weights, torch.full((rows,), 1 - 2**-53, dtype=torch.float64))
    assert bool((weights.gather(1, top.unsqueeze(1)) > 0).all())


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    dtypes=st.sampled_from([("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")]),
    ragged=st.booleans(),
    overlap=st.floats(0.0, 1.0),
)
def test_half_sums_of_only_the_reached_rows_give_the_output_of_every_rows_sums(seed, dtypes, ragged, overlap):
    """The reference sums half rows only where a verification reads them (position by position, the rows
    still accepting, then the bonus rows); its output is token for token what summing every row gives, for
    any acceptance (``overlap``: how much of q is p), ragged rows, rows of zeros, unnormalised rows and a float32
    side."""
    from spectest.implementations import reference

    rng = np.random.default_rng(seed)
    batch, k, vocab = int(rng.integers(1, 9)), int(rng.integers(1, 6)), 64
    target = rng.dirichlet(np.full(vocab, 0.5), size=(batch, k + 1))
    draft = overlap * target[:, :k] + (1 - overlap) * rng.dirichlet(np.full(vocab, 0.5), size=(batch, k))
    draft[rng.random((batch, k)) < 0.1] = 0.0  # rows of zeros (an engine's padding) sum to the smallest normal
    # Rows far from summing to one: a sum taken at the wrong row, or left at 1, changes what is accepted.
    target, draft = target * rng.uniform(0.2, 5, (batch, k + 1, 1)), draft * rng.uniform(0.2, 5, (batch, k, 1))
    q, p = to_tensor(draft, device="cpu", dtype=dtypes[0]), to_tensor(target, device="cpu", dtype=dtypes[1])
    ids = draw_drafts(to_tensor(draft + 1e-9, device="cpu", dtype="float64"), make_generator(seed, "cpu"))
    lengths = torch.as_tensor(rng.integers(0, k + 1, size=batch)) if ragged else None
    if lengths is not None:
        ids = torch.where(torch.arange(k) < lengths.unsqueeze(1), ids, -1)
    outputs = []
    for every_row in (1 << 62, 0):  # every row summed; only the reached rows (at any size)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reference, "EVERY_ROW", every_row)
            outputs.append(verify(ids, q, p, generator=make_generator(seed, "cpu"), num_draft_tokens=lengths))
    assert torch.equal(*outputs), (outputs, lengths)


def test_summing_only_reached_rows_is_what_the_reference_does_at_large_vocabularies(monkeypatch):
    """At a large vocabulary the reference takes the reached rows' path (so the test above holds what it runs),
    and sums fewer rows than every one when drafts are rejected."""
    from spectest.implementations import reference

    summed = []
    original = reference.sums_at
    monkeypatch.setattr(
        reference, "sums_at", lambda probs, rows, at: summed.append(rows.numel()) or original(probs, rows, at)
    )
    batch, k, vocab = 8, 4, 32000
    generator = make_generator(0, "cpu")
    p = torch.rand((batch, k + 1, vocab), generator=generator).bfloat16()
    q = torch.rand((batch, k, vocab), generator=generator).bfloat16()
    ids = torch.randint(0, vocab, (batch, k), generator=generator)
    verify(ids, q, p, generator=generator)
    assert summed and sum(summed) < batch * 2 * k, summed


def test_numpy_descending_values_are_torch_sorts():
    """The top-p sort's values on a CPU (numpy's sort) are torch's descending sort, ties, zeros and strided
    rows included."""
    from spectest.sampling_params import descending

    generator = make_generator(3, "cpu")
    values = torch.rand((4, 3, 1000), generator=generator)
    values[0, 0, :500] = 0.25  # ties
    values[1, 1] = 0.0
    for probs in (values, values.double(), values.transpose(0, 1), values[..., ::2]):
        assert torch.equal(descending(probs), probs.sort(dim=-1, descending=True).values)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_reused_working_rows_give_what_fresh_rows_give(monkeypatch, dtype):
    """The reference draws extra tokens a few rows at a time into rows it reuses from call to call (a CPU's fresh
    rows are page-faulted on first touch): token for token what drawing every row at once into fresh rows gives,
    whatever the rows held before (NaN here), for chunks of every size, growing and shrinking shapes, and ragged
    rows."""
    from spectest.implementations import reference
    from spectest.sampling import inverse_cdf_blocked

    monkeypatch.setattr(reference, "EVERY_ROW", 0)  # half rows summed where reached: their own reused rows
    generator = make_generator(5, "cpu")
    for batch, k, vocab, chunk_rows in [(9, 3, 700, 2), (4, 5, 1500, 3), (17, 2, 300, 5), (3, 4, 5000, 1)]:
        monkeypatch.setattr(reference, "CHUNK_BYTES", chunk_rows * vocab * 4)
        for room in reference.SCRATCH.rooms.values():
            room.fill_(float("nan") if room.is_floating_point() else -1)
        p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
        q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
        ids = torch.randint(0, vocab, (batch, k), generator=generator)
        lengths = torch.randint(0, k + 1, (batch,), generator=generator)
        u = torch.rand((batch, k), generator=generator)
        v = torch.rand((batch,), generator=generator, dtype=torch.float64)
        scales = reference.reached_row_sums(ids, q, p, u, lengths)
        reused = reference.verify_at(ids, q, p, u, reference.ExtraToken(v), lengths=lengths, scales=scales)
        fresh = reference.verify_at(
            ids, q, p, u, lambda weights, v=v: inverse_cdf_blocked(weights, v), lengths=lengths, scales=scales
        )
        assert torch.equal(reused, fresh), (batch, k, vocab, reused, fresh)
        assert reference.SCRATCH.rooms, "the chunked path reuses rows"


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_long_rows_give_what_gathered_rows_give(monkeypatch, dtype):
    """Long rows are built where they lie (a run of rows a view where they can be) and, across chunks, drawn from their
    block sums with the chosen block read again from p and q: token for token what gathering every chunk's rows and
    drawing from them as built gives, in every layout (a position-major one, whose rows do not lie in batch order,
    included), with a short last block, ragged rows, rows whose residual rounds to nothing and bonus rows."""
    from spectest.cases.layouts import LAYOUTS, lay_out
    from spectest.implementations import reference

    generator = make_generator(13, "cpu")
    batch, k, vocab = 9, 3, reference.ROW_BY_ROW + 300  # a short last block of 44 cells; pairs and rows alike
    monkeypatch.setattr(reference, "CHUNK_BYTES", 3 * vocab * 4)  # three chunks
    p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
    q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
    ids = torch.randint(0, vocab, (batch, k), generator=generator)
    p[2::3, :, -20:] *= 1e4  # most of these rows' mass in the short last block
    q[0::3] = p[0::3, :k]  # every draft accepted: bonus rows
    ids[1::3, 0] = 0
    p[1::3, 0, 0] = q[1::3, 0, 0] = 0  # rejected at 0 (q = p = 0 there) with p = q: the residual is empty
    q[1::3, 0] = p[1::3, 0]
    lengths = torch.tensor([3, 0, 2, 3, 1, 3, 3, 2, 3])
    position_major = p.transpose(0, 1).contiguous().transpose(0, 1), q.transpose(0, 1).contiguous().transpose(0, 1)
    for layout in [*LAYOUTS, "position-major"]:
        pl, ql = position_major if layout == "position-major" else (lay_out(p, layout), lay_out(q, layout))
        outputs = []
        # Built where they lie (float32 and float64 in runs of any length, or where the runs are long); gathered a chunk
        # at a time (float32 and float64 rows also where their runs are short).
        for long_rows, long_run in ((reference.ROW_BY_ROW, 0), (reference.ROW_BY_ROW, 1 << 62), (1 << 62, 0)):
            for reread in (reference.REREAD, 1 << 62):  # drawn from block sums at once; a chunk at a time
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(reference, "ROW_BY_ROW", long_rows)
                    patch.setattr(reference, "RUN_BY_RUN", long_rows)
                    patch.setattr(reference, "LONG_RUN", long_run)
                    patch.setattr(reference, "REREAD", reread)
                    emitted = verify(ids, ql, pl, generator=make_generator(3, "cpu"), num_draft_tokens=lengths)
                outputs.append(emitted)
        assert all(torch.equal(outputs[0], other) for other in outputs[1:]), (layout, outputs)
        assert bool((outputs[0][0::3, 3] >= 0).all()), "rows with q = p take the bonus"
        extra = outputs[0].gather(1, (outputs[0] >= 0).sum(1, keepdim=True) - 1)[2::3]
        assert bool((extra >= vocab - 44).any()), "some extra token from the short last block"


def test_evenly_spaced_rows_are_cut_into_runs():
    """Runs keep one positive step a side (q's only for rejected rows), never mix rejected and bonus rows, and take
    any two rising rows; a row that fits no run stands alone."""
    from spectest.implementations.reference import evenly_spaced_runs

    assert evenly_spaced_runs([0, 10, 20, 30, 45, 60], [0, 8, 16, 24, 30, 36], 6) == [(0, 4), (4, 6)]
    assert evenly_spaced_runs([0, 10, 20, 30], [0, 8, 17, 25], 4) == [(0, 2), (2, 4)]  # q's step breaks the run
    assert evenly_spaced_runs([0, 10, 20, 30, 40], [0, 8, 16, 99, 7], 2) == [(0, 2), (2, 5)]  # bonus rows: p alone
    assert evenly_spaced_runs([30, 20, 10], [0, 8, 16], 3) == [(0, 1), (1, 2), (2, 3)]  # falling: one row each
    assert evenly_spaced_runs([0, 10, 20], [16, 8, 0], 3) == [(0, 1), (1, 2), (2, 3)]
    assert evenly_spaced_runs([], [], 0) == []


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rows_rejected_at_one_position_are_one_view_and_give_what_gathered_rows_give(monkeypatch, dtype):
    """Rows rejected at the same position lie evenly spaced in both inputs: they are built by one operation over a
    view a side (the runs are longer than two rows), token for token as gathering the rows gives, in every layout
    and with the bonus rows between them."""
    from spectest.cases.layouts import LAYOUTS, lay_out
    from spectest.implementations import reference

    generator = make_generator(17, "cpu")
    batch, k, vocab = 12, 4, reference.RUN_BY_RUN + 300
    p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
    q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
    ids = torch.randint(0, vocab, (batch, k), generator=generator)
    q[:, :, 0], p[:, :, 0] = 1.0, 0.0  # token 0 is never accepted: every row with it at position 1 rejects there
    ids[:, 1] = 0
    ids[:, 0] = 1
    p[:, 0, 1], q[:, 0, 1] = 1.0, 0.0  # and accepts its first draft
    q[8:] = p[8:, :k]  # the last rows accept everything: bonus rows
    ids[8:, 1] = 2
    runs = []
    spied = reference.evenly_spaced_runs

    def spy(*args):
        runs.extend(found := spied(*args))
        return found

    for layout in LAYOUTS:
        outputs = []
        for long_rows in (reference.RUN_BY_RUN, 1 << 62):  # built where they lie; gathered
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(reference, "RUN_BY_RUN", long_rows)
                patch.setattr(reference, "LONG_RUN", 0)  # these runs, however short their rows, are views
                patch.setattr(reference, "evenly_spaced_runs", spy)
                drafts, ql, pl = lay_out(ids, layout), lay_out(q, layout), lay_out(p, layout)
                outputs.append(verify(drafts, ql, pl, generator=make_generator(5, "cpu")))
        assert torch.equal(outputs[0], outputs[1]), (layout, outputs)
        assert bool((outputs[0][:8, 1] >= 0).all() and (outputs[0][:8, 2] == -1).all()), "rejected at position 1"
        assert bool((outputs[0][8:, k] >= 0).all()), "bonus rows"
    assert max(end - first for first, end in runs) >= 8, runs


def test_long_runs_are_views_and_short_ones_gathered(monkeypatch):
    """Float32 rows in runs of LONG_RUN cells or more on average are built from one view a side per run; rows rejected
    at scattered positions (runs of a row or two) are gathered a chunk at a time, where an operation a run would cost
    more than the copy."""
    from spectest.implementations import reference

    generator = make_generator(19, "cpu")
    batch, k, vocab = 16, 4, reference.RUN_BY_RUN + 300
    p = torch.rand((batch, k + 1, vocab), generator=generator) + 1.0  # p > q everywhere but at token 0
    q = torch.rand((batch, k, vocab), generator=generator)
    q[:, :, 0], p[:, :, 0] = 1.0, 0.0  # token 0 is always rejected
    viewed, gathered = [], []
    run_view, selected_rows = reference.run_view, reference.selected_rows
    monkeypatch.setattr(reference, "run_view", lambda *args: viewed.append(args[3] - args[2]) or run_view(*args))
    monkeypatch.setattr(
        reference, "selected_rows", lambda *args: gathered.append(args[1].numel()) or selected_rows(*args)
    )
    monkeypatch.setattr(reference, "LONG_RUN", 4 * vocab)
    far = torch.ones((batch, k), dtype=torch.long)
    far[:, 0] = 0  # every row rejected at its first draft: one run of 16 rows
    emitted = verify(far, q, p, generator=make_generator(1, "cpu"))
    assert bool((emitted[:, 1:] == -1).all())
    assert viewed and max(viewed) == batch and not gathered, (viewed, gathered)
    viewed.clear()
    scattered = torch.ones((batch, k), dtype=torch.long)
    # Rejected at positions 0, 1, 0, 1, ...: each step between rows differs from the one before, runs of two rows.
    scattered[torch.arange(batch), torch.arange(batch) % 2] = 0
    emitted = verify(scattered, q, p, generator=make_generator(1, "cpu"))
    assert bool(((emitted >= 0).sum(1) == torch.arange(batch) % 2 + 1).all())
    assert not viewed and gathered, (viewed, gathered)


def emitted_by_rows(ids, q, p, u, v, rows: slice) -> torch.Tensor:
    """The reference's output for ``rows`` of a batch at given uniforms, its half row sums checked on the way: each
    sum it reads is its own row's (where none is read it stays 1)."""
    from spectest.implementations import reference

    args = ids[rows], q[rows], p[rows], u[rows]
    scales = reference.reached_row_sums(*args, None)
    for sums, probs in zip(scales, (q[rows], p[rows]), strict=True):
        if sums is not None:
            read = sums != 1
            assert torch.allclose(sums[read], reference.half_row_sums(probs)[read], rtol=1e-6)
    return reference.verify_at(*args, reference.ExtraToken(v[rows]), scales=scales)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_each_row_gives_what_it_gives_alone(monkeypatch, dtype):
    """A batch mixing rows that take the bonus (q = p there, every draft accepted) and rows rejected at any position
    emits, row for row, what each row emits verified alone with its own uniforms: q is read only for rejected rows
    and subtracted from their own p rows, in chunks that mix both kinds, and half rows too large to sum in one
    chunk are summed where they lie."""
    from spectest.implementations import reference

    generator = make_generator(11, "cpu")
    for batch, k, vocab, chunk_rows in [(12, 3, 900, 5), (7, 1, 3000, 2), (3, 2, 300_000, 2)]:
        monkeypatch.setattr(reference, "CHUNK_BYTES", chunk_rows * vocab * 4)
        p = (torch.rand((batch, k + 1, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
        q = (torch.rand((batch, k, vocab), generator=generator) ** 4).to(getattr(torch, dtype))
        bonus = torch.arange(batch) % 3 == 0
        q[bonus] = p[bonus, :k]
        ids = torch.randint(0, vocab, (batch, k), generator=generator)
        ids[bonus] = p[bonus, :k].float().argmax(-1)  # p = q there: accepted whatever the uniform
        u = torch.rand((batch, k), generator=generator)
        v = torch.rand((batch,), generator=generator, dtype=torch.float64)

        together = emitted_by_rows(ids, q, p, u, v, slice(0, batch))
        alone = torch.cat([emitted_by_rows(ids, q, p, u, v, slice(row, row + 1)) for row in range(batch)])
        assert torch.equal(together, alone), (batch, k, vocab, together, alone)
        assert bool((together[bonus, k] >= 0).all()) and bool((together[~bonus, k] < 0).any()), together


def test_threads_verifying_at_once_keep_their_own_working_rows(monkeypatch):
    """Each thread has its own reused rows: four threads verifying different batches at once emit what each batch
    gives alone."""
    import threading

    from spectest.implementations import reference

    monkeypatch.setattr(reference, "CHUNK_BYTES", 4 * 20000 * 4)  # eight chunks a call: the threads interleave
    generator = make_generator(8, "cpu")
    batches = []
    for _ in range(4):
        p = torch.rand((32, 5, 20000), generator=generator) ** 4
        q = torch.rand((32, 4, 20000), generator=generator) ** 4
        batches.append((torch.randint(0, 20000, (32, 4), generator=generator), q, p))
    alone = [[verify(*batch, generator=make_generator(seed, "cpu")) for seed in range(6)] for batch in batches]
    together: list[list[torch.Tensor]] = [[] for _ in batches]
    start = threading.Barrier(len(batches))

    def run(index: int) -> None:
        start.wait()
        for seed in range(6):
            together[index].append(verify(*batches[index], generator=make_generator(seed, "cpu")))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, outputs in enumerate(together):
        assert all(torch.equal(a, b) for a, b in zip(alone[index], outputs, strict=True)), index
