"""Ray Serve: two CPU replicas of the plugin, brought up and down by deploy/ray/cluster.py.

Slow tier (SPECDEC_SLOW=1; needs `ray[serve]`, about 6 minutes and 10 GiB):
1. the single-process plugin (tests' harness) answers the prompts first, greedy;
2. `cluster.py up` with deploy/ray/fixture-cpu.yaml (2 replicas, 127.0.0.1);
3. 16 concurrent greedy completions (half with return_token_ids) equal the
   single-process output, and both replicas served some (per-ReplicaId counters);
4. Ray's metrics export port carries ray_specdec_* (the bridge) and ray_vllm_spec_decode_*
   for both ReplicaIds, and per replica the plugin's draft-token total equals vLLM's;
5. one replica's vLLM EngineCore is killed under load: every request still succeeds
   (the client retries with backoff), answered by the other replica or the restarted one;
6. `cluster.py down` leaves no process of the cluster and frees its ports.

The bridge's sample mirroring itself is checked without Ray (fast, below).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from harness import engine_kwargs, plugin_spec, run_engine
from prompts import CODE, PROSE

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "deploy" / "ray" / "cluster.py"
CONFIG = REPO / "deploy" / "ray" / "fixture-cpu.yaml"
HAVE_RAY = importlib.util.find_spec("ray") is not None

_spec = importlib.util.spec_from_file_location("ray_cluster", CLUSTER)
cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cluster)

PROMPTS = CODE[:10] + PROSE[:6]  # 16
MAX_TOKENS = 24
RECOVERY_S = 180  # a request may retry this long after the kill


# ---------------------------------------------------------------- helpers

def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


_LINE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and not line.startswith("#"):
            out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def per_replica(samples, name: str, **labels) -> dict[str, float]:
    """Sum of ``name`` by ReplicaId (samples whose labels include ``labels``)."""
    out: dict[str, float] = {}
    for n, lab, v in samples:
        if n == name and all(lab.get(k) == w for k, w in labels.items()):
            out[lab.get("ReplicaId", "")] = out.get(lab.get("ReplicaId", ""), 0.0) + v
    return out


def _deployed_spec() -> tuple[int, dict]:
    """num_speculative_tokens and the plugin options of fixture-cpu.yaml (draft path aside)."""
    cfg = yaml.safe_load(CONFIG.read_text())
    spec = cfg["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["speculative_config"]
    opts = dict(spec["draft_load_config"]["model_loader_extra_config"]["specdec"])
    opts.pop("draft_model")
    return spec["num_speculative_tokens"], opts


class Client:
    """Completions with retry on any error (backoff 1, 2, 4, 8, 8 ... s) for up to RECOVERY_S."""

    def __init__(self, base: str, model: str):
        self.url, self.model = f"{base}/completions", model
        self.log: list[dict] = []
        self._lock = threading.Lock()

    def complete(self, prompt: str, token_ids: bool = False) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        if token_ids:
            body["return_token_ids"] = True
        t0, errors, delay = time.time(), [], 1.0
        while True:
            try:
                r = _post(self.url, body)
                with self._lock:
                    self.log.append({"prompt": prompt, "t0": t0, "t1": time.time(), "errors": errors})
                return r
            except (urllib.error.URLError, OSError, ValueError) as e:
                detail = e.read().decode()[:200] if isinstance(e, urllib.error.HTTPError) else ""
                errors.append((round(time.time(), 2), f"{e!r} {detail}".strip()))
                if time.time() - t0 > RECOVERY_S:
                    raise AssertionError(f"request for {prompt!r} failed for {RECOVERY_S} s: {errors}")
                time.sleep(delay)
                delay = min(delay * 2, 8.0)


# ---------------------------------------------------------------- the bridge, without Ray

@pytest.mark.unit
def test_bridge_mirrors_multiprocess_samples(tmp_path):
    """specdec_* samples of a worker's multiprocess folder -> one gauge per sample name."""
    from vllm_specdec_plugin import ray_bridge

    writer = ("from vllm_specdec_plugin.metrics import ProposerMetrics\n"
              "m = ProposerMetrics('fx'); m.verified({'draft': 10, 'ngram': 2}, {'draft': 7, 'ngram': 1})\n"
              "m.step_done([3], {'adaptive': 1}, {}, 0); m.kv_blocks(3, 9)  # k 3 and k 0\n"
              "m.target_step('verify', 0.01, 4); m.no_draft('pool_full', 2)\n")
    subprocess.run([sys.executable, "-c", writer], check=True, cwd=REPO,
                   env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    got: dict[tuple, float] = {}
    made: dict[str, tuple] = {}

    class Gauge:
        def __init__(self, name, description, tag_keys):
            assert name not in made and re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name)
            made[name], self.name = tag_keys, name

        def set(self, value, tags):
            assert set(tags) == set(made[self.name])
            got[(self.name, tuple(sorted(tags.items())))] = value

    bridge = ray_bridge.Bridge(str(tmp_path), "rep1", Gauge)
    assert bridge.sync() == len(got) > 40
    assert bridge.sync() == len(got)  # gauges are made once, then only set
    lab = (("ReplicaId", "rep1"), ("model_name", "fx"))
    by = {s: lab + (("source", s),) for s in ("draft", "ngram")}
    assert got[("specdec_draft_tokens_total", by["draft"])] == 10
    assert got[("specdec_accepted_tokens_total", by["draft"])] == 7
    assert got[("specdec_accepted_tokens_total", by["ngram"])] == 1
    assert got[("specdec_draft_k_bucket", (("ReplicaId", "rep1"), ("le", "0.0"), ("model_name", "fx")))] == 1
    assert got[("specdec_draft_k_count", lab)] == 2 and got[("specdec_draft_k_sum", lab)] == 3
    assert got[("specdec_draft_kv_blocks_used", lab)] == 3
    assert got[("specdec_no_draft_rounds_total", lab[:1] + lab[1:] + (("reason", "pool_full"),))] == 2
    assert all(n.startswith("specdec_") and not n.endswith("_created") for n in made)
    assert made["specdec_target_step_seconds_bucket"] == ("ReplicaId", "kind", "le", "model_name")
    # Outside a Ray Serve replica nothing starts and the environment is left alone.
    before = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    assert ray_bridge.maybe_start() is False
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") == before


# ---------------------------------------------------------------- the deployment

@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SPECDEC_SLOW") != "1", reason="slow tier: set SPECDEC_SLOW=1")
@pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install -e '.[ray]'; never ray[llm])")
def test_two_replicas_metrics_and_failover(ci_pair, tmp_path):
    report: dict = {}
    k, opts = _deployed_spec()
    # 1. Reference: the single-process plugin, same prompts, greedy.
    t0 = time.time()
    ref = run_engine(engine_kwargs(ci_pair.target, plugin_spec(ci_pair.draft, k, **opts), max_model_len=512),
                     [{"name": "greedy", "prompts": PROMPTS,
                       "params": {"temperature": 0, "max_tokens": MAX_TOKENS}}])["jobs"]["greedy"]
    want = {p: o for p, o in zip(PROMPTS, ref)}
    report["reference_s"] = round(time.time() - t0, 1)

    for port in (cluster.METRICS_PORT, 8123):
        assert not cluster.port_open(port), f"port {port} is in use: another cluster up? (cluster.py down)"
    env = {**os.environ, "SPECDEC_TARGET": str(ci_pair.target), "SPECDEC_DRAFT": str(ci_pair.draft)}
    temp_dir = str(cluster.DEFAULT_TEMP_DIR)
    up_done = False
    try:
        # 2. Up.
        t0 = time.time()
        up = subprocess.run([sys.executable, str(CLUSTER), "up", "--config", str(CONFIG)], env=env,
                            capture_output=True, text=True, timeout=1500)
        report["up_s"] = round(time.time() - t0, 1)
        (tmp_path / "up.log").write_text(up.stdout + up.stderr)
        assert up.returncode == 0, (up.stdout + up.stderr)[-6000:]
        up_done = True
        base = re.search(r"^OpenAI endpoint: (\S+)$", up.stdout, re.M).group(1)
        metrics_url = re.search(r"^metrics: (\S+)$", up.stdout, re.M).group(1)
        assert base == "http://127.0.0.1:8123/v1" and metrics_url == "http://127.0.0.1:8080/metrics"
        state = json.loads(cluster.STATE_FILE.read_text())
        model = state["model_ids"][0]
        procs = cluster.owned_processes(temp_dir)
        report["processes"] = len(procs)
        report["rss_gib"] = round(sum(p.memory_info().rss for p in procs) / 2**30, 2)
        report["uss_gib"] = round(sum(p.memory_full_info().uss for p in procs) / 2**30, 2)
        engines = [p for p in procs if "EngineCore" in " ".join(p.cmdline())]
        assert len(engines) == 2, [cluster.describe(p) for p in procs]

        # 3. Load: 16 concurrent greedy completions equal the single-process output.
        client = Client(base, model)
        t0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda ip: client.complete(ip[1], token_ids=ip[0] % 2 == 0),
                                 enumerate(PROMPTS)))
        report["load_s"] = round(time.time() - t0, 1)
        assert not any(r["errors"] for r in client.log), client.log
        drafted_in_responses = 0
        for i, (prompt, r) in enumerate(zip(PROMPTS, outs)):
            c = r["choices"][0]
            assert c["text"] == want[prompt]["text"], (prompt, c["text"], want[prompt]["text"])
            if i % 2 == 0:
                assert c["token_ids"] == want[prompt]["token_ids"], prompt
            sd = c.get("speculative_decoding") or (r.get("metrics") or {}).get("speculative_decoding")
            report.setdefault("per_choice_acceptance_in_response", sd is not None)
            drafted_in_responses += (sd or {}).get("num_draft_tokens", 0)

        # 4. Metrics on Ray's export port: both replicas, ours == vLLM's per replica.
        deadline, samples = time.time() + 120, []
        while time.time() < deadline:
            samples = scrape(metrics_url)
            gen = per_replica(samples, "ray_vllm_generation_tokens_total")
            vd = per_replica(samples, "ray_vllm_spec_decode_num_draft_tokens_total")
            od = per_replica(samples, "ray_specdec_draft_tokens_total")
            if (sum(gen.values()) >= sum(len(o["token_ids"]) for o in ref) and len(vd) == 2
                    and od == vd):
                break
            time.sleep(3)
        report["metrics_names"] = sorted({n for n, _, _ in samples
                                          if n.startswith(("ray_specdec_", "ray_vllm_spec_decode"))})
        report["metrics_labels"] = {n: sorted(lab) for n, lab, _ in samples
                                    if n in ("ray_specdec_draft_tokens_total", "ray_specdec_draft_k_bucket",
                                             "ray_vllm_spec_decode_num_draft_tokens_total")}
        report["per_replica"] = {"generation_tokens": gen, "vllm_draft_tokens": vd, "specdec_draft_tokens": od}
        assert len([r for r, v in gen.items() if r and v > 0]) == 2, f"not both replicas served: {gen}"
        assert len(vd) == 2 and all(v > 0 for v in vd.values()), vd
        assert od == vd, f"plugin vs vLLM draft tokens per replica: {od} vs {vd}"
        assert per_replica(samples, "ray_specdec_accepted_tokens_total") == \
            per_replica(samples, "ray_vllm_spec_decode_num_accepted_tokens_total")
        for name in ("ray_specdec_draft_k_bucket", "ray_specdec_target_step_seconds_count",
                     "ray_specdec_draft_kv_blocks_total", "ray_vllm_spec_decode_num_drafts_total"):
            assert len(per_replica(samples, name)) == 2, name
        if report["per_choice_acceptance_in_response"]:
            assert drafted_in_responses == sum(vd.values())
        replicas_before = set(vd)

        # 5. Kill one replica's EngineCore under load; every request must still succeed.
        victim = engines[0]
        report["killed"] = cluster.describe(victim)
        t_kill = [0.0]

        def kill_soon():
            time.sleep(1.0)  # requests are in flight on both replicas
            t_kill[0] = time.time()
            os.kill(victim.pid, signal.SIGKILL)

        client = Client(base, model)
        killer = threading.Thread(target=kill_soon)
        killer.start()
        jobs = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            first = list(pool.map(client.complete, jobs))
        killer.join()
        # Keep a trickle of requests until the restarted replica serves one (a new ReplicaId).
        served_new, t_new, n_after = False, None, 0
        deadline = time.time() + 420
        with ThreadPoolExecutor(4) as pool:
            while time.time() < deadline and not served_new:
                batch = [PROMPTS[(n_after + i) % len(PROMPTS)] for i in range(4)]
                for prompt, r in zip(batch, pool.map(client.complete, batch)):
                    assert r["choices"][0]["text"] == want[prompt]["text"], prompt
                n_after += 4
                gen = per_replica(scrape(metrics_url), "ray_vllm_generation_tokens_total")
                new = {r for r, v in gen.items() if r and v > 0} - replicas_before
                if new:
                    served_new, t_new = True, time.time()
                time.sleep(2)
        for prompt, r in zip(jobs, first):
            assert r["choices"][0]["text"] == want[prompt]["text"], prompt
        errs = [e for rec in client.log for e in rec["errors"]]
        report["failover"] = {
            "requests": len(client.log), "requests_retried": sum(1 for r in client.log if r["errors"]),
            "errors": len(errs), "first_error_after_kill_s": round(errs[0][0] - t_kill[0], 1) if errs else None,
            "last_error_after_kill_s": round(max(e[0] for e in errs) - t_kill[0], 1) if errs else None,
            "error_kinds": sorted({e[1][:120] for e in errs})[:5],
            "max_request_s": round(max(r["t1"] - r["t0"] for r in client.log), 1),
            "restarted_replica_served_after_kill_s": round(t_new - t_kill[0], 1) if t_new else None,
        }
        assert all(r["t1"] for r in client.log) and len(client.log) == len(jobs) + n_after
        assert served_new, f"no restarted replica served within 420 s: {report['failover']}"
        live = cluster.owned_processes(temp_dir)
        assert len([p for p in live if "EngineCore" in " ".join(p.cmdline())]) == 2
        assert victim.pid not in {p.pid for p in live}
    finally:
        # 6. Down: nothing of the cluster is left.
        pids_seen = {p.pid for p in cluster.owned_processes(temp_dir)}
        t0 = time.time()
        down = subprocess.run([sys.executable, str(CLUSTER), "down"], capture_output=True, text=True,
                              timeout=600)
        report["down_s"] = round(time.time() - t0, 1)
        print("\nray-serve report:", json.dumps(report, indent=1, default=str))
    assert down.returncode == 0, down.stdout + down.stderr
    assert cluster.owned_processes(temp_dir) == []
    import psutil

    assert not [p for p in pids_seen if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], "processes left"
    pg = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True)
    assert pg.stdout.strip() == "", pg.stdout
    assert not cluster.port_open(cluster.METRICS_PORT) and not cluster.port_open(8123)
    assert not cluster.STATE_FILE.exists() and not Path(temp_dir).exists()
    assert up_done
