"""Reproduction without spectest: EAGLE 1.2.1's tree sampler (``eagle-llm`` on the registry,
``eagle/model/utils.py``'s ``evaluate_posterior``) draws the token after a fully accepted path from the target's raw
logits, without the temperature that every other step applies.

One tree, the smallest: the root and one child, vocabulary 4. The draft proposes the child's token from q; the
target's raw logits z give p = softmax(z / T) at each node. Each of 40,000 draws runs the wheel's
``generate_tree_buffers``, ``generate_candidates`` and ``evaluate_posterior`` as ``ea_model.py`` calls them (the
draft head's outputs laid out as ``cnets.Model.sample`` returns them) and the final ``torch.multinomial(sample_p,
1)`` of ``update_inference_inputs``. Prints, at T = 1 and T = 0.7, the distribution of the second emitted token
when the first was the accepted draft (it must be p at the child) against p there, and their total variation
distance: about 0 at T = 1, and at T = 0.7 the TV between p and norm(p ** 0.7), which is what comes out.

    .venv/bin/pip install --no-deps eagle-llm==1.2.1
    .venv/bin/python tests/engines/repro/eagle_bonus_temperature.py

EAGLE's repository applies the processor there since 2025-04 (commit bf10ac5, "Update utils.py"); the wheel on the
registry (1.2.1) predates it.
"""

from __future__ import annotations

import importlib.util
import random

import torch

found = importlib.util.find_spec("eagle")
path = next(p for p in found.submodule_search_locations)  # the installed package, not imported: its __init__ is heavy
spec = importlib.util.spec_from_file_location("eagle_utils", f"{path}/model/utils.py")
eagle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(eagle)

DRAWS, VOCAB = 40_000, 4
Q_ROOT = torch.tensor([0.1, 0.6, 0.2, 0.1])  # the draft at the root: the child's token is drawn from it
P_ROOT = torch.tensor([0.05, 0.7, 0.15, 0.1])  # the target at the root (after temperature)
P_CHILD = torch.tensor([0.5, 0.3, 0.15, 0.05])  # the target after the child: the bonus must follow it


def emitted(temperature: float, generator: torch.Generator) -> torch.Tensor:
    """[DRAWS, 2]: the first two emitted tokens of each draw (-1 where only one came out)."""
    processor = eagle.prepare_logits_processor(temperature=temperature)
    buffers = eagle.generate_tree_buffers([[0]], device="cpu")
    # Raw logits z with softmax(z / T) = p at the root and at the child (EAGLE's nodes 0 and 1).
    logits = temperature * torch.log(torch.stack([P_ROOT, P_CHILD]))[buffers["retrieve_indices"]]
    out = torch.full((DRAWS, 2), -1, dtype=torch.int64)
    random.seed(1)
    for draw in range(DRAWS):
        child = int(torch.multinomial(Q_ROOT, 1, generator=generator))
        tokens = torch.zeros((1, eagle.TOPK), dtype=torch.int64)
        probs = torch.zeros((1, eagle.TOPK))
        tokens[0, 0], probs[0, 0] = child, Q_ROOT[child]  # the first sibling: q(x) / (1 - 0)
        candidates, candidates_prob, tree_candidates = eagle.generate_candidates(
            (tokens, probs, [Q_ROOT[None]]),
            buffers["tree_indices"],
            buffers["retrieve_indices"],
            torch.zeros((1, 1), dtype=torch.int64),
            processor,
        )
        _, accepted, sample_p = eagle.evaluate_posterior(
            logits,
            candidates,
            processor,
            candidates_prob,
            [Q_ROOT[None]],
            buffers["p_indices"],
            tree_candidates,
            buffers["b_indices"],
        )
        extra = int(torch.multinomial(sample_p, 1, generator=generator))
        out[draw] = torch.tensor([child, extra] if int(accepted) == 1 else [extra, -1])
    return out


def main() -> None:
    generator = torch.Generator().manual_seed(7)
    for temperature in (1.0, 0.7):
        out = emitted(temperature, generator)
        after = out[out[:, 1] >= 0, 1]
        seen = torch.bincount(after, minlength=VOCAB).double() / after.numel()
        tv = 0.5 * float((seen - P_CHILD.double()).abs().sum())
        raw = torch.softmax(temperature * torch.log(P_CHILD), dim=0)
        tv_raw = 0.5 * float((raw - P_CHILD).abs().sum())
        print(
            f"T = {temperature}: {after.numel()} of {DRAWS} draws accepted the child; the token after it "
            f"{[round(x, 4) for x in seen.tolist()]} against p there {P_CHILD.tolist()}: TV {tv:.4f} "
            f"(softmax of the raw logits, norm(p ** T): {[round(x, 4) for x in raw.tolist()]}, TV {tv_raw:.4f}; "
            f"sampling error about {0.5 * VOCAB * (0.25 / after.numel()) ** 0.5:.4f})"
        )


if __name__ == "__main__":
    main()
