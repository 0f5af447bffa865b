"""Reproduction without spectest: greedy completions of ``mlx_lm.server`` with a draft model against
greedy decoding of the same target in transformers (float32), one request at a time.

The tiny seeded pair (spectest's cache), ``python -m mlx_lm server --model T --draft-model D
--num-draft-tokens 4`` on loopback, then, with no draft, the control. Text prompts of the pair's own
characters (each encodes to one id after the word marker), ``temperature 0``, EOS kept out by
``logit_bias``; each completion's ids (from ``logprobs``) are compared with transformers' argmax
decoding of the same ids. Prints how many of the requests agree (and which, in the order sent: the first
request on a fresh server has no prompt cache to reuse), and the first disagreement.

    .venv-native/bin/python tests/engines/repro/mlx_lm_server_greedy_with_draft.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from spectest.e2e import tiny_pair
from tests.engines.servers import mlx_server

REQUESTS, NEW_TOKENS = 24, 16


def transformers_greedy(model, ids: list[int], n: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([out])).logits[0, -1]
            logits[2] = -float("inf")  # EOS, as the server's logit_bias masks it
            out.append(int(torch.argmax(logits)))
    return out[len(ids) :]


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pair = tiny_pair.pair(0)
    tokenizer = AutoTokenizer.from_pretrained(str(pair.target))
    model = AutoModelForCausalLM.from_pretrained(str(pair.target), dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    characters = tiny_pair.CHARACTERS.replace(" ", "").replace("▁", "")
    texts = ["".join(rng.choice(list(characters), size=int(rng.integers(1, 9)))) for _ in range(REQUESTS)]
    for name, draft in (("draft model, 4 tokens", str(pair.draft)), ("no draft (control)", None)):
        with mlx_server(str(pair.target), draft, f"/tmp/mlx-repro-{'draft' if draft else 'off'}.log") as url:
            agree, first, pattern = 0, None, ""
            for text in texts:
                body = {"prompt": text, "max_tokens": NEW_TOKENS, "temperature": 0.0, "logprobs": True,
                        "logit_bias": {"2": -1e9}, "seed": 0}  # fmt: skip
                reply = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
                got = [int(e["id"]) for e in reply["choices"][0]["logprobs"]["content"]]
                ids = tokenizer.encode(text)
                want = transformers_greedy(model, ids, NEW_TOKENS)
                agree += got == want
                pattern += "=" if got == want else "x"
                if got != want and first is None:
                    at = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
                    first = f"prompt {text!r} (ids {ids}): position {at + 1} server {got[at]}, transformers {want[at]}"
            print(
                f"mlx_lm.server, {name}: {agree}/{len(texts)} greedy completions equal transformers' greedy decoding (in order: {pattern})"
            )
            if first:
                print(f"  first disagreement: {first}")


if __name__ == "__main__":
    main()
