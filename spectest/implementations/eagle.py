"""EAGLE's tree sampler as published on the package registry (``eagle-llm`` 1.2.1, ``eagle/model/utils.py``:
``evaluate_posterior`` with ``cart_candidates_prob``, and ``generate_tree_buffers`` for its tree bookkeeping), driven
through spectest's tree protocol at T > 0 with drafts as that version makes them.

What the wheel's sampler is. In EAGLE 1.2.1 the draft head samples each node's children *without replacement*
from its distribution q (``cnets.Model.sample``: ``torch.multinomial(q, k, replacement=False)``) and hands the
verifier each child's conditional probability q(x) / (1 - q(earlier siblings)) (``cart_candidates_prob``) and q
itself (``op``). ``evaluate_posterior`` tries a node's children in order: child x is accepted when a uniform from
Python's ``random`` is at most P(x) / Q(x); on a rejection P <- norm(max(0, P - Q)) with Q the node's q without the
earlier siblings' tokens, renormalised (``b_indices``). When every child is rejected the next token is drawn from P;
when the accepted node has no children (or the path is whole) it is drawn from
``softmax(logits[best_candidate, accept_length - 1])``: the target's *raw* logits, without the logits processor
(temperature, top-p, top-k) that every other step applies. That is recursive rejection sampling without
replacement (Jeon et al. 2024), lossless at temperature 1 with no filter, so ``spectest_tree_drafting`` is
``without-replacement`` and the harness drafts exactly so.

Models:

* ``eagle``: temperature 1 (EAGLE's ``prepare_logits_processor(temperature=1.0)``, an empty processor list, which
  still selects the sampling branch), logits = log p: the control.
* ``eagle-temperature``: temperature 0.7 as EAGLE runs it: the target's raw logits z with p = softmax(z / 0.7)
  (the adapter hands EAGLE z = 0.7 log p, so every processed step sees p exactly) and its processor at 0.7. Its bonus
  token comes from softmax(z) = norm(p^0.7), not p: a finding of this wheel (see docs/engines-we-checked.md).

EAGLE's repository has since replaced this sampler (EAGLE-2, 2024-06, and EAGLE-3): its drafts are the draft's top-k
(deterministic), each child is accepted with probability P(x) alone (``qx = 1.0``) and removed from P on a
rejection; the bonus applies the processor since 2025-04. That rule is the ``top-k`` scheme of
``reference-tree-topk``.

Layout (one row at a time: EAGLE verifies one sequence): spectest's tree becomes EAGLE's ``tree_choices`` (each
node's path of sibling ranks, < ``TOPK``), ``generate_tree_buffers`` builds the wheel's own ``retrieve_indices``,
``p_indices``, ``b_indices`` and ``tree_indices``; the adapter lays out what the draft head would have produced for
them (the children's tokens and conditional probabilities per parent group, and q per parent for ``op``), the
target's logits along every path (``tree_logits[0, retrieve_indices]``), and calls ``evaluate_posterior``. The
extra token is one ``torch.multinomial(sample_p, 1)`` as ``update_inference_inputs`` draws it. Python's ``random``
and that draw are seeded from the harness's generator (``random``'s state is restored after the call).

Install: ``pip install --no-deps eagle-llm==1.2.1`` (its pins, gradio 3.50 and protobuf 3.19 among them, are for its
chat front end; the sampler's file imports only torch and transformers' logits processors).
"""

from __future__ import annotations

import inspect
import math
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from spectest.availability import missing
from spectest.protocol import PAD
from spectest.tree_protocol import depths, root_to_leaf_paths
from spectest.wheel_files import import_file, load_package_file

MODULE_NAME = "spectest_eagle_utils"
NEEDS = ("evaluate_posterior", "generate_tree_buffers", "prepare_logits_processor", "TOPK")
HINT = "pip install --no-deps eagle-llm==1.2.1"


def load_eagle() -> Any:
    """The installed EAGLE's ``eagle/model/utils.py``, imported alone."""
    return load_package_file("eagle", ("model", "utils.py"), MODULE_NAME, NEEDS)


@contextmanager
def python_random_from(generator: torch.Generator) -> Iterator[None]:
    """Python's ``random`` seeded from ``generator`` for the duration, the caller's state restored afterwards."""
    state = random.getstate()
    random.seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item()))
    try:
        yield
    finally:
        random.setstate(state)


def rank_paths(parents: list[int]) -> dict[int, tuple[int, ...]]:
    """Each used node's path of sibling ranks from the root (EAGLE's tree choice), children in index order."""
    paths: dict[int, tuple[int, ...]] = {0: ()}
    taken: dict[int, int] = {}
    for node, parent in enumerate(parents):
        if node == 0 or parent < 0:
            continue
        rank = taken.get(parent, 0)
        taken[parent] = rank + 1
        paths[node] = paths[parent] + (rank,)
    return paths


@dataclass(frozen=True)
class Layout:
    """One tree shape in EAGLE's terms (shapes repeat across rows and calls, so each is built once): the wheel's
    ``generate_tree_buffers`` of its ``tree_choices``, and where the draft head's outputs for it come from."""

    buffers: dict[str, Any]  # retrieve_indices, p_indices, b_indices, tree_indices, as the wheel builds them
    by_eagle: torch.Tensor  # [tree_len]: spectest's node of EAGLE's node e (EAGLE numbers nodes in sorted order)
    slots: torch.Tensor  # [G, TOPK]: spectest's node in each parent group's child slot (by rank), or -1
    layers: list[torch.Tensor]  # per depth, the parents of each group there: op's rows


@lru_cache(maxsize=1024)
def layout(parents: tuple[int, ...]) -> Layout:
    eagle = load_eagle()
    paths = rank_paths(list(parents))
    if max(len(path) and path[-1] for path in paths.values()) >= eagle.TOPK:
        raise ValueError(f"EAGLE's trees have at most TOPK = {eagle.TOPK} children a node")
    choices = sorted((path for path in paths.values() if path), key=lambda x: (len(x), x))
    node = {path: n for n, path in paths.items()}
    # Parent groups layer by layer, parents in sorted order: the order generate_tree_buffers numbers them in
    # (tree_indices[e] = rank + TOPK * group + 1) and the order topK_genrate emits their rows.
    groups = list(dict.fromkeys(path[:-1] for path in choices))
    slots = torch.full((len(groups), eagle.TOPK), -1, dtype=torch.int64)
    for path in choices:
        slots[groups.index(path[:-1]), path[-1]] = node[path]
    layers: dict[int, list[int]] = {}
    for parent in groups:
        layers.setdefault(len(parent), []).append(node[parent])
    return Layout(
        buffers=eagle.generate_tree_buffers([list(path) for path in choices], device="cpu"),
        by_eagle=torch.tensor([0] + [node[path] for path in choices], dtype=torch.int64),
        slots=slots,
        layers=[torch.tensor(layers[d], dtype=torch.int64) for d in range(len(layers))],
    )


def conditional_draft_probs(parents: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[B, N] float32: each node's q(x) / (1 - q(its earlier siblings' tokens)) at its parent, as the draft head's
    ``cnets.Model.sample`` hands it over (``sampled_probs / (1 - cumulative_sum)``, inf and nan to -1, clamped to
    [0, 1]); what EAGLE's ``cart_candidates_prob`` holds."""
    b, n = parents.shape
    at_parent = q.to(torch.float32)[torch.arange(b)[:, None], parents.clamp_min(0), tokens]  # [B, N]
    earlier = (parents[:, None, :] == parents[:, :, None]) & torch.ones(n, n, dtype=torch.bool).tril(-1)
    before = (earlier & (parents[:, None, :] >= 0)).to(torch.float32) @ at_parent[:, :, None]
    conditional = at_parent / (1 - before[:, :, 0])
    conditional[torch.isinf(conditional) | torch.isnan(conditional)] = -1
    return conditional.clamp(0.0, 1.0)


class EagleTree:
    """EAGLE 1.2.1's ``evaluate_posterior`` as a tree verifier (see the module docstring)."""

    spectest_tree_drafting = "without-replacement"
    spectest_capabilities = frozenset({"standard-rejection"})

    def __init__(self, *, temperature: float = 1.0) -> None:
        if not (isinstance(temperature, (int, float)) and 0 < temperature and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        self.temperature = float(temperature)

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing("eagle", "transformers", hint=HINT)
        if reason is not None:
            return reason
        try:
            load_eagle()
        except ModuleNotFoundError as exc:
            return f"{exc} ({HINT})"
        return None

    @property
    def spectest_description(self) -> str:
        return f"eagle-llm's evaluate_posterior (the EAGLE-1 sampler), temperature {self.temperature:g}"

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        eagle = load_eagle()
        processor = eagle.prepare_logits_processor(temperature=self.temperature)
        device = parents.device
        if generator.device.type != "cpu":  # the rows run on the CPU (EAGLE's sampler loops in Python)
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            generator = torch.Generator().manual_seed(seed)
        parents, tokens, q, p = (t.cpu() for t in (parents, draft_token_ids, draft_probs, target_probs))
        b = parents.shape[0]
        conditional = conditional_draft_probs(parents, tokens, q)
        # The target's raw logits z with softmax(z / T) = p: T log p (-inf where p = 0).
        logits = self.temperature * torch.log(p.to(torch.float32))
        q32 = q.to(torch.float32)
        path = torch.full((b, int(depths(parents).max())), PAD, dtype=torch.int64)
        token = torch.empty(b, dtype=torch.int64)
        with python_random_from(generator):
            for row in range(b):
                shape = tuple(parents[row].tolist())
                if not any(parent >= 0 for parent in shape):  # a root alone: the bonus from p at the root
                    weights = torch.softmax(logits[row, 0], dim=-1)
                    token[row] = torch.multinomial(weights, 1, generator=generator)
                    continue
                tree = layout(shape)
                filled = tree.slots >= 0
                picks = tree.slots.clamp_min(0)
                draft_head = (
                    torch.where(filled, tokens[row][picks], 0),  # each group's children's tokens
                    torch.where(filled, conditional[row][picks], 0.0),  # and their conditional probabilities
                    [q32[row][parents_at] for parents_at in tree.layers],  # op: q at each group's parent
                )
                root = tokens[row, :1]  # the context token (EAGLE's sample_token; every path starts with it)
                candidates, candidates_prob, tree_candidates = eagle.generate_candidates(
                    draft_head, tree.buffers["tree_indices"], tree.buffers["retrieve_indices"], root[None], processor
                )
                retrieve = tree.buffers["retrieve_indices"]
                best, accepted, sample_p = eagle.evaluate_posterior(
                    logits[row][tree.by_eagle][retrieve],  # tree_decoding's tree_logits[0, retrieve_indices]
                    candidates,
                    processor,
                    candidates_prob,
                    draft_head[2],
                    tree.buffers["p_indices"],
                    tree_candidates,
                    tree.buffers["b_indices"],
                )
                best, accepted = int(best), int(accepted)
                path[row, :accepted] = tree.by_eagle[retrieve[best, 1 : accepted + 1]]
                token[row] = torch.multinomial(sample_p.reshape(-1), 1, generator=generator)  # update_inference_inputs
        return path.to(device), token.to(device)


class EagleRepoTree:
    """The sampler of an EAGLE checkout (EAGLE-2 and EAGLE-3: ``evaluate_posterior(logits, candidates,
    logits_processor)``), for the question its issues keep asking (#183, #221, #329): is accepting a top-k draft with
    probability P(x) alone, and removing it from P on a rejection, lossless? Its drafts are the draft's top-k
    (``cnets.py``'s ``topK_genrate``: ``torch.topk``), deterministic, so ``spectest_tree_drafting`` is ``top-k``.

    The file is not on the registry: give the checkout's ``eagle/model/utils.py`` as ``utils_path``, or for the
    registered ``eagle-repo`` in ``SPECTEST_EAGLE_UTILS`` (it is imported alone, as the wheel's is). Every
    root-to-leaf path of spectest's tree is a candidate row (children in index order, so the most likely first),
    -1 padded as ``topK_genrate`` pads ``retrieve_indices``; the target's logits along each row; the extra token one
    ``torch.multinomial(sample_p, 1)``."""

    spectest_tree_drafting = "top-k"
    spectest_capabilities = frozenset({"standard-rejection"})

    def __init__(self, *, utils_path: str | None = None, temperature: float = 1.0) -> None:
        if not (isinstance(temperature, (int, float)) and 0 < temperature and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        self.utils_path = utils_path
        self.temperature = float(temperature)

    def _path(self) -> str | None:
        return self.utils_path or os.environ.get("SPECTEST_EAGLE_UTILS")

    def _load(self) -> Any:
        path = self._path()
        module = import_file(Path(path), f"spectest_eagle_repo_{abs(hash(path))}")
        if list(inspect.signature(module.evaluate_posterior).parameters) != [
            "logits",
            "candidates",
            "logits_processor",
        ]:
            raise ModuleNotFoundError(
                f"{path}'s evaluate_posterior is not EAGLE-2/3's (logits, candidates, logits_processor): for EAGLE "
                "1.2.1's, use the model eagle"
            )
        return module

    @property
    def spectest_unavailable(self) -> str | None:
        path = self._path()
        if not path:
            return "no EAGLE checkout given (SPECTEST_EAGLE_UTILS=path/to/EAGLE/eagle/model/utils.py)"
        if not os.path.isfile(path):
            return f"SPECTEST_EAGLE_UTILS names no file: {path}"
        reason = missing("transformers", hint="the checkout's utils.py imports its logits processors")
        if reason is not None:
            return reason
        try:
            self._load()
        except (ModuleNotFoundError, AttributeError) as exc:
            return str(exc)
        return None

    @property
    def spectest_description(self) -> str:
        return f"evaluate_posterior of the EAGLE checkout at {self._path()}, temperature {self.temperature:g}"

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        eagle = self._load()
        processor = eagle.prepare_logits_processor(temperature=self.temperature)
        device = parents.device
        if generator.device.type != "cpu":
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
            generator = torch.Generator().manual_seed(seed)
        parents, tokens, p = (t.cpu() for t in (parents, draft_token_ids, target_probs))
        logits = self.temperature * torch.log(p.to(torch.float32))
        b = parents.shape[0]
        path = torch.full((b, int(depths(parents).max())), PAD, dtype=torch.int64)
        token = torch.empty(b, dtype=torch.int64)
        with python_random_from(generator):
            for row in range(b):
                rows = leaf_paths(tuple(parents[row].tolist()))  # [P, D + 1] spectest nodes, -1 padded
                candidates = torch.where(rows >= 0, tokens[row][rows.clamp_min(0)], -1)
                best, accepted, sample_p = eagle.evaluate_posterior(
                    logits[row][rows.clamp_min(0)], candidates, processor
                )
                best, accepted = int(best), int(accepted)
                path[row, :accepted] = rows[best, 1 : accepted + 1]
                token[row] = torch.multinomial(sample_p.reshape(-1), 1, generator=generator)
        return path.to(device), token.to(device)


@lru_cache(maxsize=1024)
def leaf_paths(parents: tuple[int, ...]) -> torch.Tensor:
    """[P, D + 1]: the nodes from the root to each leaf, leaves in index order, -1 padded (the root alone: [[0]])."""
    rows = [(0, *path) for path in root_to_leaf_paths(parents)] or [(0,)]
    width = max(len(row) for row in rows)
    return torch.tensor([[*row] + [PAD] * (width - len(row)) for row in rows], dtype=torch.int64)


EAGLE = EagleTree()
EAGLE_TEMPERATURE = EagleTree(temperature=0.7)
EAGLE_REPO = EagleRepoTree()
