"""Every internal constant, each with what set it: a measurement (its results run; runs
the docs no longer cite are in git history) or "unmeasured" and why. Units: seconds,
tokens, steps, rounds, plain steps (a step without drafts at that batch = 1).
"""

# -- k ----------------------------------------------------------------------------
# The adaptive ceiling. 2026-11-26, hybrid + adaptive, unique code and chat, c = 1 and
# 16, 2 reps (run e515836-...-kceiling): 8, 16, 32 within the spread on both pairs (bench c = 1:
# 2.39 / 2.47 / 2.44x), 4 lower (2.24x); bench c = 4 / 8 / 16 (run d6bce0d): 32 read
# 1.15 / 1.03 / 0.99x, 8 1.25 / 1.04 / 0.99x.
K_CEILING = 8
MAX_K = 32  # the largest ceiling measured

# -- the step policy (control/policy.py) ----------------------------------------
# A step verifies only if predicted to emit this share more per second than a plain one.
# As ``step_min_gain``, 0.02 against 0.10 (2026-11-29, smol chat c = 8 / 16, 3 reps, run
# 4ad05ca): 0.10 lost 1-4 % throughput in 5 of 6 paired reps, sparing no request; 0.02
# covers the fit's noise.
MIN_GAIN = 0.02
# Default ``tpot_limit``: a row that gains nothing may be slowed 5 % over its life
# (CREDIT_MAX), so it takes that ratio end to end: the stricter serving bound (e2e p99 <=
# 1.05x, TPOT p99 <= 1.10x). The old row ledger at 0.02 / 0.05 / 0.2 (runs 70b0180,
# a0fd98d, 7f84392) traded 4-17 points of throughput at c = 8 for TPOT p99.
TPOT_LIMIT = 1.05
# Default ``ttft_limit``: speculation may lengthen a first token's wait by 5 %, 2.5 % in
# each of the two steps it waits for (the running one, its prefill): the old
# ``ttft_slack``, against 0 and 0.05 (runs ccab505, 99870aa, 70b0180: chat c = 8 TTFT
# p50 1.12x against 0.05's 1.18x, throughput the same).
TTFT_LIMIT = 1.05
# The most time-per-token budget a request may save or owe (plain steps): no step slows
# a row by more than tpot_limit + this, a catch-up included. Unmeasured against other
# values; served since 2026-11-27 (runs 1b3830b, 2f186c3). As the catch-up's bound,
# rounds of 0.1-0.3 s stalling chat c = 8 went from 4, 0, 2 a cell to 0, 0, 1 (run 2017683).
CREDIT_MAX = 1.0

# -- acceptance (control/acceptance.py) --------------------------------------------
PRIOR_ALPHA = 0.6   # unmeasured: a middling α for a draft of the target's family, before any round
PRIOR_WEIGHT = 4.0  # unmeasured: a prior counts as 4 trials, so one round already moves α̂
ALPHA_DECAY = 0.9   # unmeasured: ~10 rounds of a request's own memory
SCOPE_DECAY = 0.98  # unmeasured: ~50 rounds over a scope's requests (old: 0.9 per step with rounds)
MATCH_DECAY = 0.98  # unmeasured: ~50 rounds per n-gram match bucket
ALPHA_MAX = 0.999   # unmeasured: α̂ never claims certainty, so a rejection always pulls it down
PROBE_EVERY = 8     # unmeasured: steps before held rows are probed (k = 1) again
PROBE_MAX = 128     # unmeasured: probing costs at most ~1 step in 128 where nothing pays

# -- the cost fits (control/cost.py) ------------------------------------------------
C_PRIME_DRAFT = 0.05   # unmeasured: a draft pass / a plain step until measured (a draft ~20x smaller)
DRAFT_FIT_DECAY = 0.8  # unmeasured: ~5 rounds of memory for the draft and catch-up fits
STEP_FIT_DECAY = 0.99  # unmeasured: ~100 steps of memory for the target fit
SIGMA_FIT_DECAY = 0.95  # unmeasured: ~20 verifying steps of memory for σ
# The target fit solves at most every 8 steps (each step: 7 % of propose()'s host time at
# chat c = 16; served logs replayed moved median predicted / measured by <= 0.004, run
# 2c3818b), and at once after a step it mispredicted by over 2x (steady load: 0.80-1.55,
# p10-p90; a young fit in a start burst read 9-22x and priced all at k = 8, run 2fd7db6).
STEP_FIT_SOLVE_EVERY = 8
STEP_FIT_SURPRISE = 2.0
A_MIN = 1e-6  # numerical floor (s) of the fitted intercept, so T(B) > 0
OUTPUT_WINDOW = 32  # unmeasured: a scope's median of its last 32 answers bounds a catch-up's horizon
FIT_LOG_S = 60.0    # unmeasured: the cost fit is logged at most once a minute

# -- the host-time term (control/policy.py, PlanningCost) --------------------------
# On against off (the old host_gate), smol chat c = 64, 3 reps (run abc3516): 1.00x
# against 0.97x no speculation's throughput; c = 16 the same (run b55b3a0).
HOST_DECAY = 0.95     # unmeasured: ~20 planned steps of memory per batch bucket
HOST_MIN_STEPS = 8.0  # unmeasured: planned steps a bucket needs before it may be skipped

# -- n-gram drafts (ngram.py, ngram_corpus.py, shadow.py) ---------------------------
# A follower's confidence: count / (occurrences + NGRAM_PRIOR); a chain stops before the
# product falls below NGRAM_MIN_PROB. 320 greedy smol answers replayed beside suffix (run
# ngram-confidence-replay): 0.5 and 0.1 gave 1.760 / 1.630 / 1.452 / 1.191 tokens per
# verify cost at c' = 0.02 / 0.05 / 0.1 / 0.2 (suffix 1.720 / 1.630 / 1.499 / 1.291);
# served at c = 1 1.04x (smol) and 1.07x (bench) suffix's throughput (run 666f68e).
NGRAM_PRIOR = 0.5
NGRAM_MIN_PROB = 0.1
# The longest context matched: 8 read 3.10 against 4's 2.98 accepted tokens a round
# replayed, the same served at c = 8 / 16 (bench, unique code, run 381f27b).
NGRAM_MAX_N = 4
NGRAM_MIN_N = 1        # unmeasured: a one-token context is a match, priced by its bucket
NGRAM_WINDOW = 1024    # unmeasured: a request's own lookup searches its last 1,024 tokens
SHADOW_K = 8           # unmeasured: drafts per shadow proposal
SHADOW_ROWS = 4        # unmeasured: new shadow proposals per step (one lookup each)

# -- the draft model (draft/, kv.py) --------------------------------------------------
BLOCK_SIZE = 32  # tokens per draft KV block: vLLM's CPU attention takes multiples of 32
# Text both tokenizers must encode identically (start-up check): code and non-ASCII.
TOKENIZER_PROBE = "def speculate(x):\n    return x ** 2  # naïve café €5 日本"
