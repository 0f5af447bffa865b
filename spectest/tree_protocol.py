"""The tree-verifier protocol (capability ``tree``), its output contract, and the chain view.

Protocol::

    verify_tree(parents, draft_token_ids, draft_probs, target_probs, generator=gen) -> (path, token)
      parents:         int64 [B, N]     node 0 is the root; parents[:, 0] = -1; for i >= 1:
                                        0 <= parents[b, i] < i, or -1 for an unused slot.
                                        Children of a node are ordered by node index.
      draft_token_ids: int64 [B, N]     the drafted token of node i (ignored at the root)
      draft_probs:     float [B, N, V]  q at node i: what node i's children were drafted from
      target_probs:    float [B, N, V]  p at node i: the target's next token after the path to i
      path:            int64 [B, D]     accepted nodes from depth 1 down, then -1 (D = the
                                        deepest depth in the batch)
      token:           int64 [B]        the extra token: the correction after the last accepted
                                        node's children were all rejected, or its bonus

How siblings were drafted decides which rule is lossless, so a tree model declares it
(``spectest_tree_drafting``): ``iid`` (independent draws from q: SpecInfer's multi-step
rejection sampling), ``without-replacement`` (each child drawn from q without its earlier
siblings' tokens, renormalised: q is updated as well as p), or ``top-k`` (the children are the
most likely tokens of q in order, deterministic: each is a one-hot draft).

A tree model is held to the chain suite too, through :func:`chain_view`: a chain is a tree of
width one (for a ``top-k`` model with one-hot q at each drafted token, a deterministic draft).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spectest import rules
from spectest.protocol import PAD, ContractViolation, Model, guarded_call

if TYPE_CHECKING:
    import torch


def depths(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node [B, N] (root 0, unused slots -1); parents must be well formed."""
    import torch

    depth = torch.full_like(parents, -1)
    depth[:, 0] = 0
    for i in range(1, parents.shape[1]):
        parent = parents[:, i]
        used = parent >= 0
        depth[:, i] = torch.where(used, depth.gather(1, parent.clamp_min(0).unsqueeze(1)).squeeze(1) + 1, -1)
    return depth


class TreeInputs:
    """The inputs of a call, for error messages: formatted lazily (most calls never fail)."""

    def __init__(self, parents: torch.Tensor, target_probs: torch.Tensor, prefix: str = "") -> None:
        self.parents, self.target_probs, self.prefix = parents, target_probs, prefix

    def __str__(self) -> str:
        b, n = self.parents.shape
        return (
            f"{self.prefix}B={b}, N={n}, depth {int(depths(self.parents).max())}, V={self.target_probs.shape[-1]}, "
            f"dtype={self.target_probs.dtype}, device={self.target_probs.device}"
        )


def root_to_leaf_paths(parents: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Every root-to-leaf path of a tree (node ids from depth 1), leaves depth-first with children in index
    order; empty when the root has no children."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if node > 0 and parent >= 0:
            children.setdefault(parent, []).append(node)
    paths: list[tuple[int, ...]] = []
    stack: list[tuple[int, tuple[int, ...]]] = [(0, ())]
    while stack:
        node, path = stack.pop()
        kids = children.get(node, [])
        if not kids and path:
            paths.append(path)
        stack.extend((kid, (*path, kid)) for kid in reversed(kids))
    return tuple(paths)


def describe_tree_inputs(parents: torch.Tensor, target_probs: torch.Tensor, prefix: str = "") -> TreeInputs:
    return TreeInputs(parents, target_probs, prefix)


def call_verify_tree(
    model: Model,
    parents: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    *,
    timeout: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.verify_tree`` under the exact output rules of :func:`check_tree_output`."""
    __tracebackhide__ = True
    if model.verify_tree is None:
        raise ContractViolation(model.name, "has verify_tree", "the model declares no verify_tree method")
    inputs = describe_tree_inputs(parents, target_probs)
    out = guarded_call(
        model,
        "verify_tree",
        inputs,
        timeout,
        model.verify_tree,
        parents,
        draft_token_ids,
        draft_probs,
        target_probs,
        generator=generator,
    )
    return check_tree_output(model.name, out, parents, target_probs.shape[-1], inputs)


def check_tree_output(
    model: str, out: Any, parents: torch.Tensor, vocab_size: int, inputs: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact structural rules: a (path, token) pair of the right shapes, dtypes and device; the
    path a chain from the root under ``parents`` followed by -1 padding; the token in [0, V)."""
    __tracebackhide__ = True
    import torch

    b, n = parents.shape
    depth = depths(parents)
    deepest = int(depth.max())
    if not (isinstance(out, tuple | list) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise ContractViolation(model, rules.TREE_OUTPUT_SHAPES, f"got {type(out).__name__} for {inputs}")
    path, token = out
    if tuple(path.shape) != (b, deepest) or tuple(token.shape) != (b,):
        raise ContractViolation(
            model,
            rules.TREE_OUTPUT_SHAPES,
            f"expected path {(b, deepest)} and token {(b,)}, got {tuple(path.shape)} and {tuple(token.shape)} "
            f"for {inputs}",
        )
    if path.dtype != torch.int64 or token.dtype != torch.int64:
        raise ContractViolation(model, rules.OUTPUT_DTYPE, f"got {path.dtype} and {token.dtype} for {inputs}")
    if path.device != parents.device or token.device != parents.device:
        raise ContractViolation(model, rules.OUTPUT_DEVICE, f"got {path.device}, inputs on {parents.device}")
    bad_token = (token < 0) | (token >= vocab_size)
    if bool(bad_token.any()):
        row = int(bad_token.nonzero()[0])
        raise ContractViolation(
            model, rules.IDS_IN_RANGE, f"row {row}'s extra token is {int(token[row])} with V={vocab_size} ({inputs})"
        )
    # The path: nodes then padding, each node a child of the one before (the first a child of the root).
    present = path != PAD
    length = present.sum(dim=1)
    slots = torch.arange(deepest, device=path.device)
    in_range = ((path >= 0) & (path < n)) | ~present
    prefix = present == (slots.unsqueeze(0) < length.unsqueeze(1))
    previous = torch.cat([torch.zeros_like(path[:, :1]), path[:, :-1]], dim=1)
    parent_of = parents.gather(1, path.clamp(0, n - 1))
    chained = (parent_of == previous) | ~present
    bad = ~(in_range & chained).all(dim=1) | ~prefix.all(dim=1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        raise ContractViolation(
            model,
            rules.PATH_FOLLOWS_THE_TREE,
            f"row {row} returned path {path[row].tolist()} for parents {parents[row].tolist()} ({inputs})",
        )
    return path, token


def chain_view(verify_tree: Callable[..., Any], drafting: str, *, model: str) -> Callable[..., Any]:
    """A chain verifier made of a tree verifier: K drafts are a width-one tree of K + 1 nodes
    (node i's token is draft i - 1; p at node i is the chain's position i). A ``top-k`` model gets
    one-hot q at each drafted token (a deterministic draft); the others the chain's q."""

    def verify(draft_token_ids, draft_probs, target_probs, *, generator):
        import torch

        b, k = draft_token_ids.shape
        v = target_probs.shape[-1]
        device = draft_token_ids.device
        parents = torch.arange(-1, k, device=device).expand(b, k + 1).contiguous()
        tokens = torch.cat([torch.zeros_like(draft_token_ids[:, :1]), draft_token_ids], dim=1)
        if drafting == "top-k":
            q = torch.nn.functional.one_hot(draft_token_ids, v).to(draft_probs.dtype)
        else:
            q = draft_probs
        leaf = torch.full((b, 1, v), 1.0 / v, dtype=draft_probs.dtype, device=device)  # the leaf drafts nothing
        out = verify_tree(parents, tokens, torch.cat([q, leaf], dim=1), target_probs, generator=generator)
        path, token = check_tree_output(model, out, parents, v, describe_tree_inputs(parents, q, "chain view, "))
        accepted = (path != PAD).sum(dim=1)
        slots = torch.arange(k + 1, device=device).unsqueeze(0)
        emitted = torch.cat([draft_token_ids, torch.full_like(draft_token_ids[:, :1], PAD)], dim=1)
        emitted = torch.where(slots == accepted.unsqueeze(1), token.unsqueeze(1).to(emitted.dtype), emitted)
        return torch.where(slots > accepted.unsqueeze(1), PAD, emitted)

    verify.__qualname__ = f"chain view of {getattr(verify_tree, '__qualname__', 'verify_tree')}"
    verify.spectest_chain_view = True  # type: ignore[attr-defined]
    return verify
