"""Tree verifiers (capability ``tree``): lossless on every node of every row, exact where it can be.

The chain properties hold a tree model too, through its chain view (a chain is a width-one
tree). These add what only trees have: siblings, each row its own shape, duplicates.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from spectest.simulators.tree import expected_tree_pass

from spectest import rules
from spectest.cases.toy_models import target_distributions
from spectest.cases.trees import (
    TreeCase,
    TreeMarkovCase,
    TreeModel,
    build_tree_model,
    draft_trees,
    tree_cases,
    tree_markov_cases,
    tree_shape,
)
from spectest.implementations.tree import children_table, verify_tree
from spectest.protocol import PAD, TREE
from spectest.sampling import make_generator
from spectest.suite.loop import generate_tree, sequence_index
from spectest.tree_protocol import depths

MAX_CALL_ELEMENTS = 4_000_000
MAX_SEQUENCES = 400_000  # per joint case; the plan asks for fewer
JOINT_CALL_ELEMENTS = 16_000_000  # per tree pass of the joint: few V, many sequences per call
MAX_CASE_ELEMENTS = 200_000_000
PILOT_COPIES = 256  # copies of the batch the harness verifies itself to plan each node's reach


def next_token_counts(
    model: TreeModel, tokens: torch.Tensor, path: torch.Tensor, token: torch.Tensor, reps: int
) -> torch.Tensor:
    """Counts [B * levels * V, V]: for every reached node, grouped by (row, depth, its token), the
    token emitted right after it (the next accepted child's, or the extra token). Grouping by the
    tokens, not by node ids, leaves a verifier free to enter either of two duplicate siblings."""
    b, v, levels = model.parents.shape[0], model.vocab, model.deepest + 1
    rows = torch.arange(b, device=path.device).repeat(reps).unsqueeze(1)
    accepted = (path != PAD).sum(dim=1, keepdim=True)
    path_tokens = tokens.gather(1, path.clamp_min(0))
    state = torch.cat([tokens[:, :1], path_tokens], dim=1)  # the token of the node at each depth
    depth = torch.arange(levels, device=path.device).unsqueeze(0)
    after = torch.cat([path_tokens, torch.zeros_like(token).unsqueeze(1)], dim=1)
    after = torch.where(depth == accepted, token.unsqueeze(1), after)
    cell = ((rows * levels + depth) * v + state) * v + after
    counts = torch.bincount(cell[depth <= accepted], minlength=b * levels * v * v)
    return counts.view(b * levels * v, v)


def planned_reach(model: TreeModel, case: TreeCase) -> np.ndarray:
    """How often each (row, depth, token) group is reached per copy of the batch, estimated by the
    harness's own reference verifier on its own draws: it sets the plan, never the verdict."""
    draft_gen, verify_gen = make_generator(case.seed ^ 0xA5A5), make_generator(case.seed ^ 0x5A5A)
    trees = draft_trees(model, PILOT_COPIES, draft_gen, torch.float64)
    path, token = verify_tree(
        trees.parents,
        trees.tokens,
        trees.draft_probs,
        trees.target_probs,
        generator=verify_gen,
        drafting=model.drafting,
    )
    counts = next_token_counts(model, trees.tokens, path, token, PILOT_COPIES)
    return counts.sum(dim=1).cpu().numpy() / PILOT_COPIES


# Wide, shallow trees over a few tokens: most calls reject several siblings in a row and draw
# duplicates, where sibling-rule bugs (the running residual, q's update, duplicates) show.
SIBLING_HEAVY = [
    TreeCase(
        batch=12, nodes=13, max_width=4, max_depth=2, vocab=3, style="star", kinds=(("dirichlet", "far"),), seed=11
    ),
    TreeCase(
        batch=12,
        nodes=21,
        max_width=4,
        max_depth=3,
        vocab=5,
        style="random",
        kinds=(("peaky", "far"), ("dirichlet", "uniform")),
        seed=12,
    ),
]


@pytest.mark.spec_property(examples=6, explicit=2, checks=1, needs=(TREE,))
def test_every_reached_tree_node_is_exact(spec) -> None:
    """In a batch where every row has its own tree and its own p, q (per depth and token), drafted
    afresh for each copy as the model declares, the token after each reached node follows p there."""

    def body(case: TreeCase) -> None:
        started = time.perf_counter()
        cpu = build_tree_model(case, spec.model.tree_drafting, torch.device("cpu"))
        model = build_tree_model(case, spec.model.tree_drafting, spec.device)
        b, v, levels = case.batch, case.vocab, model.deepest + 1
        per_rep = b * case.nodes * (2 * v + 2)
        check = spec.distribution(
            rules.PER_NODE,
            cpu.target.reshape(b * levels * v, v).numpy(),
            case_seed=case.seed,
            reach=planned_reach(cpu, case),
            min_draws=20,
            max_draws=max(20, MAX_CASE_ELEMENTS // per_rep),
            labels=[f"row {r} depth {d} after token {t}: " for r in range(b) for d in range(levels) for t in range(v)],
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        dtype = getattr(torch, case.dtype)
        context = f"{case}, drafting {model.drafting}"
        while not check.done:
            reps = check.next_batch(max(1, MAX_CALL_ELEMENTS // per_rep))
            trees = draft_trees(model, reps, draft_gen, dtype)
            path, token = spec.verify_tree(
                trees.parents, trees.tokens, trees.draft_probs, trees.target_probs, verify_gen
            )
            check.add(next_token_counts(model, trees.tokens, path, token, reps).cpu().numpy(), reps)
            spec.require_possible(
                check,
                lambda g, c: f"row {g // (levels * v)} depth {g // v % levels}: token {c} after token {g % v}",
                context,
            )
        spec.conclude(check, context=f"{check.draws} copies of the batch, {context}", started=started)

    spec.given(tree_cases(), body, explicit=SIBLING_HEAVY)


def exact_inputs(case: TreeCase) -> tuple[np.ndarray, ...]:
    """Trees whose siblings carry distinct tokens, q ranking each node's children first (in index
    order, so any drafting scheme could have drafted them), and a random p per node; even rows
    force one root-to-leaf path (p one-hot on the next node's token along it), odd rows kill
    random nodes (p zero on their token at their parent). Returns parents, tokens, q, p, the
    forced path [B, D] (-1 padded, empty on odd rows) and which nodes are dead (killed or below)."""
    rng = np.random.default_rng(case.seed)
    b, n, v = case.batch, case.nodes, case.vocab
    parents = np.stack([tree_shape(rng, n, case.max_width, case.max_depth, case.style) for _ in range(b)])
    children = children_table(torch.from_numpy(parents)).numpy()
    depth = depths(torch.from_numpy(parents)).numpy()
    deepest = int(depth.max())
    tokens = np.zeros((b, n), dtype=np.int64)
    q = np.empty((b, n, v))
    p = target_distributions(rng, b * n, v, "dirichlet").reshape(b, n, v)
    forced = np.full((b, deepest), PAD, dtype=np.int64)
    dead = np.zeros((b, n), dtype=bool)
    for row in range(b):
        for node in range(n):
            kids = [c for c in children[row, node] if c >= 0]
            order = rng.permutation(v)
            tokens[row, kids] = order[: len(kids)]
            values = np.sort(rng.standard_exponential(v) + 1e-3)[::-1]
            q[row, node, order] = values / values.sum()
        used = np.nonzero((parents[row] >= 0) | (np.arange(n) == 0))[0]
        if row % 2 == 0:
            leaves = [u for u in used if (children[row, u] < 0).all()]
            node, chain = int(rng.choice(leaves)), []
            while node != 0:
                chain.append(node)
                node = int(parents[row, node])
            for d, node in enumerate(reversed(chain)):
                forced[row, d] = node
                p[row, parents[row, node]] = np.eye(v)[tokens[row, node]]
        else:
            for node in used[1:]:
                parent = parents[row, node]
                if rng.random() < 0.3 and (p[row, parent] > 0).sum() > 1:
                    p[row, parent, tokens[row, node]] = 0.0
                    p[row, parent] /= p[row, parent].sum()
                    dead[row, node] = True
            for node in used[1:]:  # parents come before children: one pass marks whole subtrees
                dead[row, node] |= dead[row, parents[row, node]]
    return parents, tokens, q, p, forced, dead


@pytest.mark.spec_property(examples=8, checks=0, needs=(TREE,))
def test_tree_paths_obey_the_exact_rules(spec) -> None:
    """Exact: a path the target forces is taken to its leaf; a node whose token has p = 0 at its
    parent is never accepted, nor anything below it; the extra token has positive probability at
    the last accepted node; the same generator state gives the same output; inputs are unmodified."""

    def body(case: TreeCase) -> None:
        parents, tokens, q, p, forced, dead = exact_inputs(case)
        dtype = getattr(torch, case.dtype)
        copies = 16
        tensors = [
            torch.from_numpy(np.tile(a, (copies,) + (1,) * (a.ndim - 1))).to(spec.device)
            for a in (parents, tokens, q.astype(np.float64), p.astype(np.float64))
        ]
        tensors[2], tensors[3] = tensors[2].to(dtype), tensors[3].to(dtype)
        before = [t.clone() for t in tensors]
        _, verify_gen = spec.generators(case.seed)
        replay = verify_gen.get_state()
        path, token = spec.verify_tree(*tensors, verify_gen)
        context = f"{case}, drafting {spec.model.tree_drafting}"
        for tensor, original, name in zip(
            tensors, before, ("parents", "draft_token_ids", "draft_probs", "target_probs"), strict=True
        ):
            spec.require(torch.equal(tensor, original), rules.INPUTS_UNMODIFIED, f"{name} changed ({context})")
        torch.manual_seed(case.seed + 1)  # disturb the global generator: only the one passed in may count
        again_gen = torch.Generator(device=spec.device)
        again_gen.set_state(replay)
        again = spec.verify_tree(*tensors, again_gen)
        spec.require(
            torch.equal(again[0], path) and torch.equal(again[1], token),
            rules.DETERMINISTIC,
            f"two calls from the same generator state differ ({context})",
        )
        b = case.batch
        path_np, token_np = path.cpu().numpy(), token.cpu().numpy()
        for copy in range(copies):
            for row in range(b):
                got = path_np[copy * b + row]
                taken = got[got >= 0]
                last = int(taken[-1]) if taken.size else 0
                where = f"row {row} (copy {copy}), parents {parents[row].tolist()}, tokens {tokens[row].tolist()}"
                if row % 2 == 0:
                    spec.require(
                        np.array_equal(got, forced[row]),
                        rules.FORCED_PATH,
                        f"{where}: the target forces path {forced[row].tolist()}, got {got.tolist()} ({context})",
                    )
                else:
                    spec.require(
                        not dead[row, taken].any(),
                        rules.NEVER_ACCEPTS_IMPOSSIBLE_NODE,
                        f"{where}: path {got.tolist()} enters node {int(taken[dead[row, taken]][0]) if dead[row, taken].any() else -1}, "
                        f"whose token (or an ancestor's) has target probability 0 ({context})",
                    )
                spec.require(
                    p[row, last, token_np[copy * b + row]] > 0,
                    rules.NEVER_IMPOSSIBLE,
                    f"{where}: extra token {int(token_np[copy * b + row])} after node {last} has target probability 0 "
                    f"({context})",
                )

    spec.given(tree_cases(nodes=(2, 64), vocab=(2, 64)), body)


# Far drafts on wide trees over three tokens: every pass rejects siblings and draws corrections,
# where a reused uniform or a wrong residual bends the joint.
FAR_WIDE = TreeMarkovCase(
    vocab=3,
    length=6,
    target_kind="dirichlet",
    draft_kind="far",
    shapes=3,
    nodes=10,
    max_width=3,
    max_depth=3,
    style="random",
    seed=21,
)


@pytest.mark.spec_property(examples=4, explicit=1, checks=1, needs=(TREE,))
def test_tree_sequences_follow_the_target(spec) -> None:
    """Whole sequences through repeated tree passes on a context-dependent Markov pair (rows take
    several tree shapes in turn), against the exact L-token joint of the target."""

    def body(case: TreeMarkovCase) -> None:
        started = time.perf_counter()
        drafting = spec.model.tree_drafting
        target, draft = case.pair(drafting)
        shape = [case.vocab] * case.length
        probs = target.sequence_probs(case.length)
        check = spec.distribution(
            rules.TREE_JOINT,
            probs[None, :],
            case_seed=case.seed,
            tokens=case.length,
            min_draws=1000,
            max_draws=MAX_SEQUENCES,
            cell_name=lambda i: f"sequence {list(map(int, np.unravel_index(i, shape)))}",
        )
        parents = torch.from_numpy(case.parents()).to(spec.device)
        draft_gen, verify_gen = spec.generators(case.seed)
        passes = 0
        context = f"{case}, drafting {drafting}"
        while not check.done:
            batch = check.next_batch(max(1, JOINT_CALL_ELEMENTS // (case.nodes * (2 * case.vocab + 2))))
            run = generate_tree(
                spec.verify_tree,
                target,
                draft,
                parents,
                drafting,
                n_sequences=batch,
                length=case.length,
                draft_generator=draft_gen,
                verify_generator=verify_gen,
                dtype=getattr(torch, case.dtype),
            )
            passes += run.passes
            counts = torch.bincount(sequence_index(run.tokens, case.vocab), minlength=probs.size)
            check.add(counts.cpu().numpy()[None, :], batch)
            spec.require_possible(check, lambda g, c: check.cell_name(c), context)
        spec.conclude(
            check,
            context=f"{check.draws} sequences of {case.length} tokens through {passes} tree passes, {context}",
            started=started,
        )

    spec.given(tree_markov_cases(), body, explicit=[FAR_WIDE])


def exact_depths(model: TreeModel) -> np.ndarray:
    """[B, D + 1]: each row's exact accepted-depth distribution, averaged over the drafting."""
    levels = model.deepest + 1
    rows = []
    for row in range(model.parents.shape[0]):
        dist, _ = expected_tree_pass(
            model.parents[row].numpy(), model.target[row].numpy(), model.draft[row].numpy(), model.drafting
        )
        probs = dist.probs[int(model.context[row])]
        rows.append(np.pad(probs, (0, levels - probs.size)))
    return np.stack(rows)


@pytest.mark.spec_property(examples=4, explicit=1, checks=1, needs=(TREE,))
def test_tree_tokens_per_pass_follow_the_exact_model(spec) -> None:
    """For a verifier declaring the standard rule of its drafting scheme, each row's accepted
    depth per call follows the exact distribution the simulator computes for that row's tree, p
    and q (averaged over the drafting): an exact verifier that accepts less, or more, fails."""
    if not spec.tree_standard:
        pytest.skip(
            f"{spec.model.name} does not declare standard-rejection: the exact tree model holds only for the "
            "standard multi-step rejection rule of its drafting scheme"
        )

    def body(case: TreeCase) -> None:
        started = time.perf_counter()
        drafting = spec.model.tree_drafting
        cpu = build_tree_model(case, drafting, torch.device("cpu"))
        model = build_tree_model(case, drafting, spec.device)
        exact = exact_depths(cpu)
        b, levels = case.batch, model.deepest + 1
        per_rep = b * case.nodes * (2 * case.vocab + 2)
        check = spec.distribution(
            rules.TREE_TOKENS_PER_PASS,
            exact,
            case_seed=case.seed,
            min_draws=50,
            max_draws=max(50, MAX_CASE_ELEMENTS // per_rep),
            labels=[f"row {r}: " for r in range(b)],
            cell_name=lambda i: f"L={i + 1}",
        )
        draft_gen, verify_gen = spec.generators(case.seed)
        rows = torch.arange(b, device=spec.device)
        while not check.done:
            reps = check.next_batch(max(1, MAX_CALL_ELEMENTS // per_rep))
            trees = draft_trees(model, reps, draft_gen, getattr(torch, case.dtype))
            path, _ = spec.verify_tree(trees.parents, trees.tokens, trees.draft_probs, trees.target_probs, verify_gen)
            cells = rows.repeat(reps) * levels + (path != PAD).sum(dim=1)
            check.add(torch.bincount(cells, minlength=b * levels).view(b, levels).cpu().numpy(), reps)
        measured = float((check.counts * np.arange(1, levels + 1)).sum() / check.counts.sum())
        optimal = float((exact * np.arange(1, levels + 1)).sum(axis=1).mean())
        spec.record({"efficiency": measured / optimal, "tokens_per_pass": measured, "exact_tokens_per_pass": optimal})
        context = (
            f"{check.draws} calls per row, {case}, drafting {drafting}; tokens per pass {measured:.4f}, "
            f"exact {optimal:.4f}"
        )
        spec.conclude(check, context=context, started=started)

    # Rejection-sampling trees enumerate rejected tokens per node: vocabularies up to 8 keep that cheap.
    spec.given(tree_cases(vocab=(2, 8)), body, explicit=SIBLING_HEAVY[:1])
