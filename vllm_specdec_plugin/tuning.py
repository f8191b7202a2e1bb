"""Every tuning constant of the plugin, in one place (pure Python, no imports).

Each line says what set the value. Where no measurement did, it says "not measured"
and why the value was chosen. Units: seconds, tokens, steps, rounds, or plain target
steps (a share of one step without drafts).
"""

# -- k and the speedup rule (speedup.py, adaptive.py) ------------------------------
# The k ceiling, measured 2026-11-26 (hybrid + adaptive, unique prompts / ShareGPT chat,
# c = 1 and 16, 2 reps; results/2026-11-26-e515836-serving-*-kceiling/): ceilings 8, 16
# and 32 lie within the repetitions' spread on the bench pair (c = 1: 2.39/2.47/2.44x,
# c = 16: 1.07/1.14/1.09x) and 8 and 32 on the smol pair (1.42x/1.40x, 0.98x/1.00x);
# a ceiling of 4 is lower on bench (2.24x, 1.00x). On unique text the controller
# averages 5-7 drafts per verifying step even when 32 are allowed. Under load (bench,
# unique, c = 4 / 8 / 16, bf16, 3 reps; results/2026-11-30-d6bce0d-serving-bench-unique-c4-c16-bf16-arrival-k32/)
# 32 read 1.15x / 1.03x / 0.99x against 8's 1.25x / 1.04x / 0.99x.
K_CEILING = 8  # the smallest ceiling on the plateau on both pairs: presets and docs use it
MAX_K = 32  # the largest ceiling measured (also on replays, which draft long corpus matches)
MIN_GAIN = 0.02  # not measured: hysteresis, speculate only if predicted S > 1.02 (2 % covers fit noise)
ALPHA_MAX = 0.999  # not measured: α̂ never claims certainty, so a rejection always pulls it down

# -- acceptance estimates (adaptive.py) ----------------------------------------------
PRIOR_ALPHA = 0.6  # not measured: a middling α for a draft of the target's family, before any round
PRIOR_WEIGHT = 4.0  # not measured: the prior counts as 4 trials, so one round already moves α̂
ALPHA_DECAY = 0.9  # not measured: ~10-round window; test_adaptive's phase-switch test checks the tracking
PROBE_EVERY = 8  # not measured: steps before held requests probe (k = 1) again
PROBE_MAX = 128  # not measured: probing costs at most ~1 step in 128 where speculation never pays

# -- step cost model (step_cost.py) --------------------------------------------------
C_PRIME_DRAFT = 0.05  # not measured: draft forward / target step until measured (a draft ~20x smaller)
C_PRIME_NGRAM = 0.0  # by definition: an n-gram lookup runs no draft forward
DRAFT_FIT_EMA = 0.2  # not measured: weight of the newest draft round (~5-round window)
STEP_FIT_DECAY = 0.99  # not measured: weight kept per step by the target fit (~100-step window)
# The target fit solves at most once per STEP_FIT_SOLVE_EVERY steps (8 of ~100 steps of
# memory: a few per cent of the weight). Set by host time, not by accuracy: solving every
# step was 7 % of propose()'s profiled time at chat c = 16 (experiments/host_time/
# profile_propose.py --n 16 --profile, smol pair). Accuracy holds: replaying served logs
# (experiments/step_log/fit_cadence.py), the median predicted/measured plain step moves
# by at most 0.004 against solving every step (chat c = 4, 8 and 16).
STEP_FIT_SOLVE_EVERY = 8
# ... and at once after a step the last solve mispredicted by more than this factor. At
# steady load predicted/measured plain steps spread over 0.80-1.55 (p10-p90, chat c = 8);
# in the first steps of a start burst a young fit read 9-22x (results/2026-12-01-
# 2fd7db6-...: 1,155 ms predicted for 31-53 ms steps at 8 rows), and until the next
# solve (4 steps there) every plan was priced on it: k = 8 drafts for every row,
# 0.1-0.2 s draft rounds.
STEP_FIT_SURPRISE = 2.0
SPEC_WINDOW = 15  # not measured: σ is the median of the last 15 verifying steps (robust to a slow one)
A_MIN = 1e-6  # numerical floor (s) of the fitted intercept, so T(B) > 0 and v(B) < 1
MIN_VAR_TOKENS = 1e-6  # numerical: weighted variance (tokens²) below which a slope is not identifiable
# The horizon a draft catch-up is spread over (catch_up.py): the median output of a
# scope's last OUTPUT_WINDOW finished requests. Not measured: 32 answers make a stable
# median; a scope's traffic changes slower than that.
OUTPUT_WINDOW = 32
# The most a draft round's catch-up may delay a step with more than one row, in plain
# steps at that batch (``StepCost.catch_up_room``; longer catch-ups are fed in chunks
# over the next rounds). One plain step is what the row ledger lets a step take beyond
# 1 + row_slack (CREDIT_MAX). Before it, at chat c = 8 (smol, bf16; results/
# 2026-12-01-2c3818b-serving-smol-sharegpt-c8-bf16-in-tree/) rounds of 0.1-0.3 s stalled
# the batch (4, 0 and 2 a cell, 2-7 plain steps) and set the plugin's TPOT p99 (1.16x).
# With it and STEP_FIT_SURPRISE: 0, 0 and 1 (55 ms) a cell (results/2026-12-01-2017683-
# serving-smol-sharegpt-c8-bf16-catch-up-bound/, with a step-time cap since removed).
# Not measured against other values.
CATCH_UP_STEP_MAX = 1.0
FIT_LOG_S = 60.0  # not measured: the step cost fit is logged at most once a minute (step_record)
MIN_DET = 1e-4  # numerical: relative determinant below which two regressors cannot be told apart

# -- whether planning pays its host time (host_gate.py) ------------------------------
# Not measured against other values: the gate compares decayed sums of (plan host
# seconds, target seconds its verification saved) per batch bucket, so only the memory
# and the evidence needed before it may skip are set here. On against off, smol chat,
# c = 64, bf16, AVX-512-bf16 EPYC, 3 reps
# (results/2026-11-30-abc3516-serving-smol-sharegpt-c64-bf16-host-gate-probe/): 1.00x
# against 0.97x no speculation's throughput, ahead in every rep; c = 16 the same
# throughput (results/2026-11-30-b55b3a0-serving-smol-sharegpt-c16-c64-bf16-host-gate/).
# The bench pair at c = 64 reads 0.97x with and without it (a decode step there is 74-82 ms:
# planning is a small share; results/2026-11-30-9de5dab-serving-bench-unique-c64-bf16-host-gate/).
HOST_GATE_DECAY = 0.95  # not measured: ~20 planned steps of memory per batch bucket
HOST_GATE_MIN_PAIRS = 8.0  # not measured: decayed count of planned steps a bucket needs before it may skip (~10 steps)

# -- n-gram pricing and shadows (match_pricing.py, shadow.py) -----------------------
MATCH_PRIOR_WEIGHT = 4.0  # not measured: a match bucket's prior counts as 4 trials (as PRIOR_WEIGHT)
MATCH_DECAY = 0.98  # not measured: ~50 rounds per bucket; buckets see many requests, so a longer window
# The n-gram chain's confidence (ngram.py): a follower's count / (occurrences +
# NGRAM_PRIOR), so a context seen once is no certainty, and the threshold ngram_min_prob
# on the chain's product. Set 2026-11-27 by replaying the plugin's n-gram drafting on 320
# recorded smol-target greedy answers to held-out ShareGPT prompts, beside in-tree
# suffix's trees (results/2026-11-27-ngram-confidence-replay/, "Prior"), with the corpus
# matched from 1 token (ngram_corpus_min_n) and its drafts capped at the match length.
# Tokens per verify cost at k 8 for c' = 0.02 / 0.05 / 0.1 / 0.2 (a verify token's share
# of a plain step: ~0.02-0.05 at c = 1 on a CPU, more in a busy batch):
# - prior 0.5, threshold 0.1: 1.760 / 1.630 / 1.452 / 1.191; drafts in 87 % of rounds;
# - prior 0.25, 0.2: 1.763 / 1.626 / 1.440 / 1.172; prior 1, 0.05: 1.741 / 1.622 / 1.456 / 1.209;
#   prior 0 (a context seen once is certain), 0.3: 1.749 / 1.594 / 1.388 / 1.103;
# - the index before (prior 0, threshold 0.3, corpus from 3 tokens, drafts in 57 % of
#   rounds): 1.677 / 1.519 / 1.314 / 1.034; in-tree suffix 1.720 / 1.630 / 1.499 / 1.291.
# Served at c = 1 and 8 on both pairs (results/2026-11-27-666f68e-serving-*-ngram-prior/):
# over suffix's throughput 1.04x (smol) and 1.07x (bench) at c = 1, 0.98x and 0.90x at
# c = 8; before, in other runs, 1.00x at c = 1 (smol), 0.97x and 0.93x at c = 8.
NGRAM_PRIOR = 0.5
NGRAM_MIN_PROB = 0.1
# The longest context (tokens) the n-gram indexes key on. 8 against 4 on the bench pair's
# unique code, AVX-512-bf16 EPYC: replayed (results/2026-11-30-ngram-context-replay-bench/)
# 3.10 against 2.98 accepted tokens a round at k 8 (16: 3.05); served at c = 8 / 16, 2 reps
# (results/2026-11-30-381f27b-serving-bench-unique-c8-c16-bf16-ngram-n8/) 1.03x / 0.98x
# against 1.02x / 0.97x, no more accepted tokens a cell. 4 keeps half the index updates.
NGRAM_MAX_N = 4
MATCH_ALPHA_MIN = 1e-3  # numerical: log-odds of α stay finite
SHADOW_K = 8  # not measured: drafts per shadow proposal, decided within 8 committed tokens
SHADOW_ROWS = 4  # not measured: new shadow proposals per step (CPU: one n-gram lookup each)

# -- the step plan (step_plan.py) ------------------------------------------------------
# The default of ``row_slack``: a verifying step may slow a request that gains nothing
# from it (no drafts, or few accepted) by at most this share of a plain step per token,
# over the request's life (the ledger below). Measured against 0.2 and none (the
# batch's mean alone), hybrid + adaptive k <= 8; 2026-11-27, 2 reps, AMX CPU:
# - smol, ShareGPT (results/2026-11-27-7f84392-serving-smol-sharegpt-rowslack/):
#   0.2 against 0.05: c = 8 1.30x vs 1.13x, TPOT p99 1.02x vs 1.01x; c = 16 1.11x vs
#   0.98x, TPOT p99 1.14x vs 1.23x;
# - bench, unique (results/2026-11-27-8a3c559-serving-bench-unique-rowslack-sweep/):
#   c = 8 1.33x vs 1.23x, TPOT p99 0.94x vs 0.95x; c = 16 1.16x vs 1.08x, 1.05x vs
#   1.08x; no bound: 1.37x / 1.20x but TPOT p99 1.20x at c = 16.
# - bench, unique, c = 64 (results/2026-11-27-3f4c4aa-serving-bench-unique-c64-rowslack/):
#   1.01x vs 0.99x, TPOT p99 1.06x vs 1.03x (A/A 0.99x): the same within the spread.
# - smol, ShareGPT, 0.1 against 0.2 (results/2026-11-27-99e62eb-serving-smol-sharegpt-rowslack10/):
#   c = 8, 16, 32 and 8 req/s: 0.1's throughput 0.88-0.98x of 0.2's in all 8 paired
#   repetitions, TPOT p50 1.00-1.22x; TPOT p99 lower only at c = 8 (1.14x vs 1.25x).
# - smol, ShareGPT, c = 8, AVX2-only CPU, float32, 3 reps, prefill_split on, each
#   request against itself
#   (results/2026-11-29-c4135ed-serving-smol-sharegpt-c8-f32-rowslack/): 0.2 against
#   0.05 1.07x vs 1.02x, TPOT p50 1.02x vs 1.05x; requests > 1.2x their own TPOT without
#   speculation 17 % vs 6 %, the median request 1.02x vs 1.03x.
# - smol, ShareGPT, c = 8 and 16, AVX2-only CPU, float32, 2 reps, prefill_split off
#   (results/2026-11-29-adbe772-serving-smol-sharegpt-c8-c16-f32-rowslack-nosplit/): 0.05
#   against 0.2 1.03x vs 1.06x (c = 8) and 1.01x vs 1.01x (c = 16); TPOT p50 0.97x vs 0.98x
#   and 1.01x vs 1.07x; e2e p99 0.91x vs 0.90x and 1.01x vs 1.10x; TTFT p99 1.00x vs 1.30x
#   and 1.04x vs 1.00x; requests > 1.2x their own TPOT 3 % vs 19 % and 5 % vs 18 %.
# Set to 0.05 on 2026-11-29 from that run: it keeps every request within the TPOT bound
# the product promises (the AMX figures above, on code before the per-request table and
# with other defaults, favoured 0.2 for throughput: re-measure there).
# 0.02 against 0.05, chat, smol, c = 4 and 8, AVX-512-bf16 EPYC, bf16, 3 reps
# (results/2026-11-30-70b0180-serving-smol-sharegpt-c4-c8-bf16-slack-sweep/): a third as
# many verifying decode steps, throughput 1.01x / 0.99x vs 1.05x / 1.00x, TPOT p50 1.03x /
# 1.04x vs 0.98x / 1.03x (not lower), TPOT p99 1.08x / 0.92x vs 1.12x / 1.13x.
# 0.02 against 0.05, chat, smol, c = 4 / 8 / 16 / 2 req/s / 8 req/s, same CPU, bf16, 3 reps
# (results/2026-11-30-a0fd98d-serving-smol-sharegpt-all-loads-bf16-rowslack02/):
# throughput 1.02x / 1.00x / 0.98x / 1.00x / 1.01x vs 1.06x / 1.02x / 0.97x / 1.01x / 1.00x;
# TPOT p50 1.03x / 1.03x / 1.02x / 0.99x / 0.99x vs 1.00x / 1.02x / 1.04x / 0.95x / 1.01x;
# TPOT p99 1.12x / 1.06x / 1.05x / 1.03x / 0.99x vs 1.50x / 1.12x / 1.30x / 1.11x / 1.04x.
# At c = 16 few rows find drafts, so the median request is one that gains nothing and
# pays what the bound lets it (1.04x its own TPOT at 0.05, 1.02x at 0.02).
# Bench pair, unique, c = 4 / 8 / 16 / 2 req/s, same CPU, bf16, 3 reps
# (results/2026-11-30-23af366-serving-bench-unique-c4-c16-rate2-bf16-rowslack02/):
# throughput 1.15x / 1.01x / 1.00x / 1.02x vs 1.20x / 0.99x / 0.99x / 1.02x; TPOT p99
# 1.05x / 0.97x / 1.01x / 0.80x vs 1.04x / 1.10x / 1.11x / 0.76x; e2e p99 at c = 8 1.03x
# vs 1.09x; TTFT p50 at c = 16 1.13x vs 1.33x.
# Set to 0.02 on 2026-11-30 (was 0.05): the bound a request that gains nothing is held to
# is then the TPOT p50 target itself; on chat TPOT p99 read lower at every load in both
# runs, and on unique code 0.02 met every bound 0.05 met and more. It gives up
# throughput where most rows gain (c = 4: 4-5 points on both pairs).
ROW_SLACK = 0.02
# The default of ``step_min_gain``: a verifying step must be predicted to emit this much
# more per second than a plain step over all its rows (``speedup.batch_pays``), after the
# row_slack cut. Set 2026-11-29 against 0.10 (smol, ShareGPT, c = 8 and 16, AVX2-only
# CPU, float32, 3 reps; results/2026-11-29-4ad05ca-serving-smol-sharegpt-c8-c16-f32-stepgain/):
# 0.10's throughput 0.955-0.988x of 0.02's in 5 of 6 paired reps, TPOT p50 1.05x / 1.08x
# against 1.02x / 1.06x: a row that drafts nothing spends its row_slack either way (the
# ledger carries it to the fewer verifying steps), so the threshold only takes gain away.
STEP_MIN_GAIN = 0.02
# The most slack a request may save up or owe (row_credit.py), in plain steps: a step
# may slow a row by at most 1 + row_slack + this, and the bound holds over the
# ~CREDIT_MAX / row_slack = 50 steps a row needs to save it at the default 0.02 (within
# a 128-token answer's TPOT). The value is not measured against others; the
# ledger with it was served on 2026-11-27 (results/2026-11-27-1b3830b-serving-smol-sharegpt-credit/,
# results/2026-11-27-2f186c3-serving-bench-unique-credit/, row_slack 0.05 then).
CREDIT_MAX = 1.0
# The default of ``ttft_slack``: verification (verify tokens and the exact sampler's σ)
# may lengthen a step that carries a prefill by 2.5 % of its time; a first token waits
# for two such steps (below), 5 % in all (the TTFT target is 1.10x no speculation;
# drafting, the deferred-draft RPC and queueing behind a longer step take the rest).
# Measured against 0 (no drafts beside a prefill), 2026-11-26, bench pair, unique
# prompts, 3 reps (results/2026-11-26-ccab505-serving-bench-unique-ttftslack/): TTFT
# p50 c = 4 0.94x vs 1.06x, c = 8 1.31x vs 1.11x, repetitions overlapping; throughput
# c = 4 1.54x vs 1.39x.
# On chat, smol, c = 4, AVX2 float32, 2 reps
# (results/2026-11-29-c48edb9-serving-smol-sharegpt-c4-f32-ttft/): TTFT p50 1.05x vs
# 1.02x, throughput 1.04x vs 1.05x, repetitions overlapping. Bench pair, unique, c = 4,
# AVX2 float32, 2 reps (results/2026-11-29-da38eb3-serving-bench-unique-c4-f32-ttft/):
# TTFT p50 1.07x vs 1.04x, throughput 1.15x vs 1.11x (lower for 0 in both reps).
# Chat, smol, c = 4 / 8 / 2 req/s, AVX-512-bf16 EPYC, bf16, 3 reps
# (results/2026-11-30-99870aa-serving-smol-sharegpt-c4-c8-rate2-bf16-ttft0/): TTFT p50
# c = 4 1.13x vs 1.09x (reps overlapping), throughput c = 8 1.01x vs 0.99x (lower for 0
# in every rep), TPOT p50 c = 8 1.06x vs 1.11x. Bench pair, unique, c = 4, bf16, 3 reps
# (results/2026-11-30-d7a2a54-serving-bench-unique-c4-bf16-first-token/): TTFT p50
# 1.16x vs 1.09x (0 within 1.10x in every rep), throughput 1.18x vs 1.16x.
# Set to 0.025 on 2026-11-30 (was 0.05): a first token waits for two steps the slack
# lengthens (the arrival step, ``arrival_cap``, and its own prefill step), so 0.05 let
# verification add up to 10 % of a prefill step, the whole TTFT p50 bound; the step
# log showed one decode step between a finish and the next prompt's prefill at c = 4 and
# 8 in 223 of 231 finishes. Chat, smol, c = 4 and 8, AVX-512-bf16 EPYC, bf16, 3 reps
# (results/2026-11-30-70b0180-serving-smol-sharegpt-c4-c8-bf16-slack-sweep/): c = 8
# TTFT p50 1.12x vs 1.18x (lower in every rep; 1.09x vs 1.15x without the start burst),
# c = 4 1.01x vs 1.00x; throughput 1.05x / 1.00x for both; TPOT p50 1.02x / 1.02x
# against 0.98x / 1.03x. Since then the allowance also pays the exact sampler's σ.
TTFT_SLACK = 0.025
# The same slack prices ``arrival_cap`` (config default on, compat/scheduler_plan.py),
# which caps the step after a request finished by TTFT_SLACK of a step carrying the
# finished requests' prompt. The cap was measured against off on the bench pair,
# unique, c = 4-16, bf16, 3 reps
# (results/2026-11-30-56ea6f1-serving-bench-unique-c4-c16-bf16-arrival/, priced then
# with a moving average of recent prompts): c = 4 TTFT p50 1.13x vs 1.37x (lower in
# every rep), TPOT p99 1.00x vs 1.18x, throughput 1.30x vs 1.28x; c = 8 and 16 the
# same within the spread. Priced as now, 3 reps
# (results/2026-11-30-d6bce0d-serving-bench-unique-c4-c16-bf16-arrival-k32/): c = 8 TTFT
# p50 1.15x vs 1.48x off, c = 4 and 16 the same within the spread, throughput the same.
