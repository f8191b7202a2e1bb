"""Bounded load with aborts against `vllm serve` with the plugin.

Three rounds of ROUND_SECONDS each: 64 concurrent streaming clients send requests
back to back with mixed sampling parameters; ~20% of the requests hang up mid-stream. Asserts: no server error, every completed stream has
exactly the requested number of tokens, the draft KV pool is empty after each drain
(plugin metrics), and resident memory after round 3 is < 5% above round 1.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time

import pytest

from harness import plugin_spec
from prompts import PROMPTS
from server import Server

CLIENTS = 64
ROUNDS = 3
ABORT_SHARE = 0.2
ROUND_SECONDS = 15.0


def _tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants (API server, EngineCore, worker)."""
    import psutil

    p = psutil.Process(pid)
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])


def _client(port: int, i: int, rng: random.Random, results: list) -> None:
    abort = rng.random() < ABORT_SHARE
    n_tokens = rng.randint(8, 48)
    params = {"temperature": rng.choice([0.0, 0.0, 0.7, 1.0]), "max_tokens": n_tokens,
              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    if params["temperature"] and rng.random() < 0.5:
        params.update(rng.choice([{"top_p": 0.9}, {"top_k": 20}, {"min_p": 0.05},
                                  {"presence_penalty": 0.5}, {"seed": i}]))
    body = {"model": "fixture", "prompt": PROMPTS[i % len(PROMPTS)], **params}
    rec = {"i": i, "abort": abort, "want": n_tokens, "status": None, "tokens": None, "error": None}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        if abort:
            resp.read1(rng.randint(1, 400))
            conn.close()
        else:
            usage, done = None, False
            for raw in resp:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    usage = chunk.get("usage") or usage
            rec["tokens"] = usage and usage["completion_tokens"]
            rec["done"] = done
            conn.close()
    except Exception as e:  # recorded and asserted on below
        rec["error"] = repr(e)
    results.append(rec)


def _blocks_used(srv: Server) -> list[float]:
    return [float(l.rsplit(" ", 1)[1]) for l in srv.get("/metrics").splitlines()
            if l.startswith("specdec_draft_kv_blocks_used{")]


@pytest.mark.timeout(1200)
def test_load_with_aborts(ci_pair, tmp_path):
    srv = Server(ci_pair.target, plugin_spec(ci_pair.draft, 3), log=tmp_path / "serve.log",
                 extra_args=["--max-num-seqs", "64"])
    rss, summary = [], []
    try:
        srv.wait_ready()
        for rnd in range(ROUNDS):
            rng = random.Random(1000 + rnd)
            results: list = []
            deadline = time.time() + ROUND_SECONDS

            def loop(i, r):  # one client: requests back to back until the round ends
                n = 0
                while time.time() < deadline:
                    _client(srv.port, i + CLIENTS * n, r, results)
                    n += 1

            threads = [threading.Thread(target=loop, args=(i, random.Random(rng.random())))
                       for i in range(CLIENTS)]
            t0 = time.time()
            for t in threads:
                t.start()
            for t in threads:
                t.join(600)
            took = time.time() - t0
            errors = [r for r in results if r["error"] and not r["abort"]]
            bad_status = [r for r in results if r["status"] != 200]
            wrong = [r for r in results if not r["abort"] and (r["tokens"] != r["want"] or not r.get("done"))]
            assert len(results) >= CLIENTS
            assert not errors, errors[:5]
            assert not bad_status, bad_status[:5]
            assert not wrong, wrong[:5]
            # Drain: the pool empties once the aborted requests are reaped.
            deadline = time.time() + 60
            while time.time() < deadline and any(_blocks_used(srv)):
                time.sleep(1)
            assert _blocks_used(srv) and not any(_blocks_used(srv)), _blocks_used(srv)
            with open(srv.log.name) as f:
                assert "Traceback" not in f.read()
            rss.append(_tree_rss_bytes(srv.proc.pid))
            summary.append({"round": rnd, "seconds": round(took, 1), "requests": len(results),
                            "aborted": sum(r["abort"] for r in results), "rss_gib": round(rss[-1] / 2**30, 3)})
        print("load rounds:", summary)
        assert rss[-1] < rss[0] * 1.05, summary
    finally:
        srv.stop()
