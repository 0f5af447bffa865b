"""One call of a chain verifier on a CUDA device, for ``compute-sanitizer`` (memcheck, racecheck) to watch.

    python -m spectest.gpu.launch_once MODEL B K V DTYPE [--layout contiguous|padded] [--seed N] [--device D]

MODEL is a registered model (``reference-triton``, ``reference-cupy``) or ``module:attr`` of an object with a
``verify`` method (the broken variants: ``spectest.gpu.cupy:id_past_v``). The inputs are
random rows on the device (drafts sampled from q; ``padded`` puts every row inside a K + 3 by V + 5 buffer at a
storage offset of 3, so that rows start unaligned and strides are not the shape's), the verifier is called
twice (the first call compiles), the device is synchronised, and the output is held to the chain protocol's
exact rules: accepted drafts, then one id in [0, V), then -1. Exit 0, or 1 with what broke. Under memcheck, run
with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that every tensor is an allocation of its own and a read past one
is an error, not a read of the pool's next block.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points
from typing import Any

import torch


def inputs(
    batch: int, k: int, vocab: int, dtype: torch.dtype, layout: str, seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft ids [B, K], q [B, K, V], p [B, K + 1, V]) on ``device``, ``layout`` as the module docstring says."""
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn((batch, 2 * k + 1, vocab), generator=generator, device=device) * 3
    p = torch.softmax(logits[:, : k + 1], dim=-1)
    q = torch.softmax(logits[:, k + 1 :], dim=-1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=generator).reshape(batch, k)
    p, q = p.to(dtype), q.to(dtype)
    if layout == "padded":
        p_storage = torch.zeros(batch * (k + 4) * (vocab + 5) + 3, dtype=dtype, device=device)
        q_storage = torch.zeros(batch * (k + 3) * (vocab + 5) + 3, dtype=dtype, device=device)
        p_view = torch.as_strided(p_storage, p.shape, ((k + 4) * (vocab + 5), vocab + 5, 1), 3)
        q_view = torch.as_strided(q_storage, q.shape, ((k + 3) * (vocab + 5), vocab + 5, 1), 3)
        p_view.copy_(p)
        q_view.copy_(q)
        p, q = p_view, q_view
    elif layout != "contiguous":
        raise ValueError(f"layout must be contiguous or padded, got {layout!r}")
    return drafts, q, p


def load(name: str) -> Any:
    """A registered model (``spectest.models`` entry point) or ``module:attr``: an object with ``verify``."""
    registered = {point.name: point for point in entry_points(group="spectest.models")}
    if name in registered:
        return registered[name].load()
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def broken_rules(out: torch.Tensor, drafts: torch.Tensor, vocab: int) -> list[str]:
    """What in ``out`` breaks the chain protocol's exact rules (empty when nothing does)."""
    batch, k = drafts.shape
    if tuple(out.shape) != (batch, k + 1) or out.dtype != torch.int64:
        return [f"output {tuple(out.shape)} {out.dtype}, expected ({batch}, {k + 1}) int64"]
    problems = []
    for row, (emitted, drafted) in enumerate(zip(out.tolist(), drafts.tolist(), strict=True)):
        length = next((i for i, token in enumerate(emitted) if token == -1), k + 1)
        accepted = length - 1
        if length == 0 or any(token != -1 for token in emitted[length:]):
            problems.append(f"row {row}: {emitted} is not tokens then -1s")
        elif emitted[:accepted] != drafted[:accepted]:
            problems.append(f"row {row}: accepted {emitted[:accepted]} are not the drafts {drafted[:accepted]}")
        elif not 0 <= emitted[accepted] < vocab:
            problems.append(f"row {row}: extra token {emitted[accepted]} outside [0, {vocab})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("batch", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("vocab", type=int)
    parser.add_argument("dtype", choices=("float32", "float64", "bfloat16", "float16"))
    parser.add_argument("--layout", default="contiguous", choices=("contiguous", "padded"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (the harness's own tests)")
    args = parser.parse_args(argv)
    verifier = load(args.model)
    reason = getattr(verifier, "spectest_unavailable", None)
    if reason:
        print(f"launch_once: {args.model} cannot run here: {reason}")
        return 2
    device = torch.device(args.device)
    drafts, q, p = inputs(args.batch, args.k, args.vocab, getattr(torch, args.dtype), args.layout, args.seed, device)
    for call in range(2):
        generator = torch.Generator(device=device).manual_seed(args.seed + call)
        out = verifier.verify(drafts, q, p, generator=generator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    problems = broken_rules(out.cpu(), drafts.cpu(), args.vocab)
    print(f"launch_once: {args.model} B={args.batch} K={args.k} V={args.vocab} {args.dtype} {args.layout}: ", end="")
    print("exact rules hold" if not problems else "\n".join(problems[:10]))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
