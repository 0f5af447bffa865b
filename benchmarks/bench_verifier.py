"""Verifier throughput against the memory-bandwidth floor (a benchmark, not a timed test).

A chain verifier must read the K gathered draft-token probabilities of p and q per row and the
two V-long rows (p and q at the first rejection, or the bonus row) that the one extra token
needs; it need not touch the rest of the [B, K+1, V] input. The floor is those bytes (plus
the ids in and out) over the copy bandwidth measured in the same run; each verifier is
reported as a multiple of it. Everything is timed in one process, interleaved, best of N.

    python benchmarks/bench_verifier.py [--device cpu|cuda] [--models reference,full-residual]
        [--batch 1,64,512] [--k 4,8] [--vocab 32000,128256] [--dtype float32,bfloat16]
        [--max-gb 3] [--json out.json]

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
from collections.abc import Callable
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


def best_seconds(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    fn()  # warm-up (allocator, kernels)
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


def floor_bytes(batch: int, k: int, vocab: int, itemsize: int) -> int:
    """What a verifier must touch: 2K gathered probabilities and two V-long rows per row, the
    draft ids in and the emitted ids out."""
    return batch * ((2 * k + 2 * vocab) * itemsize + k * 8 + (k + 1) * 8)


def inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, device: torch.device):
    gen = make_generator(0, device)
    target = torch.rand((batch, k + 1, vocab), generator=gen, device=device, dtype=torch.float32)
    target = (target / target.sum(-1, keepdim=True)).to(dtype)
    draft = torch.rand((batch, k, vocab), generator=gen, device=device, dtype=torch.float32)
    draft = (draft / draft.sum(-1, keepdim=True)).to(dtype)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen, device=device)
    return drafts, draft, target


def measure(
    models: dict[str, Callable[..., Any]],
    batch: int,
    k: int,
    vocab: int,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
) -> dict[str, Any]:
    """One shape: the copy bandwidth and every model's best time, measured back to back."""
    drafts, draft, target = inputs(batch, k, vocab, dtype, device)
    bandwidth = copy_bandwidth(device, repeats)
    floor = floor_bytes(batch, k, vocab, dtype.itemsize) / bandwidth
    row: dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "k": k,
        "vocab": vocab,
        "copy_gb_s": bandwidth / 1e9,
        "floor_s": floor,
    }
    for name, verify in models.items():
        gen = make_generator(1, device)
        seconds = best_seconds(lambda v=verify, g=gen: v(drafts, draft, target, generator=g), device, repeats)
        row[f"{name}_s"] = seconds
        row[f"{name}_x_floor"] = seconds / floor
    return row


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device(args.device)
    models = {name: (full_residual if name == "full-residual" else resolve_model(name).verify) for name in args.models}
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
                    row = measure(models, batch, k, vocab, dtype, device, args.repeats)
                    rows.append(row)
                    cells = "  ".join(f"{n} {row[f'{n}_x_floor']:7.1f}x" for n in models)
                    print(
                        f"{dtype_name:9} B={batch:4} K={k} V={vocab:6}  copy {row['copy_gb_s']:6.1f} GB/s  "
                        f"floor {row['floor_s'] * 1e3:8.3f} ms  {cells}",
                        flush=True,
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")]

    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", type=lambda t: t.split(","), default=["reference", "full-residual"])
    parser.add_argument("--batch", type=ints, default=[1, 64, 512])
    parser.add_argument("--k", type=ints, default=[4, 8])
    parser.add_argument("--vocab", type=ints, default=[32000, 128256])
    parser.add_argument("--dtype", type=lambda t: t.split(","), default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-gb", type=float, default=3.0, help="skip shapes whose inputs exceed this")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = run(args)
    if rows:
        for name in args.models:
            ratios = [r[f"{name}_x_floor"] for r in rows]
            print(f"{name}: median {statistics.median(ratios):.1f}x the floor over {len(rows)} shapes")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({"schema": "spectest.bench-verifier/1", "rows": rows}, stream, indent=1)


if __name__ == "__main__":
    main()
