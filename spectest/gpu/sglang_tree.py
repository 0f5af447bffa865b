"""SGLang's tree verifier, ``tree_speculative_sampling_target_only`` (CUDA only), as a
``verify_tree`` model (registered ``sglang-tree``).

SGLang's EAGLE trees are top-k trees checked against the target alone: the draft's
probabilities are zeros, a child is accepted against the target's probability of its token, and a
rejected token is removed from the target before the next sibling and the extra token. Its tree
tensors: ``candidates`` [B, N] (node i's token), ``retrive_index`` [B, N] (node i's row in the
flattened B * N outputs), ``retrive_next_token`` (node i's first child) and
``retrive_next_sibling`` (its next sibling), -1 for none. It writes ``accept_index`` [B, D + 1]
(the flat index of the root, then of each accepted node, -1 padded), ``accept_token_num`` [B]
(accepted drafted nodes) and ``predicts`` [B * N] (at each node of the path, the next token: the
next accepted node's token, or the extra token at the last one). ``threshold_single`` and
``threshold_acc`` stay at 1.0: lower values make it lossy by design.

The conversions are plain tensor code, tested on CPU against SGLang's own published example; the
kernel itself runs only where ``sgl_kernel`` (or ``sglang``) and a GPU are.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from typing import Any

import torch

from spectest.availability import missing
from spectest.protocol import PAD
from spectest.tree_protocol import depths

MODULES = ("sgl_kernel", "sglang.kernels.ops.speculative.sampling")


def sglang_tree_tensors(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(retrive_index, retrive_next_token, retrive_next_sibling) [B, N] int64 for ``parents``:
    children in index order, each node's flat row b * N + i."""
    b, n = parents.shape
    device = parents.device
    index = torch.arange(b * n, device=device).view(b, n)
    nodes = torch.arange(n, device=device)
    is_child = parents.unsqueeze(1) == nodes.view(1, n, 1)  # [B, parent, node]
    first_child = torch.where(is_child.any(dim=2), torch.where(is_child, nodes, n).min(dim=2).values, PAD)
    same_parent = (parents.unsqueeze(2) == parents.unsqueeze(1)) & (parents.unsqueeze(2) >= 0)  # [B, node, other]
    later = nodes.view(1, 1, n) > nodes.view(1, n, 1)
    candidates = same_parent & later
    next_sibling = torch.where(candidates.any(dim=2), torch.where(candidates, nodes, n).min(dim=2).values, PAD)
    return index, first_child, next_sibling


def path_from_sglang(
    accept_index: torch.Tensor, accept_token_num: torch.Tensor, predicts: torch.Tensor, nodes: int, deepest: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(path [B, D], token [B]) from SGLang's outputs (flat indices b * N + i)."""
    b = accept_index.shape[0]
    accept_index = accept_index.to(torch.int64)
    rows = torch.arange(b, device=accept_index.device)
    local = torch.where(accept_index >= 0, accept_index - rows.unsqueeze(1) * nodes, PAD)
    path = local[:, 1 : deepest + 1]
    if path.shape[1] < deepest:
        path = torch.cat([path, torch.full((b, deepest - path.shape[1]), PAD, device=path.device)], dim=1)
    last = accept_index.gather(1, accept_token_num.to(torch.int64).unsqueeze(1)).squeeze(1)
    return path, predicts.to(torch.int64)[last]


class SglangTreeSampler:
    """SGLang's target-only tree verifier (top-k children, the one-hot rule)."""

    spectest_tree_drafting = "top-k"
    spectest_capabilities = frozenset({"standard-rejection"})

    @property
    def spectest_unavailable(self) -> str | None:
        reasons = [missing(module.split(".")[0], gpu=True) for module in MODULES]
        if all(reasons):
            return reasons[0]
        return None if self._kernel() is not None else "no tree_speculative_sampling_target_only in sgl_kernel/sglang"

    @staticmethod
    def _kernel() -> Any:
        for module in MODULES:
            try:
                found = getattr(importlib.import_module(module), "tree_speculative_sampling_target_only", None)
            except ImportError:
                continue
            if found is not None:
                return found
        return None

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        kernel = self._kernel()
        b, n = parents.shape
        device = parents.device
        deepest = int(depths(parents).max())
        index, next_token, next_sibling = sglang_tree_tensors(parents)
        params = inspect.signature(kernel).parameters
        ids = torch.int64 if "uniform_samples_for_final_sampling" in params else torch.int32
        predicts = torch.full((b * n,), PAD, dtype=torch.int32, device=device)
        accept_index = torch.full((b, deepest + 1), PAD, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros(b, dtype=torch.int32, device=device)
        extra = {}
        if "uniform_samples_for_final_sampling" in params:
            extra["uniform_samples_for_final_sampling"] = torch.rand(b, generator=generator, device=device)
        kernel(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_token_num,
            candidates=draft_token_ids.to(ids).contiguous(),
            retrive_index=index.to(ids),
            retrive_next_token=next_token.to(ids),
            retrive_next_sibling=next_sibling.to(ids),
            uniform_samples=torch.rand((b, n), generator=generator, device=device),
            target_probs=target_probs.float().contiguous(),
            draft_probs=torch.zeros_like(target_probs, dtype=torch.float32),  # target only; it writes here
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
            **extra,
        )
        return path_from_sglang(accept_index, accept_token_num, predicts, n, deepest)


SGLANG_TREE = SglangTreeSampler()
