"""Static and promtool checks of the monitoring assets under deploy/.

- deploy/prometheus/prometheus.yml, deploy/prometheus/specdec-rules.yml (YAML),
  deploy/grafana/specdec-dashboard.json (Grafana dashboard), deploy/README.md.
- Every PromQL metric name must be one the plugin or vLLM exports (or a recording rule).
- With the Prometheus package fetched by scripts/fetch_prometheus.sh (.cache/prometheus),
  promtool checks the config and rules, parses every dashboard query, and runs a
  `promtool test rules` unit test on synthetic series: the alerts fire for a bad server
  and stay quiet for a healthy one, each alert's left side evaluates alone, and every
  dashboard query returns data. Without the binary those checks are skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "specdec-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "specdec-dashboard.json"
README = DEPLOY / "README.md"
PROM_BIN = REPO / ".cache" / "prometheus" / "usr" / "bin" / "prometheus"
PROMTOOL = REPO / ".cache" / "prometheus" / "usr" / "bin" / "promtool"


def _hist(base: str) -> set[str]:
    return {base + s for s in ("_bucket", "_sum", "_count")}


# Exposed names (counters with _total, histograms as _bucket/_sum/_count).
PLUGIN_METRICS = {
    "specdec_draft_tokens_total",
    "specdec_accepted_tokens_total",
    *_hist("specdec_request_acceptance_rate"),
    *_hist("specdec_draft_step_seconds"),
    *_hist("specdec_target_step_seconds"),
    "specdec_emitted_tokens_total",
    *_hist("specdec_draft_k"),
    "specdec_no_draft_rounds_total",
    "specdec_draft_source_rounds_total",
    "specdec_backed_off_requests",
    "specdec_draft_kv_blocks_used",
    "specdec_draft_kv_blocks_total",
}
VLLM_METRICS = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:num_requests_running",
}
KNOWN_METRICS = PLUGIN_METRICS | VLLM_METRICS
KNOWN_LABELS = {"model_name", "engine", "kind", "reason", "source", "position", "le", "__name__"}

_PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (regex-based; enough for our queries)."""
    s = _strip_strings(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range / subquery windows
    s = _GROUPING.sub(" ", s)  # by (...), on (...), ...
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", s):
        if m.group(1).lower() not in _PROMQL_KEYWORDS:
            names.add(m.group(1))
    return names


def label_names(expr: str) -> set[str]:
    s = _strip_strings(expr)
    names = set()
    for sel in re.findall(r"\{([^}]*)\}", s):
        names |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", sel))
    for _, inner in _GROUPING.findall(s):
        names |= {x.strip() for x in inner.split(",") if x.strip()}
    return names


def _norm(expr: str) -> str:
    """Whitespace-insensitive form, as written in the README table."""
    s = re.sub(r"\s+", " ", expr).strip()
    return s.replace("( ", "(").replace(" )", ")")


# ---------------------------------------------------------------- loading

@pytest.fixture(scope="module")
def prom_config():
    return yaml.safe_load(PROM_CONFIG.read_text())


@pytest.fixture(scope="module")
def rules():
    return yaml.safe_load(RULES.read_text())


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def readme():
    return README.read_text()


def _group(rules, name):
    groups = {g["name"]: g for g in rules["groups"]}
    assert name in groups, f"rule group {name!r} missing; have {sorted(groups)}"
    return groups[name]


def _recording(rules):
    return {r["record"]: r["expr"] for r in _group(rules, "specdec-recording")["rules"]}


def _alerts(rules):
    return {r["alert"]: r for r in _group(rules, "specdec-alerts")["rules"]}


def _targets(dashboard):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p, t


_CLAUSE_SPLIT = re.compile(r"\s+(?:and|or|unless)(?:\s+(?:on|ignoring)\s*\([^)]*\))?\s+")
_CLAUSE = re.compile(r"^(?P<lhs>.*\S)\s*(?P<op>==|!=|<=|>=|<|>)\s*(?P<thr>-?\d+(?:\.\d+)?(?:e-?\d+)?)$",
                     re.S)


def alert_clauses(expr: str) -> list[tuple[str, str, float]]:
    """Split `<lhs> <op> <threshold> [and|or on(...) <lhs> <op> <threshold> ...]`."""
    out = []
    for clause in _CLAUSE_SPLIT.split(expr.strip()):
        m = _CLAUSE.match(clause.strip())
        assert m, f"alert clause is not '<quantity> <op> <threshold>': {clause!r}"
        out.append((m["lhs"].strip(), m["op"], float(m["thr"])))
    return out


# ---------------------------------------------------------------- the parser itself

def test_metric_name_parser():
    e = ('histogram_quantile(0.95, sum by (le, model_name) (rate(specdec_draft_step_seconds_bucket'
         '{model_name=~"$model_name",kind="verify"}[1m]))) / on (model_name) group_left '
         'vllm:spec_decode_num_drafts_total > bool 1e-3')
    assert metric_names(e) == {"specdec_draft_step_seconds_bucket", "vllm:spec_decode_num_drafts_total"}
    assert label_names(e) == {"le", "model_name", "kind"}
    assert alert_clauses('a:b{reason="x"} > 0 or on (model_name) c < 0.95') == [
        ('a:b{reason="x"}', ">", 0.0), ("c", "<", 0.95)]


# ---------------------------------------------------------------- prometheus.yml

def test_prometheus_config(prom_config):
    assert prom_config["global"]["scrape_interval"] == "5s"
    assert prom_config["global"]["evaluation_interval"] == "5s"
    assert prom_config["rule_files"] == ["specdec-rules.yml"]
    assert (PROM_CONFIG.parent / prom_config["rule_files"][0]).is_file()
    jobs = {j["job_name"]: j for j in prom_config["scrape_configs"]}
    assert set(jobs) == {"vllm", "ray"}  # ray: Ray's metrics export port (deploy/ray/)
    vllm = jobs["vllm"]
    assert vllm.get("metrics_path", "/metrics") == "/metrics"
    assert [t for sc in vllm["static_configs"] for t in sc["targets"]] == ["127.0.0.1:8000"]
    assert [t for sc in jobs["ray"]["static_configs"] for t in sc["targets"]] == ["127.0.0.1:8080"]


# ---------------------------------------------------------------- rules

def test_recording_rules_use_known_metrics(rules):
    defined: set[str] = set()
    for name, expr in _recording(rules).items():
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), name
        unknown = metric_names(expr) - KNOWN_METRICS - defined
        assert not unknown, f"{name}: unknown metrics {unknown}"
        assert label_names(expr) <= KNOWN_LABELS, f"{name}: {label_names(expr) - KNOWN_LABELS}"
        defined.add(name)


EXPECTED_ALERTS = {"SpecDecAcceptanceCollapsed", "SpecDecSlowerThanPlain", "SpecDecDraftPoolExhausted"}


def test_alerts_are_quantity_op_threshold(rules):
    recording = _recording(rules)
    alerts = _alerts(rules)
    assert set(alerts) == EXPECTED_ALERTS
    for name, rule in alerts.items():
        assert rule.get("for"), f"{name} has no 'for'"
        assert rule.get("labels", {}).get("severity") in {"info", "warning", "critical"}, name
        ann = rule.get("annotations", {})
        assert ann.get("summary") and len(ann.get("description", "")) > 80, name
        clauses = alert_clauses(rule["expr"])
        for lhs, _, _ in clauses:
            names = metric_names(lhs)
            assert names, f"{name}: left side {lhs!r} references no metric"
            unknown = names - set(recording) - KNOWN_METRICS
            assert not unknown, f"{name}: left side {lhs!r} uses unknown {unknown}"
            assert label_names(lhs) <= KNOWN_LABELS
            bare = re.sub(r"\{[^}]*\}", "", _strip_strings(lhs))
            assert not re.search(r"==|!=|<|>", bare), f"{name}: comparison inside left side {lhs!r}"

    # The specific thresholds the alerts promise.
    c = alert_clauses(alerts["SpecDecAcceptanceCollapsed"]["expr"])
    assert c[0] == ("specdec:acceptance_rate:rate5m", "<", 0.2)
    assert c[1] == ("specdec:draft_tokens:rate5m", ">", 0.0)
    c = alert_clauses(alerts["SpecDecSlowerThanPlain"]["expr"])
    assert c == [("specdec:spec_vs_plain_seconds_per_token:ratio10m", ">", 1.0)]
    c = alert_clauses(alerts["SpecDecDraftPoolExhausted"]["expr"])
    assert 'reason="pool_full"' in c[0][0] and c[0][1:] == (">", 0.0)
    assert c[1] == ("specdec:draft_kv_blocks:utilization", ">", 0.95)
    assert " or " in alerts["SpecDecDraftPoolExhausted"]["expr"]
    # windows: acceptance 5m, slower-than-plain 10m, both sides of the time comparison
    assert "[5m]" in recording["specdec:acceptance_rate:rate5m"]
    for r in ("specdec:spec_seconds_per_token:rate10m", "specdec:plain_seconds_per_token:rate10m"):
        assert "[10m]" in recording[r] and "[5m]" not in recording[r]
    spec = recording["specdec:spec_seconds_per_token:rate10m"]
    assert {"specdec_target_step_seconds_sum", "specdec_draft_step_seconds_sum",
            "specdec_emitted_tokens_total"} <= metric_names(spec) and 'kind="verify"' in spec
    assert 'kind="plain"' in recording["specdec:plain_seconds_per_token:rate10m"]


# ---------------------------------------------------------------- dashboard

def test_dashboard_structure(dashboard):
    assert dashboard["schemaVersion"] == 39
    assert dashboard.get("title") and dashboard.get("uid")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    model = variables["model_name"]
    assert model["type"] == "query"
    q = model["query"]["query"] if isinstance(model["query"], dict) else model["query"]
    assert q == "label_values(specdec_draft_tokens_total, model_name)"
    assert model["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        assert p["type"] in {"timeseries", "stat", "heatmap", "gauge", "bargauge", "table"}, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p.get("description", "").strip(), f"panel {p['title']!r} has no description"
        assert p.get("targets"), f"panel {p['title']!r} has no targets"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t.get("expr", "").strip(), f"panel {p['title']!r} target {t['refId']} has empty expr"
        if p["type"] == "heatmap":
            assert all(t.get("format") == "heatmap" for t in p["targets"]), p["title"]


REQUIRED_PANELS = {
    "Acceptance rate per model", "Mean accepted length per model", "Acceptance by draft position",
    "Output tokens/s", "Draft step vs verify step latency", "k distribution",
    "Rounds without draft by reason", "Draft KV blocks used vs total",
    "Per-request acceptance-rate distribution", "vLLM vs plugin acceptance agreement",
}


def test_dashboard_covers_required_panels(dashboard):
    by_title = {p["title"]: p for p in dashboard["panels"]}
    assert REQUIRED_PANELS <= set(by_title), REQUIRED_PANELS - set(by_title)
    exprs = lambda title: " ".join(t["expr"] for t in by_title[title]["targets"])  # noqa: E731
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in exprs("Acceptance by draft position")
    assert "vllm:spec_decode_num_drafts_total" in exprs("Acceptance by draft position")
    lat = exprs("Draft step vs verify step latency")
    assert "histogram_quantile(0.5," in lat and "histogram_quantile(0.95," in lat
    assert {"specdec_draft_step_seconds_sum", "specdec_draft_step_seconds_count",
            "specdec_target_step_seconds_sum", "specdec_target_step_seconds_count"} <= metric_names(lat)
    assert "specdec_draft_k_bucket" in exprs("k distribution")
    assert "reason" in exprs("Rounds without draft by reason")
    assert {"specdec_draft_kv_blocks_used", "specdec_draft_kv_blocks_total"} <= metric_names(
        exprs("Draft KV blocks used vs total"))
    assert "specdec_request_acceptance_rate_bucket" in exprs("Per-request acceptance-rate distribution")
    agree = metric_names(exprs("vLLM vs plugin acceptance agreement"))
    assert {"vllm:spec_decode_num_accepted_tokens_total", "specdec_accepted_tokens_total"} <= agree
    assert exprs("Mean accepted length per model").lstrip().startswith("1 +")


def test_dashboard_queries_use_known_metrics_filters_and_1m(dashboard):
    for p, t in _targets(dashboard):
        where = f"panel {p['title']!r} target {t['refId']}"
        expr = t["expr"]
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= KNOWN_METRICS, f"{where}: unknown metrics {names - KNOWN_METRICS}"
        assert label_names(expr) <= KNOWN_LABELS, f"{where}: {label_names(expr) - KNOWN_LABELS}"
        windows = re.findall(r"\[([^\]]*)\]", expr)
        assert all(w == "1m" for w in windows), f"{where}: windows {windows}, want [1m]"
        # every selector filters on the model variable
        for m in re.finditer(r"(?<![\w:])([A-Za-z_:][\w:]*)(\{[^}]*\})?", expr):
            if m.group(1) in KNOWN_METRICS:
                sel = m.group(2) or ""
                assert 'model_name=~"$model_name"' in sel, \
                    f"{where}: {m.group(1)} not filtered by $model_name"


# ---------------------------------------------------------------- README

def test_readme_documents_everything(readme, dashboard, rules):
    assert "make serve" in readme and "scripts/fetch_prometheus.sh" in readme
    assert "--web.listen-address=127.0.0.1:9090" in readme
    assert re.search(r"--storage\.tsdb\.path=\.cache/", readme)
    assert "--config.file=deploy/prometheus/prometheus.yml" in readme
    assert "Grafana" in readme and "offline" in readme
    table = "\n".join(line for line in readme.splitlines() if line.startswith("|"))
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()}
    for p in dashboard["panels"]:
        assert p["title"] in rows, f"README table lacks panel {p['title']!r}"
        for t in p["targets"]:
            assert _norm(t["expr"]) in rows[p["title"]], \
                f"README row for {p['title']!r} lacks target {t['refId']}: {_norm(t['expr'])}"
    for g in rules["groups"]:
        for r in g["rules"]:
            name = r.get("record") or r.get("alert")
            assert name in rows, f"README table lacks rule {name!r}"
            assert _norm(r["expr"]) in rows[name], f"README row for {name} has a stale expr"


# ---------------------------------------------------------------- promtool

needs_promtool = pytest.mark.skipif(
    not (PROM_BIN.is_file() and PROMTOOL.is_file()),
    reason="Prometheus not fetched (.cache/prometheus/usr/bin/{prometheus,promtool} absent); "
           "run scripts/fetch_prometheus.sh")


def _promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([str(PROMTOOL), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@needs_promtool
def test_promtool_check_config():
    r = _promtool("check", "config", str(PROM_CONFIG.relative_to(REPO)))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_check_rules():
    r = _promtool("check", "rules", str(RULES.relative_to(REPO)))
    assert r.returncode == 0, r.stdout + r.stderr


def _dash_rule_name(p, t) -> str:
    return f"dash:p{p['id']}_{t['refId']}"


def _dashboard_rules(dashboard) -> dict:
    """Every dashboard query as a recording rule, with $model_name = All (.*)."""
    rules = [{"record": _dash_rule_name(p, t), "expr": t["expr"].replace("$model_name", ".*")}
             for p, t in _targets(dashboard)]
    return {"groups": [{"name": "dashboard-queries", "rules": rules}]}


@needs_promtool
def test_promtool_parses_dashboard_queries(dashboard, tmp_path):
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump(_dashboard_rules(dashboard), sort_keys=False))
    r = _promtool("check", "rules", str(f))
    assert r.returncode == 0, r.stdout + r.stderr


# Synthetic scrape data, one sample per 15s for 30m, for a healthy model ("good") and one
# on which every alert should fire ("bad"). Counters grow by the per-15s increment given.
def _series(model: str) -> list[dict]:
    bad = model == "bad"
    M = f'model_name="{model}"'
    V = f'{M},engine="0"'
    n = 120

    def ctr(name, inc, labels=M):
        return {"series": f"{name}{{{labels}}}", "values": f"0+{inc}x{n}"}

    def gauge(name, v, labels=M):
        return {"series": f"{name}{{{labels}}}", "values": f"{v}+0x{n}"}

    def hist(name, edges, per_le, total_sum, labels=M):
        out = [ctr(f"{name}_bucket", per_le(e), f'{labels},le="{e}"') for e in edges]
        out.append(ctr(f"{name}_bucket", per_le(float("inf")), f'{labels},le="+Inf"'))
        out += [ctr(f"{name}_count", per_le(float("inf")), labels), ctr(f"{name}_sum", total_sum, labels)]
        return out

    secs = ("0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0",
            "2.5", "5.0", "10.0")
    accepted = 4 if bad else 30  # of 40 draft tokens per 15s: 0.1 vs 0.75
    s = [
        ctr("specdec_draft_tokens_total", 40), ctr("specdec_accepted_tokens_total", accepted),
        ctr("vllm:spec_decode_num_draft_tokens_total", 40, V),
        ctr("vllm:spec_decode_num_accepted_tokens_total", accepted, V),
        ctr("vllm:spec_decode_num_drafts_total", 10, V),
        ctr("vllm:generation_tokens_total", 20, V), ctr("vllm:prompt_tokens_total", 100, V),
        gauge("vllm:num_requests_running", 4, V),
        *[ctr("vllm:spec_decode_num_accepted_tokens_per_pos_total", x, f'{V},position="{i}"')
          for i, x in enumerate((2, 1, 1, 0) if bad else (9, 8, 7, 6))],
        *hist("specdec_request_acceptance_rate", [f"{i / 10:.1f}" for i in range(1, 11)],
              lambda e: 1 if float(e) >= (0.1 if bad else 0.7) else 0, 0.1 if bad else 0.75),
        # seconds per emitted token: good (0.1 + 0.05) / 10 = 0.015 < plain 0.03 / 1;
        # bad (0.3 + 0.1) / 10 = 0.04 > 0.03
        *hist("specdec_draft_step_seconds", secs, lambda e: 1 if float(e) >= 0.1 else 0,
              0.1 if bad else 0.05),
        *hist("specdec_target_step_seconds", secs, lambda e: 1 if float(e) >= 0.5 else 0,
              0.3 if bad else 0.1, f'{M},kind="verify"'),
        *hist("specdec_target_step_seconds", secs, lambda e: 1 if float(e) >= 0.05 else 0, 0.03,
              f'{M},kind="plain"'),
        ctr("specdec_emitted_tokens_total", 10, f'{M},kind="verify"'),
        ctr("specdec_emitted_tokens_total", 1, f'{M},kind="plain"'),
        *hist("specdec_draft_k", [f"{k:.1f}" for k in (0, 1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)],
              lambda e: 1 if float(e) < 4 else 10, 36),
        *[ctr("specdec_no_draft_rounds_total", 1 if (bad and r == "pool_full") else 0,
              f'{M},reason="{r}"')
          for r in ("pool_full", "length_guard", "adaptive", "load", "ngram_miss")],
        *[ctr("specdec_draft_source_rounds_total", x, f'{M},source="{src}"')
          for src, x in (("draft", 6), ("ngram", 3), ("none", 8 if bad else 1))],
        gauge("specdec_backed_off_requests", 3 if bad else 0),
        gauge("specdec_draft_kv_blocks_used", 99 if bad else 50),
        gauge("specdec_draft_kv_blocks_total", 100),
    ]
    return s


# For each alert clause (in order): whether it holds for the good and the bad model.
CLAUSE_TRUTH = {
    "SpecDecAcceptanceCollapsed": [{"good": 0, "bad": 1}, {"good": 1, "bad": 1}],
    "SpecDecSlowerThanPlain": [{"good": 0, "bad": 1}],
    "SpecDecDraftPoolExhausted": [{"good": 0, "bad": 1}, {"good": 0, "bad": 1}],
}


@needs_promtool
def test_promtool_rule_unit_tests(rules, dashboard, tmp_path):
    """Alerts fire on a bad server only; left sides evaluate alone; dashboard queries have data."""
    stripped = json.loads(json.dumps(rules))
    for g in stripped["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)  # rendered text is checked by `promtool check rules`
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(stripped, sort_keys=False))
    dash_rules = _dashboard_rules(dashboard)
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(dash_rules, sort_keys=False))

    alerts = _alerts(rules)
    assert set(CLAUSE_TRUTH) == set(alerts)
    alert_tests = []
    for name, rule in alerts.items():
        alert_tests.append({"eval_time": "2m", "alertname": name, "exp_alerts": []})  # pending only
        alert_tests.append({"eval_time": "25m", "alertname": name, "exp_alerts": [
            {"exp_labels": {**rule["labels"], "model_name": "bad"}}]})
    expr_tests = []
    for name, rule in alerts.items():
        clauses = alert_clauses(rule["expr"])
        assert len(clauses) == len(CLAUSE_TRUTH[name]), name
        for (lhs, op, thr), truth in zip(clauses, CLAUSE_TRUTH[name]):
            expr = f"sum by (model_name) ({lhs}) {op} bool {thr}"
            expr_tests.append({"expr": expr, "eval_time": "25m", "exp_samples": [
                {"labels": f'{{model_name="{m}"}}', "value": v} for m, v in truth.items()]})
    expr_tests.append({
        "expr": 'group by (__name__) ({__name__=~"dash:.+"})', "eval_time": "25m",
        "exp_samples": [{"labels": r["record"], "value": 1} for r in dash_rules["groups"][0]["rules"]]})
    spec = {
        "rule_files": ["rules.yml", "dashboard.yml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": _series("good") + _series("bad"),
                   "alert_rule_test": alert_tests, "promql_expr_test": expr_tests}],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    r = _promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
