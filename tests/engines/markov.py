"""A fast, exact engine for the harness's own tests: speculative decoding over logit tables.

The target and the draft are order-1 Markov models over V = 48 tokens whose next-token logits
depend on the last token (seeded random tables, scaled so the distributions are neither flat nor
one-hot; the draft is the target plus noise). Each request decodes on its own generator (its
seed, or one derived from the run's seed and its row): K draft tokens from the processed draft,
one ``verify_logits`` call of the reference sampler with the request's parameters. Exact by
construction, about a millisecond a request: the end-to-end properties' known-correct subject
when transformers is too slow for a test.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np
import torch

from spectest.implementations.reference import ExtraToken, row_uniforms, verify_at
from spectest.implementations.sampler import REFERENCE
from spectest.sampling import make_generator, sample_categorical
from spectest.sampling_params import DEFAULT_ORDER, NO_SEED, SamplingParams, process_logits

VOCAB = 48
K = 3

_PROCESSED = threading.local()  # per thread: a server shim generates on several threads at once


def processed_row(table, context: int, one: SamplingParams, order: tuple[str, ...] = DEFAULT_ORDER) -> torch.Tensor:
    """The processed distribution after ``context`` under one request's parameters ``one``. A table held whole is
    processed in one call, every row at once, on the request's first draw, and kept while it draws (a pass drafts K
    tokens and each would otherwise pay a whole call's overhead for one 48-entry row); each filter works row by row,
    so a row is what processing it alone gives (tests/test_e2e_output.py holds the two bit for bit). A lazy
    table (a real vocabulary) keeps each row it processed instead."""
    memo = _PROCESSED.__dict__
    if memo.get("one") is not one:  # a new request: what was kept was processed for another
        memo.clear()
        memo["one"] = one  # held, so that its id is not reused while kept
    key = (id(table), order)
    if key not in memo:
        memo[key] = process_logits(table.unsqueeze(0), one, order=order)[0] if isinstance(table, torch.Tensor) else {}
    rows = memo[key]
    if isinstance(rows, dict) and context not in rows:
        rows[context] = process_logits(table[context].view(1, 1, -1), one, order=order).view(-1)
    return rows[context]


class MarkovEngine:
    spectest_engine_capabilities = frozenset({"seeded", "batch-invariant", "standard-rejection"})

    def __init__(self, *, vocab: int = VOCAB, k: int = K, seed: int = 0, noise: float = 1.0) -> None:
        rng = np.random.default_rng(seed)
        self.vocab_size, self.k = vocab, k
        target = rng.normal(0.0, 2.5, size=(vocab, vocab))
        self.target = torch.as_tensor(target)
        self.draft = torch.as_tensor(target + rng.normal(0.0, noise, size=(vocab, vocab)))
        self.passes: list[int] | None = None
        self.tokens_per_pass: list[list[int]] | None = None
        self.draft_lengths: list[list[int]] | None = None

    def request_seed(self, params: SamplingParams, row: int, seed: int) -> int:
        own = int(params.seed[row])
        return own if own != NO_SEED else zlib.crc32(f"{seed}:{row}".encode())

    def verify(self, drafts, draft_logits, target_logits, params, generator):
        """The verifier of the loop (the known-buggy variants in tests/ replace it)."""
        return REFERENCE.verify_logits(drafts, draft_logits, target_logits, params, generator=generator)

    def generate(self, prompts, params, max_new_tokens, seed):
        outputs, passes, tokens, drafts = [], [], [], []
        for row, prompt in enumerate(prompts):
            one = params.take(torch.tensor([row]))
            one = SamplingParams(**{**one.__dict__, "seed": torch.tensor([NO_SEED])})
            generator = make_generator(self.request_seed(params, row, seed))
            out, emitted, proposed = list(prompt), [], []
            while len(out) < len(prompt) + max_new_tokens:
                k = min(self.k, len(prompt) + max_new_tokens - len(out) - 1)
                new = self.one_pass(out, k, one, generator)
                out += new
                emitted.append(len(new))
                proposed.append(k)
            outputs.append(out[len(prompt) :])
            passes.append(len(emitted))
            tokens.append(emitted)
            drafts.append(proposed)
        self.passes, self.tokens_per_pass, self.draft_lengths = passes, tokens, drafts
        return outputs

    def one_pass(self, out: list[int], k: int, one: SamplingParams, generator) -> list[int]:
        """The tokens one pass after ``out`` emits: ``k`` drafts verified by ``verify`` (k = 0: the
        last token, one plain step from the processed target)."""
        if k == 0:
            p = processed_row(self.target, out[-1], one)
            return [int(sample_categorical(p.unsqueeze(0), generator))]
        context, processed, drafted = out[-1], [], []
        for _ in range(k):
            q = processed_row(self.draft, context, one)
            token = int(sample_categorical(q.unsqueeze(0), generator))
            processed.append(q)
            drafted.append(token)
            context = token
        if type(self).verify is MarkovEngine.verify:
            # The reference's verify_logits without processing the rows again: its chain on the rows already processed
            # for this request (bit for bit what it would process; tests/test_e2e_output.py holds the tokens equal).
            p = torch.stack([processed_row(self.target, c, one) for c in [out[-1], *drafted]]).unsqueeze(0)
            u, v = row_uniforms(one, k, generator, device=p.device, dtype=p.dtype)
            result = verify_at(torch.tensor([drafted]), torch.stack(processed).unsqueeze(0), p, u, ExtraToken(v))[0]
        else:  # a verifier of its own (the known-buggy variants) gets the logits
            draft_rows = self.draft[torch.tensor([out[-1], *drafted[:-1]])].unsqueeze(0)
            target_rows = self.target[torch.tensor([out[-1], *drafted])].unsqueeze(0)
            result = self.verify(torch.tensor([drafted]), draft_rows, target_rows, one, generator)[0]
        return [int(x) for x in result if int(x) >= 0]

    @staticmethod
    def _rows(table: torch.Tensor, sequences) -> torch.Tensor:
        """[N, L, V]: the table's row after every token of each sequence (zeros past its end)."""
        longest = max(len(s) for s in sequences)
        out = torch.zeros((len(sequences), longest, table.shape[1]), dtype=torch.float64)
        for i, s in enumerate(sequences):
            out[i, : len(s)] = table[torch.tensor(s)]
        return out

    def target_logits(self, sequences):
        return self._rows(self.target, sequences)

    def draft_logits(self, sequences):
        return self._rows(self.draft, sequences)


class TemperatureOnlyOnDraft(MarkovEngine):
    """The loop hands the verifier the target's raw logits at temperature 1 for every request
    (its parameters reach the draft only)."""

    def verify(self, drafts, draft_logits, target_logits, params, generator):
        from spectest.implementations.reference import row_uniforms, verify_at
        from spectest.sampling import inverse_cdf_blocked

        p = torch.softmax(target_logits, dim=-1)
        q = process_logits(draft_logits, params)
        u, v = row_uniforms(params, drafts.shape[1], generator, device=drafts.device, dtype=p.dtype)
        return verify_at(drafts, q, p, u, lambda weights: inverse_cdf_blocked(weights, v))


class TokenMatchMarkov(MarkovEngine):
    """Exact, but not standard rejection: the loop llama.cpp and MLX-LM run. Each pass drafts K tokens
    from the processed draft, then samples the processed target at each drafted position in turn and
    keeps a draft while it equals the target's sample (a mismatch emits the sample; K matches earn a
    bonus). Every token is the target's own draw, so the output is exact, but a draft is accepted with
    chance sum p q, not sum min(p, q): the tokens-per-pass property measures its efficiency."""

    spectest_engine_capabilities = frozenset({"seeded", "batch-invariant"})

    def one_pass(self, out: list[int], k: int, one: SamplingParams, generator) -> list[int]:
        def draw(table, context):
            return int(sample_categorical(processed_row(table, context, one).unsqueeze(0), generator))

        drafted = []
        for _ in range(k):
            drafted.append(draw(self.draft, drafted[-1] if drafted else out[-1]))
        new = []
        for token in [*drafted, None]:
            sample = draw(self.target, new[-1] if new else out[-1])
            new.append(sample)
            if sample != token:
                break
        return new


class CountingMarkov(MarkovEngine):
    """Exact, and reports only what vLLM counts: after each call, ``pass_counts`` (passes that verified
    drafts and the drafts they verified), nothing per pass. vLLM's schedule: the prompt's own pass samples
    the first token with no drafts (``spectest_first_token = "prefill"``), every later pass drafts K tokens
    even near the end (what it emits past ``max_new_tokens`` is cut)."""

    spectest_first_token = "prefill"

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.pass_counts: dict[str, int] | None = None

    def generate(self, prompts, params, max_new_tokens, seed):
        outputs, passes = [], 0
        for row, prompt in enumerate(prompts):
            one = params.take(torch.tensor([row]))
            one = SamplingParams(**{**one.__dict__, "seed": torch.tensor([NO_SEED])})
            generator = make_generator(self.request_seed(params, row, seed))
            out = list(prompt)
            out += self.one_pass(out, 0, one, generator)
            while len(out) < len(prompt) + max_new_tokens:
                out += self.one_pass(out, self.k, one, generator)
                passes += 1
            outputs.append(out[len(prompt) : len(prompt) + max_new_tokens])
        self.pass_counts = {"passes": passes, "draft_tokens": passes * self.k}
        return outputs


class DropsTheBonus(CountingMarkov):
    """Exact output, wasted passes: when all K drafts are accepted the loop throws the bonus token away
    and runs the next pass from there (the cut is decided by what came before it, so every emitted token
    still follows the target). Only the passes it counts show it."""

    def one_pass(self, out, k, one, generator):
        new = super().one_pass(out, k, one, generator)
        return new[:k] if k and len(new) == k + 1 else new


class CountingTokenMatch(CountingMarkov, TokenMatchMarkov):
    """The token-match loop (llama.cpp's, MLX-LM's) counting like vLLM: exact, not standard rejection."""

    spectest_engine_capabilities = frozenset({"seeded", "batch-invariant"})


class LosesTopK(MarkovEngine):
    """A server that loses top-k between its HTTP layer and its sampler: every request samples, drafts
    and verifies as if it had asked for no top-k (its other parameters arrive)."""

    def generate(self, prompts, params, max_new_tokens, seed):
        lost = SamplingParams(**{**params.__dict__, "top_k": torch.zeros_like(params.top_k)})
        return super().generate(prompts, lost, max_new_tokens, seed)


markov = MarkovEngine()
temperature_only_on_draft = TemperatureOnlyOnDraft()
token_match = TokenMatchMarkov()
counting = CountingMarkov()
drops_the_bonus = DropsTheBonus()
counting_token_match = CountingTokenMatch()
loses_top_k = LosesTopK()


class LazyRows:
    """A [V, V] logit table whose rows are drawn when read (seeded by the context, float32): a real
    vocabulary's table (128256^2) would not fit, and a request only ever reads a few rows. The last
    few rows read are kept (a pass reads its context's row for the draft and again for the target)."""

    KEPT = 64

    def __init__(self, vocab: int, seed: int, scale: float, noise: float = 0.0) -> None:
        self.shape = (vocab, vocab)
        self.seed, self.scale, self.noise = seed, scale, noise
        self.kept: dict[int, torch.Tensor] = {}

    def row(self, context: int) -> torch.Tensor:
        if context not in self.kept:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + context)
            logits = self.scale * torch.randn(self.shape[1], generator=generator)
            if self.noise:
                logits += self.noise * torch.randn(self.shape[1], generator=generator)
            if len(self.kept) >= self.KEPT:
                self.kept.pop(next(iter(self.kept)))
            self.kept[context] = logits
        return self.kept[context]

    def __getitem__(self, index):
        if isinstance(index, torch.Tensor) and index.dim() > 0:
            return torch.stack([self.row(int(i)) for i in index])
        return self.row(int(index))


class LargeVocabularyMarkov(MarkovEngine):
    """The exact Markov engine at Llama 3's vocabulary (V = 128256): softmax of Gaussian logits at scale
    2 after every context, the draft the target plus as much noise again and half (it is accepted about a
    third of the time, so most first tokens are corrections: the verifier's own sampler draws them)."""

    def __init__(self, *, vocab: int = 128256, k: int = K, seed: int = 0) -> None:
        self.vocab_size, self.k = vocab, k
        self.target = LazyRows(vocab, seed, 2.0)
        self.draft = LazyRows(vocab, seed, 2.0, noise=3.0)
        self.passes = self.tokens_per_pass = self.draft_lengths = None


class Bf16PrefixSumsAtLargeVocabulary(LargeVocabularyMarkov):
    """The large-vocabulary engine whose verifier draws the correction and the bonus by an inverse CDF
    over prefix sums stored in bfloat16 (tests/verifiers/buggy_inputs.py): about 1 in 100 of its 128256
    ids can ever be emitted after a rejection or as a bonus."""

    def verify(self, drafts, draft_logits, target_logits, params, generator):
        from spectest.implementations.reference import row_uniforms, verify_at

        p, q = process_logits(target_logits, params), process_logits(draft_logits, params)
        u, v = row_uniforms(params, drafts.shape[1], generator, device=drafts.device, dtype=p.dtype)

        def sample(weights):
            cdf = weights.float().cumsum(-1).to(torch.bfloat16).float()
            point = v.float()[:, None] * cdf[:, -1:]
            return torch.searchsorted(cdf, point, right=True).clamp(max=weights.shape[-1] - 1).squeeze(1)

        return verify_at(drafts, q, p, u, sample)


large_vocabulary = LargeVocabularyMarkov()
bf16_prefix_sums_at_large_vocabulary = Bf16PrefixSumsAtLargeVocabulary()
