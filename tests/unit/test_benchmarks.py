"""The serving benchmark's plumbing (configurations, workloads, report) and the step-log
summary; no engine. tests/engine/test_serving_smoke.py runs the harness itself.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import stats  # noqa: E402
from benchmarks.configs import TABLE, Entry, expand, select  # noqa: E402

# ------------------------------------------------------------------ statistics


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


# ----------------------------------------------------------- configuration table


@pytest.mark.unit
def test_config_table_and_selection():
    cfgs = expand()
    names = [c.name for c in cfgs]
    assert names[0] == "nospec" and {"draft_model-k4", "ngram-k4", "plugin-k4"} <= set(names)
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
def test_the_mixed_prompt_set_ships_its_eight_prompts():
    from benchmarks.workloads import load_prompt_set

    prompts = load_prompt_set("mixed")
    assert len(prompts) == 8 and all(p.strip() and "%%%%" not in p for p in prompts)


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
def test_sampled_chat_workloads_send_their_own_sampling_and_seed():
    """sharegpt-t07 (-seeded) send T 0.7 / top-p 0.9 (and a seed in the request body)
    whatever --temperature says; the other workloads send --temperature; all three draw
    ShareGPT conversations, and the report labels the sampled ones."""
    import json

    from benchmarks import serving, serving_client, serving_report

    args = serving.parse_args(["--workloads", "sharegpt,sharegpt-t07,sharegpt-t07-seeded",
                               "--temperature", "0"])
    body = lambda a: json.loads(a[a.index("--extra-body") + 1])  # noqa: E731
    greedy = serving_client._sampling_args("sharegpt", args)
    assert greedy[:2] == ["--temperature", "0.0"]
    sampled = serving_client._sampling_args("sharegpt-t07", args)
    assert sampled[:4] == ["--temperature", "0.7", "--top-p", "0.9"]
    seeded = serving_client._sampling_args("sharegpt-t07-seeded", args)
    assert seeded[:4] == ["--temperature", "0.7", "--top-p", "0.9"]
    assert "seed" in body(seeded) and "seed" not in body(sampled)
    # the same conversations, each workload its own cache_salt (no shared prefix or corpus)
    assert len({body(a)["cache_salt"] for a in (greedy, sampled, seeded)}) == 3
    assert "--extra-body" not in serving_client._sampling_args("unique", args)
    assert all(serving_client.is_sharegpt(w) for w in args.workloads)
    assert not serving_client.is_sharegpt("unique")
    assert "not exact on CPU" in serving_report.workload_label("sharegpt-t07-seeded")
    assert serving_report.workload_label("sharegpt") == "sharegpt"


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


def test_steady_ttft_drops_a_closed_loops_start_burst():
    from benchmarks.serving_client import Load, steady_ttft

    # c = 2: the first two requests start together and wait for each other's prefill
    cell = {"ttfts": [5.0, 5.0, 1.0, 2.0, 3.0], "start_times": [0.0, 0.0, 6.0, 7.0, 8.0]}
    got = steady_ttft(cell, Load("max_concurrency", 2))
    assert got["steady_p50_ttft_ms"] == 2000.0 and abs(got["steady_p99_ttft_ms"] - 2980.0) < 1e-6
    assert steady_ttft(cell, Load("request_rate", 2.0))["steady_p50_ttft_ms"] == 3000.0
    assert steady_ttft({"ttfts": [1.0]}, Load("request_rate", 1.0)) == {}


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


STEP_LOG = """\
(APIServer pid=10) INFO 12-06 10:00:00 [api_server.py:1200] Starting vLLM API server 0 on http://127.0.0.1:8000
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:01 [step_record.py:150] specdec step: s 120.00 exact 0.00 gap 0.00 | n 0 m 40 rows 0 verify 0 emitted 1 | pred - plain - sigma 0.00
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:01 [step_record.py:150] specdec step: s 40.00 exact 0.00 gap 1.00 | n 2 m 0 rows 2 verify 0 emitted 2 | pred 41.00 plain 41.00 sigma 0.00
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:01 [batch.py:93] specdec round: s 5.00 fed 2 rows 2 drafts 8 passes 4
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:01 [step_record.py:150] specdec step: s 60.00 exact 3.00 gap 6.00 | n 10 m 0 rows 2 verify 1 emitted 6 | pred 55.00 plain 41.00 sigma 2.50
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:02 [step_record.py:150] specdec step: s 44.00 exact 0.00 gap 1.40 | n 4 m 0 rows 4 verify 0 emitted 4 | pred 43.00 plain 43.00 sigma 0.00
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:02 [step_record.py:150] specdec step: s 70.00 exact 3.50 gap 7.00 | n 12 m 0 rows 4 verify 1 emitted 9 | pred 66.00 plain 43.00 sigma 2.60
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:02 [step_record.py:150] specdec step: s 150.00 exact 0.00 gap 2.00 | n 4 m 64 rows 4 verify 0 emitted 5 | pred 140.00 plain 130.00 sigma 0.00
(EngineCore_DP0 pid=11) DEBUG 12-06 10:00:03 [step_record.py:150] specdec step: s 42.00 exact 0.00 gap 1.20 | n 3 m 0 rows 3 verify 0 emitted 3 | pred 42.00 plain 42.00 sigma 0.00
(APIServer pid=10) WARNING 12-06 10:00:04 [serving.py:300] something unrelated
"""


def test_step_log_summarises_decode_steps_by_kind_and_the_prompt_share(tmp_path, capsys):
    """benchmarks.step_log over a served log: the step lines alone (not the round,
    INFO or WARNING lines), decode steps without a prompt by kind with their median
    rows, ms and host gap, over all of them and by batch size, and the share of steps
    that carried a prompt."""
    from benchmarks import step_log

    lines = STEP_LOG.splitlines()
    assert len(lines) == 10
    steps = step_log.parse(lines)
    assert len(steps) == 7 and steps[0]["pred"] is None and steps[4]["sigma"] == 2.6
    s = step_log.summary(steps)
    assert s["plain"] == {"count": 3, "rows": 3, "ms": 42.0, "gap_ms": 1.2}
    assert s["verify"] == {"count": 2, "rows": 3.0, "ms": 65.0, "gap_ms": 6.5}
    assert s["prompt_share"] == pytest.approx(2 / 7)
    assert step_log.summary([]) == {"plain": {"count": 0, "rows": None, "ms": None, "gap_ms": None},
                                    "verify": {"count": 0, "rows": None, "ms": None, "gap_ms": None},
                                    "prompt_share": None}
    log = tmp_path / "serve-plugin-rep0.log"
    log.write_text(STEP_LOG)
    step_log.main([str(log)])
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{log}: 7 steps, 28.6% with a prompt",
                   "  all         plain  decode steps      3, median rows 3, 42.00 ms, gap 1.20 ms",
                   "  all         verify decode steps      2, median rows 3, 65.00 ms, gap 6.50 ms",
                   "  rows 2-8    plain  decode steps      3, median rows 3, 42.00 ms, gap 1.20 ms",
                   "  rows 2-8    verify decode steps      2, median rows 3, 65.00 ms, gap 6.50 ms"]


@pytest.mark.unit
def test_ngram_followers_reads_the_longest_match_and_the_sampling_distribution():
    """benchmarks.ngram_followers: the longest suffix's follower counts (as NGramIndex
    matches), and p after temperature then top-p (the nucleus keeps the tokens whose
    mass before them is under top_p)."""
    import torch

    from benchmarks.ngram_followers import followers_at, sampling_probs

    # "1 2" occurred twice, followed by 3 then 4; the 3-gram "9 1 2" never before
    assert followers_at([1, 2, 3, 1, 2, 4, 9, 1, 2]) == ({3: 1, 4: 1}, 4)
    assert followers_at([5, 6, 7]) is None
    p = sampling_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 0.7)
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = sampling_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 1.0, 1.0)
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


@pytest.mark.unit
def test_sampled_summary_pairs_workloads_on_the_same_prompts():
    """benchmarks.sampled_summary: each configuration's ratios within its own workload,
    the plugin's acceptance per draft source and step times, and seeded over unseeded."""
    from benchmarks import sampled_summary

    def cell(config, workload, tput, tpot, spec=None):
        return {"config": config, "workload": workload, "max_concurrency": 1, "repetition": 0,
                "output_throughput": tput, "median_tpot_ms": tpot, "spec": spec or {}}

    spec = {"draft_tokens": 10, "accepted": 6, "drafted_ngram": 4, "accepted_ngram": 1,
            "drafted_draft": 6, "accepted_draft": 5, "verify_step_s": 0.5, "verify_steps": 10,
            "plain_step_s": 3.0, "plain_steps": 100}
    res = {"cells": [cell("nospec", "sharegpt-t07", 20.0, 40.0),
                     cell("nospec", "sharegpt-t07-seeded", 20.0, 40.0),
                     cell("plugin-x", "sharegpt-t07", 22.0, 36.0, spec),
                     cell("plugin-x", "sharegpt-t07-seeded", 24.0, 36.9, spec)]}
    text = "\n".join(sampled_summary.summary(res))
    assert "plugin-x" in text and "1.10x / 0.90x, accepted 0.60 of 10" in text
    assert "ngram 0.25 of 4 draft 0.83 of 6" in text and "verify 50.0 ms plain 30.0 ms" in text
    assert "plugin-x                           1.025" in text
