"""Benchmark suite: the analytic bound, paired-ratio statistics, the harness plumbing.

Unit tests need no engine. ``test_quick_smoke_fast`` (engine tier) runs the real
harness on the ci pair with two configurations and one tiny workload and checks the
shape of what it writes, never speed; ``test_quick_smoke`` (slow tier) runs the
whole ``--quick`` mode. ``test_gpu_reference_*`` covers the GPU script (gpu tier).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import analysis, analytic, stats  # noqa: E402
from benchmarks.configs import (QUICK_CONFIGS, TABLE, WORKLOADS, Entry,  # noqa: E402
                                expand, select)

# ----------------------------------------------------------------- analytic bound


def brute_expected_tokens(alpha: float, k: int) -> float:
    """E[N] straight from the definition: P(N = n) over n = 1..k+1."""
    total = 0.0
    for n in range(1, k + 2):
        p = alpha ** (n - 1) * ((1 - alpha) if n <= k else 1.0)
        total += n * p
    return total


@pytest.mark.unit
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.8, 0.9, 0.99])
@pytest.mark.parametrize("k", [0, 1, 2, 4, 8])
def test_expected_tokens_matches_closed_form_and_definition(alpha, k):
    got = analytic.expected_tokens_per_round(alpha, k)
    assert got == pytest.approx(brute_expected_tokens(alpha, k), rel=1e-12)
    if alpha < 1:
        assert got == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha), rel=1e-12)


@pytest.mark.unit
@pytest.mark.parametrize("k", [1, 3, 6])
def test_bound_alpha_to_one_limit(k):
    assert analytic.expected_tokens_per_round(1.0, k) == k + 1
    for eps in (1e-6, 1e-9, 1e-12):
        assert analytic.expected_tokens_per_round(1 - eps, k) == pytest.approx(k + 1, abs=1e-4)
    # The closed form is 0/0 at alpha = 1; ours is continuous through it.
    c = 0.05
    assert analytic.speedup_bound(1.0, k, c) == pytest.approx((k + 1) / (1 + k * c))
    assert analytic.speedup_bound(1 - 1e-10, k, c) == pytest.approx((k + 1) / (1 + k * c))


@pytest.mark.unit
def test_bound_known_values_and_limits():
    # alpha = 0.8, k = 4: E[N] = 1 + .8 + .64 + .512 + .4096 = 3.3616
    assert analytic.expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)
    assert analytic.speedup_bound(0.8, 4, 0.1) == pytest.approx(3.3616 / 1.4)
    assert analytic.speedup_bound(0.8, 4, 0.0) == pytest.approx(3.3616)   # free draft
    assert analytic.speedup_bound(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # never accepted
    assert analytic.speedup_bound(0.5, 0, 0.3) == 1.0                      # k = 0: no speculation
    assert analytic.efficiency(1.5, 2.0) == 0.75
    assert analytic.unconditional_acceptance(0.8, 3) == pytest.approx([0.8, 0.64, 0.512])


@pytest.mark.unit
def test_bound_rejects_bad_inputs():
    for bad in (-0.1, 1.1, float("nan")):
        with pytest.raises(ValueError):
            analytic.expected_tokens_per_round(bad, 3)
    with pytest.raises(ValueError):
        analytic.expected_tokens_per_round(0.5, -1)
    with pytest.raises(ValueError):
        analytic.speedup_bound(0.5, 2, -0.01)
    with pytest.raises(ValueError):
        analytic.efficiency(1.0, 0.0)


@pytest.mark.unit
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_alpha_from_mean_length_inverts_expected_tokens(k):
    for alpha in (0.0, 0.05, 0.3, 0.6, 0.8, 0.95, 1.0):
        n = analytic.expected_tokens_per_round(alpha, k)
        assert analytic.alpha_from_mean_accepted_length(n, k) == pytest.approx(alpha, abs=1e-9)
    assert analytic.alpha_from_mean_accepted_length(0.5, k) == 0.0      # clamped
    assert analytic.alpha_from_mean_accepted_length(k + 5, k) == 1.0


@pytest.mark.unit
def test_vllm_acceptance_ratio_is_not_the_iid_alpha():
    """accepted / draft tokens (vLLM) = E[accepted] / k, below the conditional alpha."""
    alpha, k = 0.8, 4
    expected_accepted = analytic.expected_tokens_per_round(alpha, k) - 1
    ratio = expected_accepted / k
    assert ratio == pytest.approx(sum(analytic.unconditional_acceptance(alpha, k)) / k)
    assert ratio < alpha - 0.2
    assert analytic.alpha_from_mean_accepted_length(1 + expected_accepted, k) == pytest.approx(alpha)


# ------------------------------------------------------------ paired statistics


@pytest.mark.unit
def test_quantile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    for q in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1):
        assert stats.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
    assert stats.median([2.0, 1.0]) == 1.5
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)
    with pytest.raises(ValueError):
        stats.median([1.0, float("nan")])


@pytest.mark.unit
def test_geomean_averages_ratios():
    assert stats.geomean([0.5, 2.0]) == pytest.approx(1.0)
    assert stats.geomean([0.9, 1.21]) == pytest.approx(math.sqrt(0.9 * 1.21))
    for bad in ([], [1.0, 0.0], [1.0, float("nan")]):
        with pytest.raises(ValueError):
            stats.geomean(bad)


@pytest.mark.unit
def test_paired_ratios_cancel_common_drift():
    """A drift that scales both configurations alike leaves every paired ratio exact,
    while the spread of unpaired throughput is large."""
    drift = [1.0, 0.7, 1.3, 0.9, 1.1]
    base = [100 * d for d in drift]
    spec = [150 * d for d in drift]
    r = stats.paired_ratios(spec, base)
    assert r == pytest.approx([1.5] * 5)
    s = stats.summarize(r)
    assert s["median"] == pytest.approx(1.5) and s["rel_iqr"] == pytest.approx(0, abs=1e-12)
    assert stats.summarize(spec)["rel_iqr"] > 0.1
    # Unpaired (median of one over median of other) would also be 1.5 here, but pairing
    # is what keeps the *spread* honest; mixing reps breaks it:
    shuffled = stats.paired_ratios(spec, base[1:] + base[:1])
    assert stats.summarize(shuffled)["rel_iqr"] > 0.1


@pytest.mark.unit
def test_paired_ratios_validate():
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [0.0])
    with pytest.raises(ValueError):
        stats.paired_ratios([-1.0], [1.0])


@pytest.mark.unit
def test_summarize_fields():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0, 10.0])
    assert s["n"] == 5 and s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 10.0
    assert s["q25"] == 2.0 and s["q75"] == 4.0
    assert s["rel_iqr"] == pytest.approx(2 / 3)
    assert stats.summarize([]) == {"n": 0}


@pytest.mark.unit
def test_median_ci_coverage_is_exact_and_honest():
    # n = 5: even [min, max] covers the median only with 1 - 2/32 = 93.75%.
    lo, hi, cov = stats.median_ci([5, 1, 4, 2, 3], 0.95)
    assert (lo, hi) == (1, 5) and cov == pytest.approx(0.9375)
    # n = 10: [x(2), x(9)] covers with 1 - 2 * 11/1024 = 97.9%; [x(3), x(8)] only 89%.
    xs = list(range(1, 11))
    lo, hi, cov = stats.median_ci(xs, 0.95)
    assert (lo, hi) == (2, 9) and cov == pytest.approx(1 - 2 * 11 / 1024)
    lo, hi, cov = stats.median_ci(xs, 0.80)
    assert (lo, hi) == (3, 8) and cov == pytest.approx(1 - 2 * 56 / 1024)
    assert stats.median_ci([7.0]) == (7.0, 7.0, 0.0)


@pytest.mark.unit
def test_median_ci_coverage_by_simulation():
    """The order-statistic interval covers the true median at least as often as claimed."""
    import random

    rng = random.Random(0)
    n, trials, hits = 9, 4000, 0
    claimed = stats.median_ci(list(range(n)), 0.9)[2]
    for _ in range(trials):
        xs = [rng.expovariate(1.0) for _ in range(n)]   # true median ln 2
        lo, hi, _ = stats.median_ci(xs, 0.9)
        hits += lo <= math.log(2) <= hi
    # binomial sd at p ~ 0.96, n = 4000 is ~0.003
    assert hits / trials >= claimed - 0.015


# ------------------------------------------------------ analysis of recorded runs


def _run(config, rep, tps, *, spec=None, timers=None, proposer=None, workload="w", temperature=0.0,
         outputs=None):
    return {"group": 0, "rep": rep, "config": config, "workload": workload,
            "temperature": temperature, "tps": tps, "output_tokens": 64, "spec": spec or {},
            "timers": timers, "proposer": proposer, "outputs": outputs, "contended": False}


@pytest.mark.unit
def test_derive_and_summarize_paired_runs():
    configs = {"nospec": {"is_baseline": True, "k": 0, "method": "none", "family": "nospec"},
               "p-k4": {"is_baseline": False, "k": 4, "method": "plugin", "family": "p"}}
    workloads = {"w": {"batch_size": 1}}
    base_t = {"decode:1": {"steps": 63, "target_s": 0.63, "propose_s": 0.0},
              "mixed:1": {"steps": 1, "target_s": 0.05, "propose_s": 0.0}}
    spec_t = {"decode:1": {"steps": 20, "target_s": 0.24, "propose_s": 0.08},
              "mixed:1": {"steps": 1, "target_s": 0.05, "propose_s": 0.01}}
    spec = {"drafts": 20.0, "draft_tokens": 80.0, "accepted": 40.0, "accepted_per_pos": [16.0, 11.0, 8.0, 5.0]}
    runs = []
    for rep, drift in enumerate([1.0, 0.8, 1.2]):
        runs.append(_run("nospec", rep, 100 * drift, timers=base_t, outputs=[[1, 2, 3]]))
        runs.append(_run("p-k4", rep, 200 * drift, spec=spec, timers=spec_t,
                         proposer={"draft_seconds": 0.06, "draft_forwards": 80}, outputs=[[1, 2, 3]]))
    analysis.derive_all(runs, configs, workloads)
    d = runs[1]["derived"]
    assert d["speedup"] == pytest.approx(2.0)
    assert d["alpha_vllm"] == pytest.approx(0.5)
    assert d["mean_accepted_len"] == pytest.approx(3.0)
    assert d["accept_by_pos"] == pytest.approx([0.8, 0.55, 0.4, 0.25])
    assert d["t_target"] == pytest.approx(0.01)
    assert d["t_draft"] == pytest.approx(0.08 / 20 / 4)
    assert d["c_prime"] == pytest.approx(0.1)
    assert d["c_prime_fwd"] == pytest.approx(0.06 / 80 / 0.01)
    assert d["verify_ratio"] == pytest.approx(1.2)
    assert d["bound"] == pytest.approx(3.0 / 1.4)
    assert d["efficiency"] == pytest.approx(2.0 / (3.0 / 1.4))
    assert analytic.expected_tokens_per_round(d["alpha_eff"], 4) == pytest.approx(3.0)
    assert d["greedy_identical"] == 1 and d["greedy_requests"] == 1
    summary = {(c["config"]): c for c in analysis.summarize_cells(runs, configs)}
    s = summary["p-k4"]
    assert s["speedup"]["median"] == pytest.approx(2.0) and s["speedup"]["wins"] == 3
    assert s["speedup"]["rel_iqr"] == pytest.approx(0, abs=1e-12)
    assert s["mean_accepted_len"] == pytest.approx(3.0) and s["greedy_identical"] == [3, 3]
    assert "speedup" not in summary["nospec"] or summary["nospec"]["speedup"]["median"] == 1.0


@pytest.mark.unit
def test_counter_deltas():
    before = {"vllm:spec_decode_num_drafts": 10, "vllm:spec_decode_num_accepted_tokens_per_pos": [5, 3]}
    after = {"vllm:spec_decode_num_drafts": 25, "vllm:spec_decode_num_accepted_tokens_per_pos": [12, 7, 1]}
    d = analysis.counter_delta(before, after)
    assert d["drafts"] == 15 and d["accepted_per_pos"] == [7, 4, 1]
    assert analysis.counter_delta(None, {}) == {}
    assert analysis.proposer_delta({"draft_seconds": 1.0}, {"draft_seconds": 3.5})["draft_seconds"] == 2.5
    assert analysis.proposer_delta(None, None) is None


# ----------------------------------------------------------- configuration table


@pytest.mark.unit
def test_config_table_and_selection():
    cfgs = expand()
    names = [c.name for c in cfgs]
    assert names[0] == "nospec" and {"draft_model-k4", "ngram-k4", "plugin-k4"} <= set(names)
    assert all(q in names for q in QUICK_CONFIGS)
    by = {c.name: c for c in cfgs}
    assert by["nospec"].speculative_config("/d") is None
    assert by["nospec"].vllm_plugins == "" and by["plugin-k4"].vllm_plugins == "specdec"
    assert by["draft_model-k2"].vllm_plugins == ""
    p = by["plugin-k4"].speculative_config("/d")
    assert p["method"] == "custom_class" and p["num_speculative_tokens"] == 4
    assert p["draft_load_config"]["model_loader_extra_config"]["specdec"]["draft_model"] == "/d"
    ng = by["ngram-k4"].speculative_config(None)
    assert ng == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                  "prompt_lookup_min": 1}
    assert by["suffix-k8"].speculative_config(None) == {"method": "suffix",
                                                         "num_speculative_tokens": 8}
    assert by["suffix-k8"].vllm_plugins == ""   # arctic-inference's own plugin stays unloaded
    assert [c.name for c in select(cfgs, ["plugin-*"])][0] == "nospec"
    with pytest.raises(ValueError):
        select(cfgs, ["nope-*"])
    # A new plugin mode is one table line.
    extra = expand(TABLE + [Entry("plugin-x", "plugin", (3,), specdec={"draft_kv_cache_mib": 64})])
    x = {c.name: c for c in extra}["plugin-x-k3"]
    assert x.family == "plugin-x"
    assert x.speculative_config("/d")["draft_load_config"]["model_loader_extra_config"]["specdec"] == {
        "draft_model": "/d", "draft_kv_cache_mib": 64}


@pytest.mark.unit
def test_engine_env_puts_extra_site_on_pythonpath_or_names_the_fix(tmp_path):
    by = {c.name: c for c in expand()}
    assert by["plugin-k4"].engine_env(tmp_path) == {"VLLM_PLUGINS": "specdec"}
    with pytest.raises(FileNotFoundError, match="scripts/install_suffix.sh"):
        by["suffix-k8"].engine_env(tmp_path)
    (tmp_path / ".cache/suffix/site").mkdir(parents=True)
    env = by["suffix-k8"].engine_env(tmp_path)
    assert env["VLLM_PLUGINS"] == ""
    assert env["PYTHONPATH"].split(":")[0] == str(tmp_path / ".cache/suffix/site")


@pytest.mark.unit
def test_speculative_configs_validate_in_installed_vllm():
    """Each table row's speculative_config has only keys vLLM's SpeculativeConfig knows."""
    sc = pytest.importorskip("vllm.config.speculative")
    fields = set(sc.SpeculativeConfig.model_fields) if hasattr(sc.SpeculativeConfig, "model_fields") \
        else set(sc.SpeculativeConfig.__dataclass_fields__)
    for c in expand():
        spec = c.speculative_config("/d")
        if spec:
            assert set(spec) <= fields, (c.name, set(spec) - fields)
    lit = sc.RejectionSampleMethod.__args__
    assert "synthetic" in lit and "synthetic_acceptance_rates" in fields


@pytest.mark.unit
def test_group_planning_keeps_baseline_in_every_group():
    from benchmarks.run_plan import plan_groups

    cfgs = expand()
    groups = plan_groups(cfgs, 6)
    assert all(g[0].name == "nospec" for g in groups)
    assert all(len(g) <= 6 for g in groups)
    seen = [c.name for g in groups for c in g[1:]]
    assert sorted(seen) == sorted(c.name for c in cfgs if not c.is_baseline)
    # Same-k configurations share a group (tightly paired head-to-head).
    where = {c.name: i for i, g in enumerate(groups) for c in g}
    assert where["plugin-k4"] == where["draft_model-k4"]
    assert len(plan_groups(cfgs, 100)) == 1


@pytest.mark.unit
def test_prompt_sets_ship_enough_prompts():
    from benchmarks.workloads import load_prompt_set

    for w in WORKLOADS.values():
        prompts = load_prompt_set(w.prompt_set)
        assert len(prompts) >= w.num_prompts, w.name
        assert all(p.strip() and "%%%%" not in p for p in prompts)


@pytest.mark.unit
def test_unique_prompts_never_repeat_and_fit(tmp_path):
    """The serving benchmark's `unique` workload: distinct held-out code chunks, enough
    for a concurrency-1 comparison of several repetitions, and a run that would need
    more stops before any server starts, naming the fix."""
    from benchmarks import serving
    from benchmarks.workloads import unique_code_prompts

    prompts = unique_code_prompts()
    assert len(prompts) == len(set(prompts)) >= 400
    assert all(200 <= len(p) <= 800 for p in prompts)
    assert prompts == unique_code_prompts()  # deterministic
    args = serving.parse_args(["--pair", "ci", "--workloads", "unique", "--concurrency", "64",
                               "--rates", "", "--reps", "4", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unique workload needs 1024 prompts"):
        serving.run(args)


@pytest.mark.unit
def test_output_spread_gives_each_request_its_length(tmp_path):
    """--output-spread: lengths drawn over mean·[1-s, 1+s], written as vLLM's custom
    dataset's ``output_tokens``; a spread outside [0, 1) is refused naming the fix."""
    import json
    import random

    from benchmarks import serving, serving_client, workloads

    lengths = workloads.output_lengths(400, 64, 0.5, random.Random(1))
    assert min(lengths) >= 32 and max(lengths) <= 96 and len(set(lengths)) > 30
    assert lengths == workloads.output_lengths(400, 64, 0.5, random.Random(1))
    rows = [json.loads(line) for line in serving_client.write_prompts(
        tmp_path / "d.jsonl", ["a", "b"], [5, 7]).read_text().splitlines()]
    assert rows == [{"prompt": "a", "output_tokens": 5}, {"prompt": "b", "output_tokens": 7}]
    rows = [json.loads(line) for line in serving_client.write_prompts(
        tmp_path / "d.jsonl", ["a"]).read_text().splitlines()]
    assert rows == [{"prompt": "a"}]
    with pytest.raises(SystemExit):
        serving.parse_args(["--output-spread", "1.5"])
    with pytest.raises(SystemExit):
        serving.parse_args(["--kv-cache-gib", "0"])


@pytest.mark.unit
def test_an_empty_load_list_means_none_but_one_kind_is_needed():
    """``--concurrency ''`` runs rates only (as ``--rates ''`` runs concurrencies only);
    with neither there is nothing to measure, and the error says what to give."""
    from benchmarks import serving

    rates_only = serving.parse_args(["--concurrency", "", "--rates", "0.4,0.6"])
    assert rates_only.concurrency == [] and rates_only.rates == [0.4, 0.6]
    with pytest.raises(SystemExit):
        serving.parse_args(["--concurrency", "", "--rates", ""])


@pytest.mark.unit
def test_nospec_again_is_an_a_a_control_not_a_second_baseline():
    """The A/A control runs without speculation and without our plugin, but is measured
    like a method: selecting configs never adds it, and the baseline stays unique."""
    by = {c.name: c for c in expand()}
    again = by["nospec-again"]
    assert not again.is_baseline and by["nospec"].is_baseline
    assert again.speculative_config("/d") is None and again.vllm_plugins == ""
    assert [c.name for c in select(expand(), ["plugin-k4"])] == ["nospec", "plugin-k4"]


@pytest.mark.unit
def test_serving_report_pools_paired_ratios_next_to_the_a_a_control():
    """serving.md: each cell's throughput ratio carries its range over repetitions, the
    pooled section gives every config's geometric mean [min, max] of paired ratios
    over loads and repetitions, the A/A control included, and every repetition's
    ratios are listed."""
    from benchmarks import serving_report

    cells = []
    for rep, (base, again, plug) in enumerate([(100, 110, 90), (100, 90, 121)]):
        for load in (4, 16):
            for cfg, tput in (("nospec", base), ("nospec-again", again), ("plugin-x", plug)):
                cells.append({"config": cfg, "workload": "mixed", "max_concurrency": load,
                              "repetition": rep, "output_throughput": float(tput),
                              "median_tpot_ms": 1000.0 / tput, "p99_tpot_ms": 2000.0 / tput,
                              "median_ttft_ms": 50.0, "p99_ttft_ms": 80.0,
                              "p99_e2el_ms": 2000.0 / tput})
    res = {"meta": {"pair": "ci", "started": "t", "git": {"short": "x"}, "args": {}},
           "cells": cells}
    pool = serving_report.pooled(res)
    assert sorted(pool[("mixed", "max_concurrency", "plugin-x")]["output_throughput"]) == \
        pytest.approx([0.9, 0.9, 1.21, 1.21])
    md = serving_report.markdown(res)
    # tput [range] / TPOT p50 / TPOT p99 / TTFT p50 / TTFT p99 / e2e p99
    assert "| 4 | 100.0 | 10.0 | 1.00x [0.90, 1.10] / 1.01x / 1.01x / 1.00x / 1.00x / 1.01x | " \
           "1.05x [0.90, 1.21] / " in md
    assert "## mixed (replay: 8 prompts cycled), by concurrency" in md
    # geometric mean of 0.9, 0.9, 1.21, 1.21 is sqrt(0.9 * 1.21) = 1.0436
    replay = "mixed (replay: 8 prompts cycled)"
    assert f"| {replay} | concurrency | plugin-x | 4 | 1.044x [0.90, 1.21] | 0.958x [0.83, 1.11] |" in md
    assert f"| {replay} | concurrency | nospec-again | 4 | 0.995x [0.90, 1.10] |" in md
    # every repetition: TTFT p50 / p99, e2e p99, tput, TPOT p50 / p99, plan cut share
    assert f"| {replay} | c = 4 | 1 | plugin-x | 1.00 | 1.00 | 0.83 | 1.21 | 0.83 | 0.83 | – |" in md


@pytest.mark.unit
def test_serving_report_pools_the_tail_over_repetitions_with_an_interval():
    """serving.md's tail table: p99 of TTFT, vLLM's TPOT ((latency - TTFT) / (tokens - 1),
    one-token answers left out) and e2e over all repetitions' requests, over no
    speculation's, with a bootstrap interval that holds the ratio; no lists, no table."""
    from benchmarks import serving_report, serving_tail

    def cell(config, rep, scale):
        lat = [scale * (1.0 + 0.01 * i) for i in range(40)]
        return {"config": config, "workload": "sharegpt", "max_concurrency": 16,
                "repetition": rep, "output_throughput": 1.0, "latencies": lat,
                "ttfts": [0.1 * scale] * 40, "output_lens": [1] + [11] * 39,
                "median_tpot_ms": 90.0 * scale, "p99_tpot_ms": 130.0 * scale,
                "median_ttft_ms": 100.0 * scale, "p99_ttft_ms": 100.0 * scale,
                "p99_e2el_ms": 1390.0 * scale}

    one = cell("nospec", 0, 1.0)
    tpot = serving_tail.request_ms(one, "tpot")
    assert len(tpot) == 39 and tpot[0] == pytest.approx((1.01 - 0.1) / 10 * 1000)
    cells = [cell(c, r, s) for r in (0, 1)
             for c, s in (("nospec", 1.0), ("nospec-again", 1.0), ("plugin-x", 1.2))]
    res = {"meta": {"pair": "ci", "started": "t", "git": {"short": "x"}, "args": {}},
           "cells": cells}
    lines = serving_tail.tail_lines(res)
    plug = next(x for x in lines if "| plugin-x |" in x)
    assert plug.startswith("| sharegpt | c = 16 | plugin-x | 2 | 80 | 1.20x [")
    for text in plug.split(" | ")[5:]:
        lo, hi = (float(v) for v in text.split("[")[1].rstrip("] |").split(", "))
        assert lo <= 1.2 <= hi
    assert "| nospec-again | 2 | 80 | 1.00x [" in next(x for x in lines if "| nospec-again |" in x)
    assert "## The tail over every repetition's requests" in serving_report.markdown(res)
    assert serving_tail.tail_lines({"cells": [dict(c, latencies=[]) for c in cells]}) == []


@pytest.mark.unit
def test_serving_report_compares_each_request_with_itself():
    """serving.md's per-request table: request i over no speculation's request i, pooled
    over repetitions; a request slowed 1.3x and one sped up 0.7x give a median of 1.00x
    (which percentiles alone cannot tell from no change) and a 50 % share slower by more
    than 1.20x. Cells whose requests differ (other output lengths) do not pair."""
    from benchmarks import serving_paired, serving_report

    def cell(config, rep, scales):
        lat = [0.1 + 1.0 * s for s in scales]
        return {"config": config, "workload": "sharegpt", "max_concurrency": 8,
                "repetition": rep, "output_throughput": 1.0, "latencies": lat,
                "ttfts": [0.1] * len(scales), "input_lens": [5, 7], "output_lens": [11, 11],
                "median_tpot_ms": 100.0, "p99_tpot_ms": 100.0, "median_ttft_ms": 100.0,
                "p99_ttft_ms": 100.0, "p99_e2el_ms": 1000.0}

    cells = [cell(c, r, s) for r in (0, 1) for c, s in
             (("nospec", [1.0, 1.0]), ("nospec-again", [1.0, 1.0]), ("plugin-x", [1.3, 0.7]))]
    res = {"meta": {"pair": "ci", "started": "t", "git": {"short": "x"}, "args": {}},
           "cells": cells}
    ratios = serving_paired.paired_ratios(cells[2], cells[0], "tpot")
    assert ratios == pytest.approx([1.3, 0.7])
    lines = serving_paired.paired_lines(res)
    # no start times: the prompts-per-decode-token column reads "-"
    assert "| sharegpt | c = 8 | plugin-x | 2 | 4 | 1.00x | 50% | 50% | 50% | 1.30x | 1.00x | - |" in lines
    assert "| sharegpt | c = 8 | nospec-again | 2 | 4 | 1.00x | 0% | 0% | 0% | 1.00x | 1.00x | - |" in lines
    assert "## Each request against itself without speculation" in serving_report.markdown(res)
    other = dict(cells[5], output_lens=[11, 12])  # rep 1 answered differently: no pairs
    assert serving_paired.paired_ratios(other, cells[3], "tpot") is None
    lines = serving_paired.paired_lines({"cells": cells[:5] + [other]})
    assert "| sharegpt | c = 8 | plugin-x | 1 (1 unpaired) | 2 | 1.00x |" in " ".join(lines)
    assert serving_paired.paired_lines({"cells": [dict(c, output_lens=[3, c["repetition"]])
                                                  for c in cells if c["config"] != "nospec"]
                                        + [c for c in cells if c["config"] == "nospec"]}) == []


@pytest.mark.unit
def test_prompt_density_counts_the_prompts_each_request_decoded_beside():
    """A request's decode runs from its first token to its last; another request's first
    token inside it is a prompt step it shared time with. Under closed-loop load a faster
    server is sent prompts sooner: the paired table shows that as prompts per decode token
    over no speculation's."""
    from benchmarks import serving_paired

    # decodes: r0 0.1-1.0, r1 0.5-2.2, r2 0.05-0.5; first tokens 0.1, 0.5, 0.05
    cell = {"start_times": [0.0, 0.2, 0.0], "ttfts": [0.1, 0.3, 0.05],
            "latencies": [1.0, 2.0, 0.5], "output_lens": [11, 5, 3]}
    # r1's first token is inside r0's decode, r0's inside r2's (0.5 is r2's end: not inside)
    assert serving_paired.prompt_density(cell) == (2, 16)
    assert serving_paired.prompt_density({"latencies": [1.0]}) == (0, 0)

    def paired(config, rep, starts):
        return {"config": config, "workload": "sharegpt", "max_concurrency": 8,
                "repetition": rep, "start_times": starts, "ttfts": [0.1, 0.1, 0.1],
                "latencies": [1.0, 1.0, 1.0], "input_lens": [5, 7, 9], "output_lens": [11, 11, 11]}

    # no speculation: one prompt inside another's decode; the plugin (its requests sent
    # sooner): three
    cells = [paired("nospec", 0, [0.0, 0.5, 2.0]), paired("plugin-x", 0, [0.0, 0.5, 0.8])]
    lines = serving_paired.paired_lines({"cells": cells})
    assert any(line.startswith("| sharegpt | c = 8 | plugin-x |") and line.endswith("| 3.00x |")
               for line in lines), lines


@pytest.mark.unit
def test_serving_report_splits_the_first_token():
    """serving.md's first-token table: per cell the mean queue, prefill, rest and engine
    TTFT in ms from vLLM's histogram sums and counts, median over repetitions, beside
    the client's; cells without them (older runs) leave the table out."""
    from benchmarks import serving_first_token

    def cell(rep, queue_s):
        return {"config": "plugin-x", "workload": "unique", "max_concurrency": 16,
                "repetition": rep, "output_throughput": 1.0, "mean_ttft_ms": 700.0,
                "first_token": {"queue_s": queue_s, "queued": 4.0, "prefill_s": 2.0,
                                "prefilled": 4.0, "ttft_s": 3.2, "first_tokens": 4.0}}

    res = {"meta": {"pair": "ci", "started": "t", "git": {"short": "x"}, "args": {}},
           "cells": [cell(0, 0.4), cell(1, 0.8), cell(2, 1.2)]}
    assert "| unique | c = 16 | plugin-x | 3 | 200 | 500 | 100 | 800 | 700 |" in \
        serving_first_token.first_token_lines(res)
    assert serving_first_token.first_token_lines({"cells": [dict(cell(0, 0.4), first_token={})]}) == []


@pytest.mark.unit
def test_serving_report_splits_first_tokens_by_what_the_arrival_found():
    """After the start burst, a request that arrives while another still waits for its
    first token is "busy"; the table pairs the others' TTFT p50 with no speculation's."""
    from benchmarks import serving_first_token

    def cell(config, ttfts, starts):
        return {"config": config, "workload": "unique", "max_concurrency": 2,
                "repetition": 0, "ttfts": ttfts, "start_times": starts}

    # c = 2: requests 0 and 1 are the burst; 3 arrives at 6.5 s while 2 (6.0 + 1.0 s)
    # still waits; 2 and 4 arrive to none.
    plugin = cell("plugin-x", [5.0, 5.0, 1.0, 2.0, 1.2], [0.0, 0.0, 6.0, 6.5, 9.0])
    got = serving_first_token.arrivals(plugin)
    assert got["n"] == 3 and got["busy"] == 1 and got["busy_ms"] == 2000.0
    assert got["alone_ms"] == 1100.0 and abs(got["rate"] - 2 / 3.0) < 1e-9
    base = cell("nospec", [5.0, 5.0, 1.0, 1.0, 1.0], [0.0, 0.0, 6.0, 8.0, 10.0])
    lines = serving_first_token.arrival_lines({"cells": [plugin, base]})
    assert "| unique | c = 2 | plugin-x | 1 | 0.67 | 1 / 3 | 1100 | 2000 | 1.10x |" in lines
    assert "| unique | c = 2 | nospec | 1 | 0.50 | 0 / 3 | 1000 | – | 1.00x |" in lines
    assert serving_first_token.arrival_lines({"cells": [dict(plugin, ttfts=None)]}) == []


@pytest.mark.unit
def test_serving_report_flags_a_cell_whose_own_plain_steps_ran_slow():
    """A plugin cell whose plain steps took over SLOWED_PLAIN x another repetition's at
    about the same tokens a step is flagged in the per-repetition and decode-step tables;
    a different step size, too few steps or a spread under the threshold is not."""
    from benchmarks import serving_cells, serving_report

    def cell(rep, ms, toks=7.0, steps=200, load=8):
        return {"config": "plugin-x", "workload": "sharegpt", "max_concurrency": load,
                "repetition": rep, "duration": 60.0, "output_throughput": 60.0,
                **{m: 100.0 for m in ("median_tpot_ms", "p99_tpot_ms", "median_ttft_ms",
                                      "p99_ttft_ms", "p99_e2el_ms")},
                "spec": {"plain_steps": steps, "plain_step_s": steps * ms / 1e3,
                         "plain_emitted": steps * toks, "verify_steps": 0}}

    cells = [cell(0, 77.2), cell(1, 125.9), cell(2, 80.0),              # rep 1 slowed 1.63x
             cell(0, 60.0, load=4), cell(1, 75.0, load=4),              # 1.25x: not flagged
             cell(0, 60.0, load=16), cell(1, 100.0, toks=14.0, load=16),  # twice the tokens
             cell(0, 60.0, load=1, steps=3), cell(1, 120.0, load=1, steps=3)]  # too few steps
    assert serving_cells.slowed_cells(cells) == {("sharegpt", "max_concurrency", 8, "plugin-x", 1)}
    cells = [c for c in cells if c["max_concurrency"] > 1]  # c = 1 reports need draft counters
    base = [dict(c, config="nospec", spec={}) for c in cells]
    md = serving_report.markdown({"meta": {"pair": "ci", "started": "t", "git": {"short": "x"},
                                           "args": {}}, "cells": cells + base})
    assert "| c = 8 | 1 | plugin-x slowed |" in md and "| plugin-x | 1 slowed |" in md
    assert md.count(" slowed |") == 2, md


@pytest.mark.unit
def test_serving_report_merges_runs_of_one_sweep_and_refuses_overlaps(tmp_path):
    """A sweep measured in parts: the merged report has every run's loads, ratios stay
    paired inside each run, and a load measured twice or other settings are refused."""
    from benchmarks import serving_merge, serving_report

    def run(name, load, plug, **args):
        cells = [{"config": cfg, "workload": "mixed", "max_concurrency": load, "repetition": 0,
                  "output_throughput": tput, "median_tpot_ms": 1000.0 / tput,
                  "p99_tpot_ms": 2000.0 / tput} for cfg, tput in (("nospec", 100.0),
                                                                  ("plugin-x", plug))]
        meta = {"pair": "ci", "started": name, "git": {"short": name},
                "args": {"pair": "ci", "output_len": 64, **args}}
        (tmp_path / name).mkdir()
        (tmp_path / name / "serving.json").write_text(json.dumps({"meta": meta, "cells": cells}))
        return tmp_path / name

    a, b = run("a", 4, 120.0), run("b", 64, 99.0)
    res = serving_merge.merge([a, b])
    assert [s["loads"] for s in res["meta"]["sources"]] == [["mixed c = 4"], ["mixed c = 64"]]
    assert serving_report.crossovers(res)[("mixed", "max_concurrency")] == {"plugin-x": 64}
    md = serving_report.markdown(res)
    assert "- from `a` (git a): mixed c = 4" in md and "| 64 | 100.0 | 10.0 | 0.99x" in md
    with pytest.raises(SystemExit, match="mixed c = 4 was measured by both"):
        serving_merge.merge([a, run("c", 4, 100.0)])
    with pytest.raises(SystemExit, match=r"other settings .*output_len"):
        serving_merge.merge([a, run("d", 8, 100.0, output_len=128)])
    other = run("e", 8, 100.0)
    res_e = json.loads((other / "serving.json").read_text())
    res_e["meta"]["machine"] = {"hostname": "elsewhere"}
    (other / "serving.json").write_text(json.dumps(res_e))
    with pytest.raises(SystemExit, match=r"other settings .*machine"):
        serving_merge.merge([a, other])


@pytest.mark.unit
def test_vllm_plugins_empty_string_loads_nothing(monkeypatch):
    """VLLM_PLUGINS="" must load no general plugin (the in-tree comparisons rely on it),
    "specdec" only ours, and unset everything."""
    envs = pytest.importorskip("vllm.envs")
    from vllm import plugins

    class EP:
        def __init__(self, name):
            self.name, self.value = name, name

        def load(self):
            return lambda: self.name

    eps = [EP("specdec"), EP("lora_filesystem_resolver"), EP("lora_hf_hub_resolver")]
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: eps)
    for value, want in (("", set()), ("specdec", {"specdec"}), (None, {e.name for e in eps})):
        if value is None:
            monkeypatch.delenv("VLLM_PLUGINS", raising=False)
        else:
            monkeypatch.setenv("VLLM_PLUGINS", value)
        if hasattr(envs, "disable_envs_cache"):
            envs.disable_envs_cache()
        assert set(plugins.load_plugins_by_group(plugins.DEFAULT_PLUGINS_GROUP)) == want, value


# ------------------------------------------------------------------- report files


def _check_outputs(out: Path, configs: list[str], workloads: list[str], temps: list[float]):
    res = json.loads((out / "results.json").read_text())
    meta = res["meta"]
    for key in ("git", "versions", "machine", "thread_settings", "env", "engine_env", "engines",
                "groups", "args", "engine_kwargs"):
        assert key in meta, key
    assert meta["partial"] is False
    assert {c["name"] for c in res["configs"]} == set(configs)
    cells = {(c["config"], c["workload"], c["temperature"]) for c in res["summary"]}
    assert cells == {(c, w, t) for c in configs for w in workloads for t in temps}
    for c in res["summary"]:
        assert c["tps"]["median"] > 0
        assert c["speedup"]["n"] == meta["args"]["reps"]
        if c["k"]:
            for key in ("alpha_vllm", "mean_accepted_len", "accept_by_pos", "c_prime", "bound",
                        "efficiency", "t_target", "t_draft"):
                assert key in c, (c["config"], key)
            assert len(c["accept_by_pos"]) == c["k"]
            assert 1.0 <= c["mean_accepted_len"] <= c["k"] + 1
    for e in meta["engines"].values():
        assert (e["plugin_registrations"] > 0) == (e["vllm_plugins"] == "specdec")
    md = (out / "results.md").read_text()
    assert "| config | tok/s | speedup |" in md and all(c in md for c in configs)
    for png in ("speedup_vs_k.png", "acceptance_by_position.png", "speedup_vs_batch.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, png
    return res


def _bench(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "benchmarks.run", *args, "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return p


@pytest.mark.engine
def test_quick_smoke_fast(tmp_path, request):
    """--quick on the ci pair, nospec + plugin-k2, one tiny workload: the harness writes
    complete JSON / Markdown / PNG outputs (structure only, never speed)."""
    out = tmp_path / "res"
    _bench(["--quick", "--pair", "ci", "--configs", "plugin-k2", "--workloads", "single",
            "--temps", "0", "--reps", "2", "--max-tokens", "16", "--warmup-tokens", "4",
            "--wait-quiet", "30", "--out", str(out)], timeout=600)
    res = _check_outputs(out, ["nospec", "plugin-k2"], ["single"], [0.0])
    assert res["meta"]["engines"]["plugin-k2@g0"]["vllm_plugins"] == "specdec"
    # Re-rendering from the JSON alone works (report-only mode).
    (out / "results.md").unlink()
    _bench(["--report-only", str(out / "results.json")], timeout=120)
    assert (out / "results.md").exists()


@pytest.mark.slow
@pytest.mark.engine
def test_quick_smoke(tmp_path, request):
    """The full --quick mode (bench pair) runs end to end; a harness check, not a speed test."""
    from benchmarks.configs import QUICK_WORKLOADS

    out = tmp_path / "quick"
    _bench(["--quick", "--out", str(out)], timeout=1800)
    _check_outputs(out, list(QUICK_CONFIGS), list(QUICK_WORKLOADS), [0.0, 0.8])


# ---------------------------------------------------------------------- GPU script


@pytest.mark.unit
def test_gpu_reference_is_valid_and_importable():
    src = (REPO / "benchmarks" / "gpu_reference.py").read_text()
    ast.parse(src)
    import benchmarks.gpu_reference as g

    cfg1, cfg3 = g.llama32_config("1B"), g.llama32_config("3B")
    assert (cfg1["hidden_size"], cfg1["num_hidden_layers"], cfg1["num_attention_heads"],
            cfg1["num_key_value_heads"], cfg1["intermediate_size"]) == (2048, 16, 32, 8, 8192)
    assert (cfg3["hidden_size"], cfg3["num_hidden_layers"], cfg3["num_attention_heads"],
            cfg3["num_key_value_heads"], cfg3["intermediate_size"]) == (3072, 28, 24, 8, 8192)
    for c in (cfg1, cfg3):
        assert c["vocab_size"] == 128256 and c["tie_word_embeddings"] is True
        assert c["rope_scaling"]["rope_type"] == "llama3" and c["rope_scaling"]["factor"] == 32.0
    spec = g.synthetic_spec({"method": "draft_model", "num_speculative_tokens": 3}, 0.8)
    assert spec["rejection_sample_method"] == "synthetic"
    assert spec["synthetic_acceptance_rates"] == pytest.approx([0.8, 0.64, 0.512])


@pytest.mark.gpu
def test_gpu_reference_runs(tmp_path):
    """On a GPU machine: one short reference run at alpha 0.8 finishes and reports."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.gpu_reference", "--alphas", "0.8",
                        "--ks", "4", "--reps", "1", "--max-tokens", "32", "--workloads", "single",
                        "--out", str(tmp_path / "gpu")], cwd=REPO, capture_output=True, text=True,
                       timeout=3600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-6000:]
    assert (tmp_path / "gpu" / "results.json").exists()


def test_steady_ttft_drops_a_closed_loops_start_burst():
    from benchmarks.serving_client import Load, steady_ttft

    # c = 2: the first two requests start together and wait for each other's prefill
    cell = {"ttfts": [5.0, 5.0, 1.0, 2.0, 3.0], "start_times": [0.0, 0.0, 6.0, 7.0, 8.0]}
    got = steady_ttft(cell, Load("max_concurrency", 2))
    assert got["steady_p50_ttft_ms"] == 2000.0 and abs(got["steady_p99_ttft_ms"] - 2980.0) < 1e-6
    assert steady_ttft(cell, Load("request_rate", 2.0))["steady_p50_ttft_ms"] == 3000.0
    assert steady_ttft({"ttfts": [1.0]}, Load("request_rate", 1.0)) == {}


@pytest.mark.unit
def test_throughput_ceiling_spends_the_first_token_budget_and_verifies_every_decode_token(tmp_path):
    """The ceiling: the rest grows by 10 % of verify tokens (b ms each, α accepted),
    the remaining decode tokens come at the verifying steps' ms per token; b is the
    last fit the plugin's server logged before the cell ended."""
    from benchmarks import throughput_ceiling as tc

    # rest 10 s -> +1 s = 250 verify tokens at 4 ms, 200 accepted; 1,000 decode tokens
    # -> 800 at 5 ms = 4 s: 15 s.
    assert tc.ceiling_s(rest_s=10.0, decode_tokens=1000, verify_ms_per_token=5.0, b_ms=4.0,
                        alpha=0.8) == pytest.approx(15.0)
    assert tc.ceiling_s(rest_s=10.0, decode_tokens=100, verify_ms_per_token=5.0, b_ms=4.0,
                        alpha=0.8) == pytest.approx(11.0)  # gains beyond the decode tokens: none

    def cell(config, tput, spec=None):
        return {"config": config, "workload": "unique", "max_concurrency": 8, "repetition": 0,
                "date": "20261128-043649", "duration": 20.0, "total_output_tokens": 1200,
                "output_throughput": tput, **({"spec": spec} if spec else {})}

    spec = {"verify_step_s": 5.0, "verify_emitted": 1000.0, "plain_step_s": 2.0,
            "plain_emitted": 200.0, "draft_s": 3.0, "draft_tokens": 1000.0, "accepted": 800.0}
    (tmp_path / "serving.json").write_text(json.dumps({"cells": [
        cell("nospec", 40.0), cell("suffix-k32", 50.0), cell("plugin-x", 60.0, spec)]}))
    (tmp_path / "serve-plugin-x-rep0.log").write_text(
        "(Worker pid=1) INFO 11-28 04:30:00 [step_record.py:116] specdec: step cost fit: "
        "a 50 ms + b 9 ms/token + p 2 ms/prefill token, σ 1 ms; at B 8: v 0.4\n"
        "(Worker pid=1) INFO 11-28 04:36:04 [step_record.py:116] specdec: step cost fit: "
        "a 50 ms + b 4 ms/token + p 2 ms/prefill token, σ 1 ms; at B 8: v 0.4\n"
        "(Worker pid=1) INFO 11-28 04:40:00 [step_record.py:116] specdec: step cost fit: "
        "a 50 ms + b 1 ms/token + p 2 ms/prefill token, σ 1 ms; at B 8: v 0.4\n")
    (row,) = tc.rows_of(tmp_path, "suffix-k32")
    assert row["b_ms"] == 4.0 and row["alpha"] == 0.8 and row["rest_s"] == pytest.approx(10.0)
    # 1,200 decode tokens: 10 + 1 + (1200 - 200) * 5 ms = 16 s; no speculation took 30 s.
    assert row["ceiling"] == pytest.approx(30.0 / 16.0)
    assert row["measured"] == 1.5 and row["other"] == 1.25
    (line,) = [ln for ln in tc.lines(tmp_path, "suffix-k32") if "plugin-x" in ln]
    assert "| 5.00 | 10.00 | 4.00 | 0.80 | 1.50x | 1.88x | 1.25x | 1.38x |" in line


@pytest.mark.unit
def test_sharegpt_answers_are_cut_at_lengths_of_their_own_with_a_spread(tmp_path, monkeypatch):
    """--output-spread on ShareGPT: each reference answer is cut at its own drawn length
    (mean output-len), not all at output-len; answers shorter than their cut stay whole;
    the prompts and their order are the seed's either way."""
    import hashlib
    import types

    from benchmarks import workloads
    from specdec_fixtures import registry_files, sharegpt

    ids = [i for i in (f"c{n}" for n in range(5000)) if sharegpt.is_heldout(i)][:60]
    convs = [{"id": i, "conversations": [
        {"from": "human", "value": f"question {i} " + "w " * 5},
        {"from": "gpt", "value": " ".join(f"a{j}" for j in range(8 if n % 10 == 0 else 300))}]}
        for n, i in enumerate(ids)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    assert hashlib.sha256(ids[0].encode()).digest()[0] < sharegpt.HELDOUT_BYTE

    class Tok:  # one token per word
        def __call__(self, text, add_special_tokens=True):
            return types.SimpleNamespace(input_ids=text.split())

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(ids)

        def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
            return "user: " + msgs[0]["content"]

    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(
        AutoTokenizer=types.SimpleNamespace(from_pretrained=lambda _: Tok())))
    monkeypatch.setattr(registry_files, "fetch", lambda *a, **k: path)

    def answer_lens(spread):
        pool = workloads.sharegpt_pool("tok", 128, 2048, seed=3, spread=spread)
        return [p["id"] for p in pool], [len(p["conversations"][1]["value"].split()) for p in pool]

    fixed_ids, fixed = answer_lens(0.0)
    varied_ids, varied = answer_lens(0.5)
    assert varied_ids == fixed_ids and len(fixed_ids) == 60
    assert set(fixed) == {8, 128}
    long = [n for n in varied if n != 8]
    assert min(long) >= 64 and max(long) <= 192 and len(set(long)) > 20
    assert varied.count(8) == fixed.count(8) == 6   # short answers stay whole
