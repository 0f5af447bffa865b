"""Medusa's typical acceptance as published on the package registry (``medusa-llm`` 0.1, ``medusa/model/utils.py``:
``evaluate_posterior``, and ``generate_candidates`` for the token after the accepted prefix), driven through
spectest's protocols with nothing of the rule replaced.

What runs. ``evaluate_posterior(logits, candidates, temperature, posterior_threshold, posterior_alpha)`` takes one
sequence's candidate paths (``candidates`` [P, L]: slot 0 the last verified token, then each path's drafts) and the
target's logits along them (``logits`` [P, L, V]: slot j the target after slot j's token). At temperature 0 it
accepts a path's drafts while each equals ``torch.argmax`` of the logits before it; at T > 0 while each has
probability > min(posterior_threshold, posterior_alpha * exp(-H)) under ``softmax(logits / T)`` (H computed as
``-sum p log(p + 1e-5)``), then keeps the longest accepted prefix over all paths (ties: the path of the largest
summed log-probability, the first on equal sums; none accepted: path 0, length 0). The token after the prefix is
not drawn there: Medusa's next round makes it, ``generate_candidates``' first candidate
``torch.argmax(logits[:, -1])`` (utils.py line 213) on the logits at the last accepted slot (``update_inference_inputs``
line 387). The adapter calls ``generate_candidates`` itself with no Medusa heads (``medusa_logits`` of zero heads,
``medusa_topk = []``, ``tree_indices = [0]``), where the function is exactly that line; so at any temperature the
extra token is the target's argmax, never a draw. Medusa 0.1 draws no random number anywhere (its drafts are the
heads' top-k): the generator is unused.

Published knobs: ``medusa_generate(..., temperature=0.0, medusa_choices=[1, 7, 6], posterior_threshold=0.09,
posterior_alpha=0.3)`` (``medusa/model/medusa_model.py`` lines 190-197; alpha "recommended to be
sqrt(posterior_threshold)").

Models:

* ``medusa`` (:class:`MedusaTypical`, tree protocol, ``spectest_tree_drafting = "top-k"``: Medusa's heads draft
  their top-k, deterministic): typical acceptance at the published thresholds, temperature 1 on logits = log p
  (float64, -inf where p = 0), so ``softmax(logits / 1)`` is p itself. Lossy (``spectest_lossy``): the harness
  measures the TV it moves, no promise. Its chain view runs the chain suite.
* ``medusa-greedy`` (:class:`MedusaLogits`, chain protocol with the ``logits`` capability): each row's raw logits
  and temperature go to the wheel as they are, so a greedy row takes the wheel's temperature-0 branch and is held
  exactly to greedy decoding; a row at T > 0 takes the typical branch on ``softmax(logits / T)`` (Medusa 0.1 applies
  no top-k, top-p or min-p: ``spectest_sampling_params = ("temperature",)``), measured in lossy mode like
  ``verify``, which is temperature 1 on log p.

Layout. Medusa 0.1 verifies the full cartesian product of its heads' top-k (``generate_medusa_buffers``,
``retrieve_indices`` lines 64-77; ``torch.cartesian_prod`` line 218): every path is ``len(medusa_choices)`` long and
there is no padding. A spectest tree has leaves at different depths, so the adapter lays out one path per leaf
(depth-first, children in index order: the cartesian product's order) and pads a row's shorter paths to its
deepest: a padded slot's candidate is token 0, and every logits slot that judges a padded candidate is a padding
row of logit -inf at token 0 and 0 elsewhere, so token 0 has probability 0 there and neither branch can accept it
(its leaf's own logits only give the extra token). The extra token comes from the real logits of the last accepted
node. Rows are independent and ``evaluate_posterior`` is batch-1: the adapter calls it once per distinct row (rows
equal in all the rule reads, the tree, its tokens and p or the logits and temperature, give equal outputs: the rule
is a function of those alone and never reads q).

Install: ``pip install --no-deps medusa-llm==0.1`` (its pins, fschat and accelerate among them, are for its chat
front end; ``utils.py`` imports only torch), loaded alone by :func:`spectest.wheel_files.load_package_file`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch

from spectest.availability import missing
from spectest.protocol import PAD
from spectest.tree_protocol import depths, root_to_leaf_paths
from spectest.wheel_files import load_package_file

MODULE_NAME = "spectest_medusa_utils"
NEEDS = ("evaluate_posterior", "generate_candidates")
HINT = "pip install --no-deps medusa-llm==0.1"
PUBLISHED_THRESHOLD = 0.09  # medusa/model/medusa_model.py line 195
PUBLISHED_ALPHA = 0.3  # line 197
PAD_TOKEN = 0  # a padded slot's candidate
CHUNK_ELEMENTS = 4_000_000  # logits laid out along the paths at once


def load_medusa() -> Any:
    """The installed Medusa's ``medusa/model/utils.py``, imported alone."""
    return load_package_file("medusa", ("model", "utils.py"), MODULE_NAME, NEEDS)


def medusa_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("medusa-llm")
    except PackageNotFoundError:
        return "unknown version"


@lru_cache(maxsize=4096)
@lru_cache(maxsize=4096)
def path_layout(parents: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nodes [P, L], pad_candidate [P, L], pad_logits [P, L]) of a tree's paths, L = its deepest depth + 1:
    slot 0 the root, then each path's nodes (0 in padded slots); which candidate slots are padding; which logits
    slots judge a padded candidate (a short path's slots from its leaf on)."""
    paths = root_to_leaf_paths(parents)
    width = max(len(path) for path in paths) + 1
    nodes = torch.zeros((len(paths), width), dtype=torch.int64)
    pad_candidate = torch.zeros((len(paths), width), dtype=torch.bool)
    pad_logits = torch.zeros((len(paths), width), dtype=torch.bool)
    for row, path in enumerate(paths):
        nodes[row, 1 : len(path) + 1] = torch.tensor(path, dtype=torch.int64)
        pad_candidate[row, len(path) + 1 :] = True
        if len(path) + 1 < width:
            pad_logits[row, len(path) :] = True
    return nodes.to(device), pad_candidate.to(device), pad_logits.to(device)


def medusa_tree_inputs(
    parents: tuple[int, ...], tokens: torch.Tensor, logits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, tuple[tuple[int, ...], ...]]:
    """Rows of one tree shape (``parents``, each node's parent; ``tokens`` [R, N], the target's logits at each node
    [R, N, V]) as Medusa's inputs, one row each: (candidates [R, P, L], logits [R, P, L, V], the paths' node ids),
    padded as the module docstring says."""
    nodes, pad_candidate, pad_logits = path_layout(parents, str(tokens.device))
    candidates = torch.where(pad_candidate, PAD_TOKEN, tokens[:, nodes])
    candidates[:, :, 0] = tokens[:, :1]  # the last verified token (never read by evaluate_posterior)
    padding = torch.zeros(logits.shape[-1], dtype=logits.dtype, device=logits.device)
    padding[PAD_TOKEN] = -math.inf
    along = torch.where(pad_logits.unsqueeze(-1), padding, logits[:, nodes])
    return candidates, along, root_to_leaf_paths(parents)


def wheel_argmax(medusa: Any, logits: torch.Tensor, temperature: float) -> int:
    """The wheel's ``generate_candidates`` with no Medusa heads on one position's logits [V]: its first candidate,
    ``torch.argmax(logits[:, -1])``, the token Medusa emits after an accepted prefix."""
    no_heads = logits.new_zeros((0, 1, 1, logits.shape[-1]))
    candidates, _ = medusa.generate_candidates(no_heads, logits.view(1, 1, -1), [], [0], temperature)
    return int(candidates[0])


def check_knobs(posterior_threshold: Any, posterior_alpha: Any) -> tuple[float, float]:
    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    if not number(posterior_threshold) or not 0 <= posterior_threshold <= 1:
        raise ValueError(f"posterior_threshold must be a number in [0, 1], got {posterior_threshold!r}")
    if not number(posterior_alpha) or not (0 <= posterior_alpha and math.isfinite(posterior_alpha)):
        raise ValueError(f"posterior_alpha must be a finite number >= 0, got {posterior_alpha!r}")
    return float(posterior_threshold), float(posterior_alpha)


def fingerprint_weights(width: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0x3ED05A)
    return (torch.rand((width, 2), generator=generator, dtype=torch.float64) + 0.5).to(device)


def distinct_rows(*tensors: torch.Tensor) -> torch.Tensor:
    """[B]: for each row, the first row equal to it in every tensor (each [B, ...]), itself when none before.
    Rows are grouped by a fingerprint, then each is compared with its group's first row exactly (a row that differs
    is its own representative), so the grouping never merges rows that differ."""
    b = tensors[0].shape[0]
    device = tensors[0].device
    parts = []
    for tensor in tensors:
        flat = tensor.reshape(b, -1).to(torch.float64)
        finite = torch.isfinite(flat)
        weights = fingerprint_weights(flat.shape[1], device)
        parts += [torch.where(finite, flat, 0.0) @ weights, finite.to(torch.float64) @ weights]
    _, inverse = torch.unique(torch.cat(parts, dim=1), dim=0, return_inverse=True)
    rows = torch.arange(b, device=device)
    first = torch.full((int(inverse.max()) + 1,), b, dtype=torch.int64, device=device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")[inverse]
    same = torch.ones(b, dtype=torch.bool, device=device)
    for tensor in tensors:
        same &= (tensor == tensor[first]).reshape(b, -1).all(dim=1)
    return torch.where(same, first, rows)


class MedusaKnobs:
    """Medusa's two thresholds, validated, and the wheel's availability (shared by both models)."""

    spectest_lossy = True
    spectest_capabilities = frozenset()

    def __init__(self, *, posterior_threshold: float = PUBLISHED_THRESHOLD, posterior_alpha: float = PUBLISHED_ALPHA):
        self.posterior_threshold, self.posterior_alpha = check_knobs(posterior_threshold, posterior_alpha)

    @property
    def spectest_unavailable(self) -> str | None:
        reason = missing("medusa", hint=HINT)
        if reason is not None:
            return reason
        try:
            load_medusa()
        except ModuleNotFoundError as exc:
            return f"{exc} ({HINT})"
        return None

    def knobs(self) -> str:
        return f"posterior_threshold={self.posterior_threshold:g}, posterior_alpha={self.posterior_alpha:g}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.knobs()})"


class MedusaTypical(MedusaKnobs):
    """Medusa 0.1's ``evaluate_posterior`` at temperature 1 on log p as a top-k tree verifier (module docstring)."""

    spectest_tree_drafting = "top-k"
    temperature = 1.0

    @property
    def spectest_description(self) -> str:
        return (
            f"medusa-llm {medusa_version()}'s evaluate_posterior (typical acceptance, {self.knobs()}) at temperature "
            "1 on log p, the extra token generate_candidates' argmax"
        )

    def verify_tree(self, parents, draft_token_ids, draft_probs, target_probs, *, generator):
        medusa = load_medusa()
        b = parents.shape[0]
        device = parents.device
        logits = torch.log(target_probs.to(torch.float64))  # -inf where p = 0, as a filtered engine's logits
        first = distinct_rows(parents, draft_token_ids, target_probs)
        shapes: dict[tuple[int, ...], list[int]] = {}
        distinct = torch.unique(first)
        for row, key in zip(distinct.tolist(), parents[distinct].tolist(), strict=True):
            shapes.setdefault(tuple(key), []).append(row)
        accepted: dict[int, list[int]] = {}
        token = torch.zeros(b, dtype=torch.int64, device=device)
        for key, rows in shapes.items():
            if not root_to_leaf_paths(key):  # a root alone: no candidates, only the token after the root
                for row in rows:
                    accepted[row], token[row] = [], wheel_argmax(medusa, logits[row, 0], self.temperature)
                continue
            nodes = path_layout(key, str(device))[0]
            chunk = max(1, CHUNK_ELEMENTS // (nodes.numel() * logits.shape[-1]))
            for start in range(0, len(rows), chunk):
                part = torch.tensor(rows[start : start + chunk], dtype=torch.int64, device=device)
                candidates, along, paths = medusa_tree_inputs(key, draft_token_ids[part], logits[part])
                for i, row in enumerate(part.tolist()):
                    accepted[row] = self.accepted_nodes(medusa, candidates[i], along[i], paths)
                    last = accepted[row][-1] if accepted[row] else 0
                    token[row] = wheel_argmax(medusa, logits[row, last], self.temperature)
        path = torch.full((b, int(depths(parents).max())), PAD, dtype=torch.int64)
        for row, nodes_taken in accepted.items():
            path[row, : len(nodes_taken)] = torch.tensor(nodes_taken, dtype=torch.int64)
        return path.to(device)[first], token[first]

    def accepted_nodes(
        self, medusa: Any, candidates: torch.Tensor, logits: torch.Tensor, paths: tuple[tuple[int, ...], ...]
    ) -> list[int]:
        """One tree through the wheel's ``evaluate_posterior``: the accepted node ids."""
        best, accepted = medusa.evaluate_posterior(
            logits, candidates, self.temperature, self.posterior_threshold, self.posterior_alpha
        )
        best, accepted = int(best), int(accepted)
        if accepted > len(paths[best]):
            raise RuntimeError(
                f"evaluate_posterior accepted {accepted} slots of path {best}, which has {len(paths[best])} nodes: "
                "a padded slot was accepted"
            )
        return list(paths[best][:accepted])


class MedusaLogits(MedusaKnobs):
    """Medusa 0.1's ``evaluate_posterior`` on a chain, each row at its own temperature (module docstring)."""

    spectest_sampling_params = ("temperature",)

    @property
    def spectest_description(self) -> str:
        return (
            f"medusa-llm {medusa_version()}'s evaluate_posterior on each row's logits and temperature (greedy at 0, "
            f"typical acceptance with {self.knobs()} above), the extra token generate_candidates' argmax"
        )

    def verify(self, draft_token_ids, draft_probs, target_probs, *, generator):
        b = draft_token_ids.shape[0]
        temperature = torch.ones(b, dtype=torch.float64, device=draft_token_ids.device)
        return self.chain(draft_token_ids, torch.log(target_probs.to(torch.float64)), temperature)

    def verify_logits(self, draft_token_ids, draft_logits, target_logits, params, *, generator):
        return self.chain(draft_token_ids, target_logits, params.temperature.to(target_logits.device))

    def chain(self, drafts: torch.Tensor, logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        medusa = load_medusa()
        b, k = drafts.shape
        out = torch.full((b, k + 1), PAD, dtype=torch.int64, device=drafts.device)
        first = distinct_rows(drafts, logits, temperature)
        for row in torch.unique(first).tolist():
            t = float(temperature[row])  # the wheel tests `temperature == 0` on a Python number
            candidates = torch.cat([drafts[row, :1], drafts[row]]).unsqueeze(0)  # slot 0: never read
            _, accepted = medusa.evaluate_posterior(
                logits[row].unsqueeze(0), candidates, t, self.posterior_threshold, self.posterior_alpha
            )
            accepted = int(accepted)
            out[row, :accepted] = drafts[row, :accepted]
            out[row, accepted] = wheel_argmax(medusa, logits[row, accepted], t)
        return out[first]


MEDUSA = MedusaTypical()
MEDUSA_GREEDY = MedusaLogits()
