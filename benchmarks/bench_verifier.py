"""Verifier throughput against the memory-bandwidth floor (a benchmark, not a timed test).

A chain verifier must read the K gathered draft-token probabilities of p and q per row and the
two V-long rows (p and q at the first rejection, or the bonus row) that the one extra token
needs; it need not touch the rest of the [B, K+1, V] input. The floor is those bytes (plus
the ids in and out) over the copy bandwidth measured in the same run, plus what any call pays
to start: an empty kernel's launch-to-completion time on CUDA (a trivial op's dispatch on a
CPU), measured in the same run too, so that B = 1 reads as the launch it is. Each verifier is
reported as a multiple of that floor and, where a peer is installed (FlashInfer's
``chain_speculative_sampling``, ``--peer flashinfer``), as a multiple of the peer's time at the
same shape, and against the floor at the best copy bandwidth of the whole run (a shared machine's bandwidth
moves between shapes while a verifier's time may not: :func:`at_best_copy`). Everything is timed in one process,
interleaved, best of N after :data:`WARMUP_S` of calls: on the 2-core VMs this runs on, a verification's time
after the run's 256 MiB copy (or a pause) starts at 1.5-4x its steady time and takes 10-15 calls to get back (B = 64,
K = 8, V = 32000: 2.3 ms down to 0.6 ms; docs/figures.md, 2026-12-06 stop 57), so one warm-up call and best of 5
timed that ramp, not the verifier. Half-precision rows are handed over as they are (each verifier reads them natively or
converts them itself).

    python benchmarks/bench_verifier.py [--device cpu|cuda] [--models reference,full-residual]
        [--peer flashinfer] [--batch 1,64,512] [--k 4,8] [--vocab 32000,128256]
        [--dtype float32,bfloat16,float16] [--drafts random|far] [--max-gb 3] [--json out.json]

``--drafts random`` (the default): p, q and the draft ids independent, so each draft is accepted with probability
about 3/4 (E min(1, U/U') for independent uniforms) and rows are rejected at every position. ``--drafts far``: every draft is a token q likes and p rules out, so every row is rejected
at its first draft, as with a draft far from the target: the residual rows then lie evenly spaced in p and q.

``full-residual`` is the baseline of the issue that introduced this benchmark: an
implementation that builds and normalises the residual at every position before looking at
the acceptances, as some engines' pure-torch samplers do. Any registered ``--spec-model`` name
or ``file.py:attr`` works as a model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from spectest.resolve import resolve_model
from spectest.sampling import make_generator, sample_categorical

COPY_BYTES = 256 * 2**20


def full_residual(draft_token_ids, draft_probs, target_probs, *, generator):
    """Baseline: residuals for all K positions, then the chain (correct, bandwidth-hungry)."""
    batch, k = draft_token_ids.shape
    ids = draft_token_ids.unsqueeze(-1)
    p_d = target_probs[:, :k].gather(-1, ids).squeeze(-1)
    q_d = draft_probs.gather(-1, ids).squeeze(-1)
    residual = (target_probs[:, :k] - draft_probs).clamp_min(0)
    residual = residual / residual.sum(-1, keepdim=True).clamp_min(1e-30)
    candidates = sample_categorical(torch.cat([residual, target_probs[:, k:]], 1), generator)
    u = torch.rand((batch, k), generator=generator, device=ids.device, dtype=target_probs.dtype)
    n = (u * q_d < p_d).long().cumprod(1).sum(1)
    slots = torch.arange(k + 1, device=ids.device)
    out = torch.where(slots[:k] < n.unsqueeze(1), draft_token_ids, -1)
    out = torch.cat([out, torch.full_like(out[:, :1], -1)], 1)
    out[torch.arange(batch, device=ids.device), n] = candidates.gather(1, n.unsqueeze(1)).squeeze(1)
    return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


WARMUP_S = 0.2  # seconds of calls before timing: past the machine's ramp back to speed (module docstring)


def best_seconds(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Best of ``repeats`` timed calls, after calls for :data:`WARMUP_S` (at least one: allocator, kernels, compiles)."""
    warm_until = None
    while warm_until is None or time.perf_counter() < warm_until:
        fn()
        synchronize(device)
        if warm_until is None:  # the first call (a compile, a kernel's load) is not part of the warm-up's time
            warm_until = time.perf_counter() + WARMUP_S
    times = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times)


def copy_bandwidth(device: torch.device, repeats: int) -> float:
    """Bytes per second of a large device-to-device copy (read plus write)."""
    src = torch.ones(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / best_seconds(lambda: dst.copy_(src), device, repeats)


def launch_seconds(device: torch.device, repeats: int) -> float:
    """What a call pays before any byte moves: an empty kernel launched and completed (CUDA), or a trivial
    op dispatched (CPU); best of ``repeats`` rounds of 50."""
    tiny = torch.zeros(1, device=device)
    rounds = 50

    def launches() -> None:
        for _ in range(rounds):
            tiny.add_(0)
        synchronize(device)

    return best_seconds(launches, device, repeats) / rounds


def floor_bytes(batch: int, k: int, vocab: int, itemsize: int) -> int:
    """What a verifier must touch: 2K gathered probabilities and two V-long rows per row, the
    draft ids in and the emitted ids out."""
    return batch * ((2 * k + 2 * vocab) * itemsize + k * 8 + (k + 1) * 8)


def inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, device: torch.device, drafts: str = "random"):
    """(draft ids, q, p) of one shape; ``drafts`` says where rows are rejected (module docstring)."""
    gen = make_generator(0, device)
    target = torch.rand((batch, k + 1, vocab), generator=gen, device=device, dtype=torch.float32)
    draft = torch.rand((batch, k, vocab), generator=gen, device=device, dtype=torch.float32)
    ids = torch.randint(0, vocab, (batch, k), generator=gen, device=device)
    if drafts == "far":  # token 0: as much of q's mass as all the others together, none of p's
        ids.zero_()
        target[:, :, 0], draft[:, :, 0] = 0.0, draft[:, :, 1:].sum(-1)
    target = (target / target.sum(-1, keepdim=True)).to(dtype)
    draft = (draft / draft.sum(-1, keepdim=True)).to(dtype)
    return ids, draft, target


def measure(
    models: dict[str, Callable[..., Any]],
    batch: int,
    k: int,
    vocab: int,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    peer: str | None = None,
    drafts: str = "random",
) -> dict[str, Any]:
    """One shape: the copy bandwidth, the launch latency and every model's best time, measured back to back;
    each model as a multiple of the floor (bytes over bandwidth, plus the launch) and of ``peer``'s time."""
    ids, draft, target = inputs(batch, k, vocab, dtype, device, drafts)
    bandwidth = copy_bandwidth(device, repeats)
    launch = launch_seconds(device, repeats)
    floor = floor_bytes(batch, k, vocab, dtype.itemsize) / bandwidth + launch
    row: dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "k": k,
        "vocab": vocab,
        "drafts": drafts,
        "copy_gb_s": bandwidth / 1e9,
        "launch_s": launch,
        "floor_s": floor,
    }
    for name, verify in models.items():
        gen = make_generator(1, device)
        try:
            seconds = best_seconds(lambda v=verify, g=gen: v(ids, draft, target, generator=g), device, repeats)
        except Exception as exc:  # a model that cannot take this shape or dtype: said, not fatal to the others
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        row[f"{name}_s"] = seconds
        row[f"{name}_x_floor"] = seconds / floor
    if peer is not None and f"{peer}_s" in row:
        for name in models:
            if name != peer and f"{name}_s" in row:
                row[f"{name}_x_{peer}"] = row[f"{name}_s"] / row[f"{peer}_s"]
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    names = list(args.models)
    peer = None
    if args.peer:
        reason = resolve_model(args.peer).unavailable
        if reason:
            print(f"peer {args.peer}: not measured ({reason})")
        else:
            peer = args.peer
            names = [*names, peer] if peer not in names else names
    models = {name: (full_residual if name == "full-residual" else resolve_model(name).verify) for name in names}
    rows = []
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for vocab in args.vocab:
            for k in args.k:
                for batch in args.batch:
                    size = batch * (2 * k + 1) * vocab * dtype.itemsize
                    if size > args.max_gb * 2**30:
                        print(f"skip B={batch} K={k} V={vocab} {dtype_name}: inputs {size / 2**30:.1f} GiB > --max-gb")
                        continue
                    row = measure(models, batch, k, vocab, dtype, device, args.repeats, peer, args.drafts)
                    rows.append(row)
                    cells = "  ".join(
                        f"{n} {row[f'{n}_x_floor']:7.1f}x"
                        + (f" ({row[f'{n}_x_{peer}']:.2f}x {peer})" if f"{n}_x_{peer}" in row else "")
                        if f"{n}_x_floor" in row
                        else f"{n} failed"
                        for n in models
                    )
                    print(
                        f"{dtype_name:9} B={batch:4} K={k} V={vocab:6}  copy {row['copy_gb_s']:6.1f} GB/s  "
                        f"launch {row['launch_s'] * 1e6:6.1f} us  floor {row['floor_s'] * 1e3:8.3f} ms  {cells}",
                        flush=True,
                    )
    at_best_copy(rows, models)
    return rows


def at_best_copy(rows: list[dict[str, Any]], models: Iterable[str]) -> None:
    """Each row's models also against the floor at the best copy bandwidth of the whole run (``floor_best_s``,
    ``{name}_x_best_floor``). A shared machine's copy bandwidth moves between shapes (on a 2-core cloud CPU, 43-46
    GB/s most of the time and 70-80 GB/s in quiet spells, with a verifier's own time unchanged), and a row's ratio
    moves with it; against the run's best, a row reads what the machine can do at its best."""
    if not rows:
        return
    best = max(row["copy_gb_s"] for row in rows) * 1e9
    for row in rows:
        itemsize = torch.empty((), dtype=getattr(torch, row["dtype"])).element_size()
        row["floor_best_s"] = floor_bytes(row["batch"], row["k"], row["vocab"], itemsize) / best + row["launch_s"]
        for name in models:
            if f"{name}_s" in row:
                row[f"{name}_x_best_floor"] = row[f"{name}_s"] / row["floor_best_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", type=lambda t: t.split(","), default=["reference", "full-residual"])
    parser.add_argument("--peer", default=None, help="a model every other is compared with at each shape (flashinfer)")
    parser.add_argument("--batch", type=ints, default=[1, 64, 512])
    parser.add_argument("--k", type=ints, default=[4, 8])
    parser.add_argument("--vocab", type=ints, default=[32000, 128256])
    parser.add_argument("--dtype", type=lambda t: t.split(","), default=["float32", "bfloat16"])
    parser.add_argument("--drafts", choices=("random", "far"), default="random", help="where rows are rejected")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-gb", type=float, default=3.0, help="skip shapes whose inputs exceed this")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = run(args)
    if rows:
        for name in dict.fromkeys([*args.models, *([args.peer] if args.peer else [])]):
            ratios = [r[f"{name}_x_floor"] for r in rows if f"{name}_x_floor" in r]
            if ratios:
                best = [r[f"{name}_x_best_floor"] for r in rows if f"{name}_x_best_floor" in r]
                print(
                    f"{name}: median {statistics.median(ratios):.1f}x the floor over {len(ratios)} shapes, "
                    f"{statistics.median(best):.1f}x at the run's best copy bandwidth "
                    f"({max(r['copy_gb_s'] for r in rows):.1f} GB/s; from {min(best):.1f}x to {max(best):.1f}x)"
                )
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({"schema": "spectest.bench-verifier/3", "rows": rows}, stream, indent=1)


if __name__ == "__main__":
    main()
