"""The harness loop: generate sequences through repeated verify calls, as an engine would.

Each pass drafts K tokens from the draft model, scores the drafted prefix with the target (one
distribution per prefix, plus the bonus row), calls the verifier, appends what it emitted and
continues from there. All rows advance together; a row stops once it holds ``length`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from spectest.cases.toy_models import MarkovChain
from spectest.cases.trees import TreeModel, draft_trees
from spectest.protocol import PAD, Model, call_verify
from spectest.sampling import sample_categorical
from spectest.tree_protocol import depths


@dataclass
class Generation:
    tokens: torch.Tensor  # [n, length] int64
    passes: int  # verify calls made
    tokens_per_pass: torch.Tensor  # every row's emitted count, for every pass, concatenated
    pass_rows: torch.Tensor  # the row of each entry of tokens_per_pass
    pass_contexts: torch.Tensor  # the context each of those passes started in (V = start of sequence)


def as_tensor(table: MarkovChain, *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(table.table, dtype=dtype, device=device)


# (draft_token_ids, draft_probs, target_probs, generator) -> emitted: a contract-checked verify call
VerifyCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]


def unfinished(
    tokens: torch.Tensor, lengths: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The rows still short of ``length`` tokens, how many each holds and its last token; None when all are done."""
    active = (lengths < length).nonzero().squeeze(1)
    if active.numel() == 0:
        return None
    filled = lengths[active]
    return active, filled, tokens[active, (filled - 1).clamp_min(0)]


def generate(
    model: Model | VerifyCall,
    target: MarkovChain,
    draft: MarkovChain,
    *,
    n_sequences: int,
    length: int,
    k: int,
    draft_generator: torch.Generator,
    verify_generator: torch.Generator,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    timeout: float | None = None,
    initial_contexts: torch.Tensor | None = None,
) -> Generation:
    """``n_sequences`` independent sequences of ``length`` tokens from speculative decoding.

    ``model``: a Model (called through the contract) or a verify call (a property run's, which
    also accounts the implementation's time). ``initial_contexts`` [n]: the context each row
    starts in (default: start of sequence); the tokens returned are the ones generated after it."""
    call = partial(call_verify, model, timeout=timeout) if isinstance(model, Model) else model
    target_table = as_tensor(target, device=device, dtype=dtype)
    draft_table = as_tensor(draft, device=device, dtype=dtype)
    tokens = torch.full((n_sequences, length + k + 1), PAD, dtype=torch.int64, device=device)
    lengths = torch.zeros(n_sequences, dtype=torch.int64, device=device)
    slots = torch.arange(k + 1, device=device)
    passes, per_pass, pass_rows, pass_contexts = 0, [], [], []
    first = (
        torch.full((n_sequences,), target.start, dtype=torch.int64, device=device)
        if initial_contexts is None
        else initial_contexts.to(device)
    )
    while (rows := unfinished(tokens, lengths, length)) is not None:
        active, filled, last = rows
        context = torch.where(filled > 0, last, first[active])
        pass_contexts.append(context)
        pass_rows.append(active)
        contexts, drafts, draft_rows = [context], [], []
        for _ in range(k):
            q = draft_table[context]
            context = sample_categorical(q, draft_generator)
            draft_rows.append(q)
            drafts.append(context)
            contexts.append(context)
        draft_ids = torch.stack(drafts, dim=1)
        target_probs = target_table[torch.stack(contexts, dim=1)]
        emitted = call(draft_ids, torch.stack(draft_rows, dim=1), target_probs, verify_generator)
        present = emitted != PAD
        where = filled.unsqueeze(1) + slots
        row_index = active.unsqueeze(1).expand_as(where)
        tokens[row_index[present], where[present]] = emitted[present]
        count = present.sum(dim=1)
        lengths[active] += count
        per_pass.append(count)
        passes += 1
    return Generation(tokens[:, :length], passes, torch.cat(per_pass), torch.cat(pass_rows), torch.cat(pass_contexts))


def sequence_index(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Row-major cell index of each sequence, matching MarkovChain.sequence_probs."""
    weights = vocab_size ** torch.arange(tokens.shape[1] - 1, -1, -1, device=tokens.device)
    return (tokens * weights).sum(dim=1)


# (parents, draft_token_ids, draft_probs, target_probs, generator) -> (path, token)
VerifyTreeCall = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]
]


@dataclass
class TreeGeneration:
    tokens: torch.Tensor  # [n, length] int64
    passes: int


def generate_tree(
    call: VerifyTreeCall,
    target: MarkovChain,
    draft: MarkovChain,
    parents: torch.Tensor,
    drafting: str,
    *,
    n_sequences: int,
    length: int,
    draft_generator: torch.Generator,
    verify_generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
) -> TreeGeneration:
    """``n_sequences`` sequences of ``length`` tokens through repeated tree passes: row r drafts
    the tree ``parents[r % S]`` from its last token (as ``drafting`` says) and appends the
    accepted path's tokens and the extra token."""
    device = parents.device
    shapes = parents.shape[0]
    shape_depths = depths(parents)
    deepest = int(shape_depths.max())
    tables = {
        side: torch.as_tensor(chain.table, dtype=torch.float64, device=device)
        for side, chain in (("target", target), ("draft", draft))
    }
    typed = {(side, dtype): table.to(dtype) for side, table in tables.items()}
    tokens = torch.full((n_sequences, length + deepest + 1), PAD, dtype=torch.int64, device=device)
    lengths = torch.zeros(n_sequences, dtype=torch.int64, device=device)
    passes = 0
    while (rows := unfinished(tokens, lengths, length)) is not None:
        active, filled, last = rows
        a = active.numel()

        model = TreeModel(
            parents=parents[active % shapes],
            depth=shape_depths[active % shapes],
            context=torch.where(filled > 0, last, target.start),
            target=tables["target"].expand(a, deepest + 1, *tables["target"].shape),  # views, no copies
            draft=tables["draft"].expand(a, deepest + 1, *tables["draft"].shape),
            drafting=drafting,
            converted={key: table.expand(a, deepest + 1, *table.shape) for key, table in typed.items()},
        )
        trees = draft_trees(model, 1, draft_generator, dtype)
        root = trees.tokens[:, 0]
        trees.tokens[:, 0] = torch.where(root == target.start, 0, root)  # a token id even at the start
        path, token = call(trees.parents, trees.tokens, trees.draft_probs, trees.target_probs, verify_generator)
        accepted = (path != PAD).sum(dim=1)
        emitted = torch.cat([trees.tokens.gather(1, path.clamp_min(0)), token.unsqueeze(1)], dim=1)
        emitted[torch.arange(a, device=device), accepted] = token
        slots = torch.arange(emitted.shape[1], device=device)  # this batch's trees may be shallower
        present = slots.unsqueeze(0) <= accepted.unsqueeze(1)
        where = filled.unsqueeze(1) + slots
        row_index = active.unsqueeze(1).expand_as(where)
        tokens[row_index[present], where[present]] = emitted[present]
        lengths[active] += accepted + 1
        passes += 1
    return TreeGeneration(tokens[:, :length], passes)
