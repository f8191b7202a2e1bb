"""The Ray Serve variants of the dashboard and rules (deploy/ray/make_ray_variants.py).

- Regenerating them from the originals gives the committed files byte for byte.
- Every metric they use is a ray_-renamed metric of the originals (or a specdec_ray:
  recording rule), every label a known one or ReplicaId; alerts join per replica.
- With promtool (scripts/fetch_prometheus.sh): the rules check, every dashboard query
  parses, and on synthetic ray_* series with two replicas of one model the alerts fire
  for the bad replica only and every dashboard query returns data.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gen = _load("make_ray_variants", REPO / "deploy" / "ray" / "make_ray_variants.py")
assets = _load("deploy_assets", REPO / "tests" / "unit" / "test_deploy_assets.py")

RAY_METRICS = {gen.rename(m) for m in assets.KNOWN_METRICS}
RAY_LABELS = assets.KNOWN_LABELS | {"ReplicaId"}


@pytest.fixture(scope="module")
def rules():
    return yaml.safe_load(gen.RULES_RAY.read_text())


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(gen.DASHBOARD_RAY.read_text())


def _recording(rules):
    return {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def _alerts(rules):
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_regenerating_gives_identical_files():
    for path, text in gen.render().items():
        assert path.read_text() == text, f"{path.name} is stale: run python deploy/ray/make_ray_variants.py"
    assert gen.main(["--check"]) == 0


def test_rename():
    assert gen.rename('rate(specdec_draft_k_bucket{le="0.0"}[1m]) / vllm:spec_decode_num_drafts_total') == \
        'rate(ray_specdec_draft_k_bucket{le="0.0"}[1m]) / ray_vllm_spec_decode_num_drafts_total'
    assert gen.rename("specdec:acceptance_rate:rate5m") == "specdec_ray:acceptance_rate:rate5m"
    assert gen.rename("ray_specdec_x foo_specdec_y") == "ray_specdec_x foo_specdec_y"
    assert gen.add_replica("sum by (le, model_name) (x) / on (model_name) group_left sum by (reason) (y)") == \
        "sum by (le, model_name, ReplicaId) (x) / on (model_name, ReplicaId) group_left sum by (reason) (y)"


def test_rules_use_ray_names_and_keep_replica(rules):
    original = yaml.safe_load(gen.RULES.read_text())
    orig_records = [r["record"] for g in original["groups"] for r in g["rules"] if "record" in r]
    records = _recording(rules)
    assert list(records) == [gen.rename(r) for r in orig_records]
    assert {a["alert"] for g in original["groups"] for a in g["rules"] if "alert" in a} == {
        a.replace("SpecDecRay", "SpecDec") for a in _alerts(rules)}
    for name, expr in records.items():
        assert name.startswith("specdec_ray:")
        assert not metric_names_unknown(expr, records), (name, expr)
        assert assets.label_names(expr) <= RAY_LABELS
        for inner in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            if "model_name" in inner:
                assert "ReplicaId" in inner, (name, expr)
    for name, alert in _alerts(rules).items():
        for lhs, _, _ in assets.alert_clauses(alert["expr"]):
            assert not metric_names_unknown(lhs, records), (name, lhs)
        for inner in re.findall(r"\bon\s*\(([^)]*)\)", alert["expr"]):
            assert "ReplicaId" in inner, name
        assert "$labels.ReplicaId" in alert["annotations"]["summary"], name


def metric_names_unknown(expr: str, records) -> set[str]:
    return assets.metric_names(expr) - RAY_METRICS - set(records)


def test_dashboard_uses_ray_names_and_replica_filter(dashboard):
    original = json.loads(gen.DASHBOARD.read_text())
    assert [p["title"] for p in dashboard["panels"]] == [p["title"] for p in original["panels"]]
    assert dashboard["uid"] != original["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["model_name"]["query"]["query"] == "label_values(ray_specdec_draft_tokens_total, model_name)"
    assert "ReplicaId" in variables["replica"]["query"]["query"]
    for p, t in assets._targets(dashboard):
        expr = t["expr"]
        assert assets.metric_names(expr) <= RAY_METRICS, (p["title"], expr)
        assert assets.label_names(expr) <= RAY_LABELS, (p["title"], expr)
        for m in re.finditer(r"(?<![\w:])([A-Za-z_:][\w:]*)(\{[^}]*\})?", expr):
            if m.group(1) in RAY_METRICS:
                assert 'ReplicaId=~"$replica"' in (m.group(2) or ""), (p["title"], expr)
        if p["title"] in gen.PER_REPLICA_PANELS:
            assert "{{ReplicaId}}" in t.get("legendFormat", ""), p["title"]
    assert gen.PER_REPLICA_PANELS <= {p["title"] for p in dashboard["panels"]}


def test_prometheus_config_scrapes_ray():
    cfg = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert [t for sc in jobs["ray"]["static_configs"] for t in sc["targets"]] == ["127.0.0.1:8080"]


# ---------------------------------------------------------------- promtool

needs_promtool = pytest.mark.skipif(
    not (assets.PROM_BIN.is_file() and assets.PROMTOOL.is_file()),
    reason="Prometheus not fetched (.cache/prometheus/usr/bin/promtool absent); run scripts/fetch_prometheus.sh")


def _dashboard_rules(dashboard) -> dict:
    rules = [{"record": f"dash:p{p['id']}_{t['refId']}",
              "expr": t["expr"].replace("$model_name", ".*").replace("$replica", ".*")}
             for p, t in assets._targets(dashboard)]
    return {"groups": [{"name": "dashboard-queries", "rules": rules}]}


def _ray_series(model: str, replica: str) -> list[dict]:
    """The original test's synthetic series, renamed and labelled with a ReplicaId."""
    out = []
    for s in assets._series(model):
        name, labels = s["series"].split("{", 1)
        out.append({"series": f'{gen.rename(name)}{{{labels[:-1]},ReplicaId="{replica}"}}',
                    "values": s["values"]})
    return out


@needs_promtool
def test_promtool_checks_ray_rules_and_queries(dashboard, tmp_path):
    r = assets._promtool("check", "rules", str(gen.RULES_RAY.relative_to(REPO)))
    assert r.returncode == 0, r.stdout + r.stderr
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump(_dashboard_rules(dashboard), sort_keys=False))
    r = assets._promtool("check", "rules", str(f))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_alerts_fire_for_the_bad_replica_only(rules, dashboard, tmp_path):
    """One model, two replicas: "good" healthy, "bad" unhealthy in every alert's way."""
    stripped = json.loads(json.dumps(rules))
    for g in stripped["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(stripped, sort_keys=False))
    dash_rules = _dashboard_rules(dashboard)
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(dash_rules, sort_keys=False))
    series = [{**s, "series": s["series"].replace('model_name="good"', 'model_name="m"')}
              for s in _ray_series("good", "r-good")]
    series += [{**s, "series": s["series"].replace('model_name="bad"', 'model_name="m"')}
               for s in _ray_series("bad", "r-bad")]
    alert_tests = []
    for name, rule in _alerts(rules).items():
        alert_tests.append({"eval_time": "25m", "alertname": name, "exp_alerts": [
            {"exp_labels": {**rule["labels"], "model_name": "m", "ReplicaId": "r-bad"}}]})
    expr_tests = [{
        "expr": 'group by (__name__) ({__name__=~"dash:.+"})', "eval_time": "25m",
        "exp_samples": [{"labels": r["record"], "value": 1} for r in dash_rules["groups"][0]["rules"]]}]
    spec = {"rule_files": ["rules.yml", "dashboard.yml"], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": series, "alert_rule_test": alert_tests,
                       "promql_expr_test": expr_tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    r = assets._promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
