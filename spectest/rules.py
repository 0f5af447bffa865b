"""Every rule and check the harness can fail an implementation with, named once.

A failure names one of these (the results file's ``failure.rule``), the properties raise them,
and the meta-tests assert that each known-buggy verifier is caught by the one its bug breaks.
Exact rules need no statistics; checks are distribution checks at the run's significance level.
"""

from __future__ import annotations

# The output contract of every call (spectest.protocol)
RETURNS_A_TENSOR = "returns a tensor"
OUTPUT_SHAPE = "output shape is [B, K+1]"
OUTPUT_DTYPE = "output dtype is int64"
OUTPUT_DEVICE = "output on the input device"
IDS_IN_RANGE = "ids lie in [0, V) or are -1 padding"
TOKENS_THEN_PADDING = "tokens then -1 padding, at least one token"
ACCEPTED_ARE_DRAFTS = "accepted tokens are the draft prefix"
RAGGED_LENGTH = "a row with n drafts emits at most n + 1 tokens"
DOES_NOT_RAISE = "does not raise"
RETURNS_IN_TIME = "returns in time"
PROPOSE_SHAPES = "propose returns (draft_token_ids int64 [B, K], draft_probs [B, K, V])"
DRAFTED_IDS_IN_RANGE = "drafted ids lie in [0, V)"
DRAFT_PROBS_ARE_DISTRIBUTIONS = "draft_probs are distributions"
TREE_OUTPUT_SHAPES = "verify_tree returns (path int64 [B, D], token int64 [B])"
PATH_FOLLOWS_THE_TREE = "the path is a chain from the root under parents, then -1 padding"
COUNTERS_SHAPES = "spectest_counters returns int [B] tensors: emitted_drafts, optionally accepted_drafts"
COUNTED_EMITTED_DRAFTS = "the emitted-drafts counter equals the accepted prefix the output shows"
COUNTED_ACCEPTED_DRAFTS = "the accepted-drafts counter lies between the emitted drafts and the row's draft count"

# Exact rules of the properties
NEVER_IMPOSSIBLE = "never emits a token the target gives probability zero"
NEVER_DRAFTS_IMPOSSIBLE = "never drafts a token it reported probability zero for"
REJECTION_LENGTH = "a rejection at position k emits exactly k + 1 tokens"
CORRECTION_FROM_RESIDUAL = "the correction at a rejection comes from norm(max(0, p - q))"
EQUAL_DRAFTS_ACCEPTED = "drafts with p = q are always accepted"
DETERMINISTIC = "every random draw uses the generator passed in"
INPUTS_UNMODIFIED = "inputs are not modified"
COUPLING_BOUND = "lossless: never beats the maximal-coupling bound"
GREEDY_IS_ARGMAX = "temperature 0 rows equal greedy decoding of the target"
DRAFT_PROBS_DETERMINISTIC = "draft_probs depend only on the inputs"
SEEDED_ROWS = "a seeded row's output depends only on the row and its seed"
SPEEDUP_AGREES = "the measured speedup is within 10% of the model with the implementation's own costs"
PASS_COST_FLOOR = "no pass costs less than with a free verifier"
EFFICIENT_PASS = "a pass costs at most the speed gate's multiple of an efficient pass"
FORCED_PATH = "a path the target forces is taken to its leaf"
NEVER_ACCEPTS_IMPOSSIBLE_NODE = "a node whose token the target gives probability zero is never accepted"

# Distribution checks (statistical)
JOINT = "joint sequence distribution"
PER_POSITION = "per-row, per-position distribution"
BONUS = "bonus-token distribution"
TOKENS_PER_CALL = "tokens emitted per call"
TOKENS_PER_PASS = "tokens per pass by start context"
REPORTED_DRAFTS = "drafted tokens against the reported draft_probs"
PER_NODE = "per-row, per-node distribution of the token after each reached node"
TREE_JOINT = "joint sequence distribution through tree passes"
TREE_TOKENS_PER_PASS = "accepted depth per tree pass, per row, against the exact tree model"
BLOCK_TOKENS_PER_CALL = "tokens emitted per call, against the exact block-verification model"
AT_LEAST_TOKEN_WISE = "accepts at least as many tokens per call as token-wise verification"

# End to end (spectest.e2e): an engine's generation loop against its own target model
E2E_OUTPUT = "generate returns max_new_tokens ids in [0, V) for every prompt"
E2E_LOGITS = "target_logits and draft_logits return float [N, L, V] without NaN"
E2E_PASSES = "passes, tokens_per_pass and draft_lengths hold one entry per prompt"
E2E_SEEDED = "the same seed reproduces the output"
E2E_BATCH_INVARIANT = "a seeded request's output does not depend on the rest of the batch"
PIT_BY_ID_AT_POSITION = "PIT by token id, grouped by position in the generation"
PIT_BY_PROBABILITY_AT_POSITION = "PIT by decreasing probability, grouped by position in the generation"
PIT_BY_ID_AT_OFFSET = "PIT by token id, grouped by offset in the speculative pass"
PIT_BY_PROBABILITY_AT_OFFSET = "PIT by decreasing probability, grouped by offset in the speculative pass"
PIT_BY_RATIO_AT_POSITION = "PIT by draft/target ratio, grouped by position in the generation"
PIT_BY_RATIO_AT_OFFSET = "PIT by draft/target ratio, grouped by offset in the speculative pass"
FIRST_TOKENS = "first tokens of one prompt repeated across a batch follow the processed target"
TWIN = "the output follows a twin endpoint without speculation, position by position"
PIT_CHECKS = (
    PIT_BY_ID_AT_POSITION,
    PIT_BY_PROBABILITY_AT_POSITION,
    PIT_BY_RATIO_AT_POSITION,
    PIT_BY_ID_AT_OFFSET,
    PIT_BY_PROBABILITY_AT_OFFSET,
    PIT_BY_RATIO_AT_OFFSET,
)

# Lossy mode (spectest.statistics.tv): these checks compare the output with the target; for a model
# that declares a maximum TV they measure the distance instead of testing exactness.
OUTPUT_DISTRIBUTIONS = frozenset({JOINT, PER_POSITION, BONUS, PER_NODE, TREE_JOINT})
WITHIN_MAX_TV = "output stays within the declared maximum TV distance of the target"

# End to end, speed: tokens per pass and the engine's measured speedup
ACCEPTANCE_TRIALS = "acceptance of each draft against sum_x min(p, q) along the engine's contexts, by offset"
PASS_COUNTS = "the passes an engine counts follow the exact law of standard rejection along its own output"
E2E_SPEEDUP_AGREES = "the engine's measured speedup is within 10% of the model with its own measured costs"
