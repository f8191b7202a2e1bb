"""Observability end to end: two `vllm serve` with the plugin, a real Prometheus with
the shipped config and rules, bounded load; every dashboard and rule expression
evaluates to data, and acceptance agrees across responses, /metrics and Prometheus.

Server "fixture" drafts with the model and has a small draft pool (so pool_full rounds
happen); server "fixture-ngram" drafts by prompt lookup (so novel text gives plain,
draft-free steps). Both are scraped by one Prometheus, as a fleet would be.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from harness import plugin_spec
from prompts import CODE, PROSE
from server import Server, free_port

REPO = Path(__file__).resolve().parents[2]
PROM_BIN = REPO / ".cache/prometheus/usr/bin/prometheus"
DEPLOY = REPO / "deploy"

_assets_spec = importlib.util.spec_from_file_location("deploy_assets", REPO / "tests/unit/test_deploy_assets.py")
assets = importlib.util.module_from_spec(_assets_spec)
_assets_spec.loader.exec_module(assets)


def _fetch_prometheus() -> None:
    if PROM_BIN.exists():
        return
    p = subprocess.run(["bash", str(REPO / "scripts/fetch_prometheus.sh")], capture_output=True, text=True)
    if p.returncode != 0 or not PROM_BIN.exists():
        pytest.skip(f"Prometheus could not be fetched: {(p.stdout + p.stderr).strip()[-500:]}")


class Prometheus:
    def __init__(self, config: Path, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [str(PROM_BIN), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("prometheus did not become ready")

    def query(self, expr: str) -> list[dict]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else None

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def _scrape_config(targets: list[str], tmp: Path) -> Path:
    """The shipped prometheus.yml, pointed at this test's servers (ports are free ones)."""
    cfg = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "vllm"]
    assert jobs, "deploy/prometheus/prometheus.yml has no 'vllm' job"
    jobs[0]["static_configs"] = [{"targets": targets}]
    cfg["rule_files"] = [str(DEPLOY / "prometheus" / f) for f in cfg["rule_files"]]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _metric(text: str, name: str, **labels) -> float:
    """Sum of a metric's samples on a /metrics page whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _load(srv: Server, model: str, prompts: list[str]) -> list[dict]:
    """Mixed bounded load: greedy and sampled, n=1 and n=2, a multi-prompt and a chat call."""
    bodies = []
    for i, prompt in enumerate(prompts):
        bodies.append({"model": model, "prompt": prompt, "max_tokens": 40, "seed": i,
                       "temperature": 0.0 if i % 2 else 0.8, "n": 2 if i % 4 == 0 else 1})
    bodies.append({"model": model, "prompt": prompts[:2], "max_tokens": 24, "temperature": 0})
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda b: ("/v1/completions", srv.post("/v1/completions", b)), bodies))
    # One at a time: short prose prompts start with no history to look up, so the
    # n-gram server has steps where no request drafts (plain steps).
    alone = [srv.post("/v1/completions", {"model": model, "prompt": p, "max_tokens": 16,
                                          "temperature": 0}) for p in prompts[-2:]]
    chat = srv.post("/v1/chat/completions", {"model": model, "max_tokens": 24, "temperature": 0.8, "n": 2,
                                             "messages": [{"role": "user", "content": prompts[0]}]})
    return [r for _, r in outs] + alone + [chat]


def _response_totals(responses: list[dict]) -> tuple[int, int]:
    """Sum accepted/drafted over every choice's per-request acceptance field."""
    drafted = accepted = 0
    for r in responses:
        for c in r["choices"]:
            sd = c.get("speculative_decoding")
            assert sd is not None, f"choice without speculative_decoding: {c}"
            assert {"draft_acceptance_rate", "mean_acceptance_length", "num_spec_steps"} <= set(sd)
            if sd["num_draft_tokens"]:
                assert sd["draft_acceptance_rate"] == pytest.approx(
                    sd["num_accepted_draft_tokens"] / sd["num_draft_tokens"])
            drafted += sd["num_draft_tokens"]
            accepted += sd["num_accepted_draft_tokens"]
        if len(r["choices"]) == 1:  # vLLM's own single-sequence field agrees with ours
            theirs = {k: v for k, v in r["metrics"]["speculative_decoding"].items() if v is not None}
            assert theirs == r["choices"][0]["speculative_decoding"]
    return drafted, accepted


def _pool_mib_for_blocks(draft: Path, blocks: int, block_size: int = 16) -> float:
    c = json.loads((draft / "config.json").read_text())
    kv_heads = c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    per_block = c["num_hidden_layers"] * 2 * block_size * kv_heads * head_dim * 4  # float32
    return blocks * per_block / 2**20




def test_dashboard_and_rules_against_a_real_prometheus(ci_pair, tmp_path):
    _fetch_prometheus()
    # max_model_len 128 needs 8 blocks of 16; a pool of 9 holds three of the ~3-block
    # requests below, so 8 concurrent ones hit pool_full.
    mib = _pool_mib_for_blocks(ci_pair.draft, 9)
    draft_srv = Server(ci_pair.target, plugin_spec(ci_pair.draft, 3, draft_kv_cache_mib=mib),
                       log=tmp_path / "serve-draft.log", name="fixture",
                       extra_args=["--max-model-len", "128"])
    ngram_srv = Server(ci_pair.target, plugin_spec(ci_pair.draft, 3, method="ngram"),
                       log=tmp_path / "serve-ngram.log", name="fixture-ngram")
    prom = None
    try:
        draft_srv.wait_ready()
        ngram_srv.wait_ready()
        prom = Prometheus(_scrape_config([f"127.0.0.1:{draft_srv.port}", f"127.0.0.1:{ngram_srv.port}"],
                                         tmp_path), tmp_path)
        # A baseline scrape of both servers before the load, so rate() sees the increase
        # (Prometheus staggers its first scrape by up to one interval).
        deadline = time.time() + 60
        baseline = 'sum by (model_name) (specdec_draft_tokens_total{job="vllm"})'
        while time.time() < deadline and len(prom.query(baseline)) < 2:
            time.sleep(1)
        assert len(prom.query(baseline)) == 2, "no baseline scrape"
        responses = {
            "fixture": _load(draft_srv, "fixture", (CODE[:6] + PROSE[:6])),
            "fixture-ngram": _load(ngram_srv, "fixture-ngram", (CODE[:4] + PROSE[:4])),
        }
        pages = {"fixture": draft_srv.get("/metrics"), "fixture-ngram": ngram_srv.get("/metrics")}

        for model, page in pages.items():
            # vLLM's counters keep working and agree with ours.
            ours = _metric(page, "specdec_draft_tokens_total")
            assert ours > 0, f"{model}: no specdec_draft_tokens_total on /metrics"
            assert ours == _metric(page, "vllm:spec_decode_num_draft_tokens_total")
            assert _metric(page, "specdec_accepted_tokens_total") == _metric(
                page, "vllm:spec_decode_num_accepted_tokens_total")
            # Per-request fields sum to the same totals.
            drafted, accepted = _response_totals(responses[model])
            assert (drafted, accepted) == (ours, _metric(page, "specdec_accepted_tokens_total")), model
        # By source: the n-gram server drafts only from the request, the draft server only
        # from its model (fixed k, method draft).
        assert _metric(pages["fixture-ngram"], "specdec_draft_tokens_total", source="draft") == 0
        assert _metric(pages["fixture"], "specdec_draft_tokens_total", source="ngram") == 0
        assert _metric(pages["fixture"], "specdec_no_draft_rounds_total", reason="pool_full") > 0
        assert _metric(pages["fixture-ngram"], "specdec_target_step_seconds_count", kind="plain") > 0

        # Wait until Prometheus has scraped the final counters and evaluated the rules.
        deadline = time.time() + 90
        want = {m: _metric(p, "specdec_draft_tokens_total") for m, p in pages.items()}
        while time.time() < deadline:
            got = {m: prom.value(f'sum(specdec_draft_tokens_total{{model_name="{m}"}})') for m in want}
            windowed = [prom.value(f'specdec:acceptance_rate:rate5m{{model_name="{m}"}}') for m in want]
            rules_done = all(v is not None and math.isfinite(v) for v in windowed)
            if got == want and rules_done:
                time.sleep(6)  # one more rule evaluation on the final scrape
                break
            time.sleep(2)
        assert got == want, (got, want)

        # Acceptance from Prometheus equals the one computed from the responses.
        for model in want:
            drafted, accepted = _response_totals(responses[model])
            sel = f'{{model_name="{model}"}}'
            prom_rate = prom.value(f"sum(specdec_accepted_tokens_total{sel}) / sum(specdec_draft_tokens_total{sel})")
            assert prom_rate == pytest.approx(accepted / drafted, abs=1e-9), model
            windowed = prom.value(f"specdec:acceptance_rate:rate5m{sel}")
            assert windowed == pytest.approx(accepted / drafted, abs=0.02), model

        # Every dashboard query and every rule (alerts: each clause's quantity) has data.
        dashboard = json.loads((DEPLOY / "grafana/specdec-dashboard.json").read_text())
        rules = yaml.safe_load((DEPLOY / "prometheus/specdec-rules.yml").read_text())
        exprs = {f"panel {p['title']!r}": t["expr"].replace("$model_name", ".*")
                 for p, t in assets._targets(dashboard)}
        exprs.update({f"record {n}": e for n, e in assets._recording(rules).items()})
        for name, alert in assets._alerts(rules).items():
            for i, (lhs, _, _) in enumerate(assets.alert_clauses(alert["expr"])):
                exprs[f"alert {name} clause {i}"] = lhs
        empty, not_finite = [], []
        for name, expr in exprs.items():
            res = prom.query(expr)
            if not res:
                empty.append(name)
            elif not any(math.isfinite(float(r["value"][1])) for r in res):
                not_finite.append(name)
        assert not empty, f"no data for: {empty}"
        assert not not_finite, f"only NaN/Inf for: {not_finite}"
    finally:
        for s in (draft_srv, ngram_srv):
            s.stop()
        if prom is not None:
            prom.stop()
