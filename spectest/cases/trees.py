"""Tree cases: shapes, a target/draft pair that depends on the path, and trees drafted from it.

A real target's next-token distribution is a function of the tokens on the path, so two nodes
whose paths carry the same tokens (duplicate siblings) must see the same p. The toy pair here is
an order-1 Markov chain per row and depth: p and q at a node depend on (row, depth, the node's
own token); the root's token is the row's context. Every node of every row then has its own
(p, q), duplicates stay consistent, and the next token after any reached node has a known law.

Trees are drafted the way the model declares (``iid``, ``without-replacement``, ``top-k``), fresh
for every copy of the batch, from the harness's own generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from hypothesis import strategies as st

from spectest.cases.chain import markov_cases
from spectest.cases.sizes import kind_pairs, seeds
from spectest.cases.toy_models import MarkovChain, distribution_pairs, markov_pair
from spectest.protocol import PAD
from spectest.sampling import RepeatedCategorical

STYLES = ("random", "chain", "star", "unbalanced")
# Drafts without replacement need as many tokens of positive q as a node has children: their q
# keeps this much uniform mass (a draft of disjoint support still puts 99% of its mass off p).
WITHOUT_REPLACEMENT_FLOOR = 0.01


@dataclass(frozen=True)
class TreeCase:
    """One batch of trees: every row its own shape (``nodes`` slots, used or not) and own tables."""

    batch: int
    nodes: int
    max_width: int
    max_depth: int
    vocab: int
    style: str
    kinds: tuple[tuple[str, str], ...]
    seed: int
    dtype: str = "float32"


@st.composite
def tree_cases(
    draw: st.DrawFn,
    *,
    batch: tuple[int, int] = (8, 16),
    nodes: tuple[int, int] = (2, 32),
    vocab: tuple[int, int] = (2, 16),
    max_depth: int = 8,
    max_width: int = 4,
) -> TreeCase:
    v = draw(st.integers(*vocab))
    return TreeCase(
        batch=draw(st.integers(*batch)),
        nodes=draw(st.integers(*nodes)),
        max_width=draw(st.integers(1, min(max_width, v))),
        max_depth=draw(st.integers(1, max_depth)),
        vocab=v,
        style=draw(st.sampled_from(STYLES)),
        kinds=tuple(draw(st.lists(kind_pairs(), min_size=1, max_size=3))),
        seed=draw(seeds()),
        dtype=draw(st.sampled_from(("float32", "float64"))),
    )


def tree_shape(rng: np.random.Generator, nodes: int, max_width: int, max_depth: int, style: str) -> np.ndarray:
    """parents [nodes] of one tree with at most ``nodes`` used slots (the rest -1), each node at
    most ``max_width`` children and ``max_depth`` deep; the style biases where children go."""
    parents = np.full(nodes, PAD, dtype=np.int64)
    depth = np.zeros(nodes, dtype=np.int64)
    width = np.zeros(nodes, dtype=np.int64)
    used = int(rng.integers(2, nodes + 1)) if nodes >= 2 else 1
    for i in range(1, used):
        open_ = [j for j in range(i) if width[j] < max_width and depth[j] < max_depth]
        if not open_:
            break
        if style == "chain" and (i - 1) in open_:
            parent = i - 1
        elif style == "star" and 0 in open_:
            parent = 0
        elif style == "unbalanced" and rng.random() < 0.7:
            parent = open_[-1]
        else:
            parent = open_[int(rng.integers(len(open_)))]
        parents[i] = parent
        depth[i] = depth[parent] + 1
        width[parent] += 1
    return parents


@dataclass
class TreeModel:
    """Per-row shapes and Markov tables of a case, as tensors on the device (float64 tables)."""

    parents: torch.Tensor  # [B, N]
    depth: torch.Tensor  # [B, N], -1 unused
    context: torch.Tensor  # [B]: the root's token
    target: torch.Tensor  # [B, D + 1, V, V]: p after a node at depth d whose token is t
    draft: torch.Tensor  # [B, D + 1, V, V]
    drafting: str
    converted: dict[tuple[str, torch.dtype], torch.Tensor] = field(default_factory=dict)

    def table(self, side: str, dtype: torch.dtype) -> torch.Tensor:
        """The target or draft table in ``dtype``, converted once (inputs are gathered from it)."""
        if (side, dtype) not in self.converted:
            self.converted[side, dtype] = getattr(self, side).to(dtype)
        return self.converted[side, dtype]

    @property
    def deepest(self) -> int:
        return int(self.depth.max())

    @property
    def vocab(self) -> int:
        return self.target.shape[-1]


def build_tree_model(case: TreeCase, drafting: str, device: torch.device) -> TreeModel:
    rng = np.random.default_rng(case.seed)
    # Drawn without replacement or as the top k, a node's children are distinct tokens: it has at most V of them (a
    # drafter can draw no more: torch.multinomial and torch.topk refuse). Wider nodes (duplicate siblings) are iid's.
    width = case.max_width if drafting == "iid" else min(case.max_width, case.vocab)
    parents = np.stack([tree_shape(rng, case.nodes, width, case.max_depth, case.style) for _ in range(case.batch)])
    depth = np.full(parents.shape, PAD, dtype=np.int64)
    depth[:, 0] = 0
    for i in range(1, case.nodes):
        used = parents[:, i] >= 0
        depth[used, i] = depth[used, parents[used, i]] + 1
    levels, v = int(depth.max()) + 1, case.vocab
    target = np.empty((case.batch, levels, v, v))
    draft = np.empty_like(target)
    for row in range(case.batch):
        p, q = distribution_pairs(rng, levels * v, v, *case.kinds[row % len(case.kinds)])
        target[row], draft[row] = p.reshape(levels, v, v), q.reshape(levels, v, v)
    if drafting == "without-replacement":
        draft = (1 - WITHOUT_REPLACEMENT_FLOOR) * draft + WITHOUT_REPLACEMENT_FLOOR / v
    return TreeModel(
        parents=torch.from_numpy(parents).to(device),
        depth=torch.from_numpy(depth).to(device),
        context=torch.from_numpy(rng.integers(v, size=case.batch)).to(device),
        target=torch.from_numpy(target).to(device),
        draft=torch.from_numpy(draft).to(device),
        drafting=drafting,
    )


@dataclass
class DraftedTrees:
    """``reps`` copies of the batch (copy r of row b at r * B + b), each with freshly drafted tokens."""

    parents: torch.Tensor  # [R, N]
    tokens: torch.Tensor  # [R, N], the root's token is the context
    draft_probs: torch.Tensor  # [R, N, V]
    target_probs: torch.Tensor  # [R, N, V]


def draft_trees(model: TreeModel, reps: int, generator: torch.Generator, dtype: torch.dtype) -> DraftedTrees:
    """Draft every copy's tokens top-down from q at each node's parent, as the model's scheme does."""
    b, n = model.parents.shape
    rows = torch.arange(b, device=model.parents.device).repeat(reps)
    count = rows.shape[0]
    every = torch.arange(count, device=rows.device)
    parents = model.parents.repeat(reps, 1)
    depth = model.depth.repeat(reps, 1)
    tokens = torch.zeros((count, n), dtype=torch.int64, device=rows.device)
    tokens[:, 0] = model.context[rows]
    for i in range(1, n):
        parent = parents[:, i].clamp_min(0)
        q = model.draft[rows, depth[every, parent], tokens[every, parent]]
        siblings = (parents[:, 1:i] == parents[:, i : i + 1]) & (parents[:, i : i + 1] >= 0)
        if model.drafting == "top-k":
            rank = siblings.sum(dim=1, keepdim=True)
            order = torch.sort(q, dim=1, descending=True, stable=True).indices
            drafted = order.gather(1, rank.clamp_max(q.shape[1] - 1)).squeeze(1)
        else:
            if model.drafting == "without-replacement" and i > 1:
                taken = torch.zeros_like(q).scatter_add_(1, tokens[:, 1:i], siblings.to(q.dtype))
                q = q.masked_fill(taken > 0, 0.0)
            u = torch.rand((count, 1), generator=generator, device=rows.device, dtype=torch.float64)
            drafted = RepeatedCategorical(q).at(u)[0]
        tokens[:, i] = torch.where(parents[:, i] >= 0, drafted, 0)
    node_depth = depth.clamp_min(0)
    return DraftedTrees(
        parents=parents,
        tokens=tokens,
        draft_probs=model.table("draft", dtype)[rows.unsqueeze(1), node_depth, tokens],
        target_probs=model.table("target", dtype)[rows.unsqueeze(1), node_depth, tokens],
    )


@dataclass(frozen=True)
class TreeMarkovCase:
    """A context-dependent Markov pair (p and q depend on the last token only), the sequence
    length whose V**L joint is tested, and ``shapes`` tree shapes the rows take in turn."""

    vocab: int
    length: int
    target_kind: str
    draft_kind: str
    shapes: int
    nodes: int
    max_width: int
    max_depth: int
    style: str
    seed: int
    dtype: str = "float32"

    def pair(self, drafting: str) -> tuple[MarkovChain, MarkovChain]:
        target, draft = markov_pair(np.random.default_rng(self.seed), self.vocab, self.target_kind, self.draft_kind)
        if drafting == "without-replacement":  # every context needs as many drafts as a node has children
            draft = MarkovChain((1 - WITHOUT_REPLACEMENT_FLOOR) * draft.table + WITHOUT_REPLACEMENT_FLOOR / self.vocab)
        return target, draft

    def parents(self) -> np.ndarray:
        """[shapes, nodes]: the trees that rows take in turn."""
        rng = np.random.default_rng(self.seed ^ 0x7EE)
        return np.stack(
            [tree_shape(rng, self.nodes, self.max_width, self.max_depth, self.style) for _ in range(self.shapes)]
        )


@st.composite
def tree_markov_cases(draw: st.DrawFn, *, max_vocab: int = 5, max_cells: int = 4096) -> TreeMarkovCase:
    """A Markov pair whose V**L joint fits ``max_cells``, with trees of every style."""
    pair = draw(markov_cases(max_vocab=max_vocab, max_cells=max_cells))
    return TreeMarkovCase(
        vocab=pair.vocab,
        length=pair.length,
        target_kind=pair.target_kind,
        draft_kind=pair.draft_kind,
        shapes=draw(st.integers(1, 4)),
        nodes=draw(st.integers(2, 32)),
        max_width=draw(st.integers(1, min(4, pair.vocab))),
        max_depth=draw(st.integers(1, 8)),
        style=draw(st.sampled_from(STYLES)),
        seed=pair.seed,
        dtype=pair.dtype,
    )
