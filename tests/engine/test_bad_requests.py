"""Bad-request matrix against `vllm serve` with the plugin, side by side with the same
server without speculation (plugin installed, not selected).

Each case gets what vLLM without speculation returns: the same 4xx, or a 200 with the
same tokens (greedy / deterministic cases) or a valid output of the requested shape
(sampled cases). After every case both servers still answer /health; after the
matrix the plugin's draft KV pool is empty again (its metrics say so).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

import pytest

from harness import plugin_spec
from server import Server

MAX_LEN = 512
LONG = "def f(x):\n    return x + 1\n" * 60      # ~420 tokens with the fixture tokenizer


def _post(srv: Server, body: dict, path="/v1/completions"):
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


BASE = {"model": "fixture", "prompt": "def main(", "max_tokens": 24}
# name: (request overrides, how to compare a 200: "same" tokens, or "valid" shape only)
CASES = {
    "prompt_plus_max_tokens_over_max_model_len": ({"prompt": LONG, "max_tokens": 400}, "same"),
    "n_greater_than_1": ({"n": 3, "temperature": 0.8, "seed": 3}, "valid"),
    "logprobs": ({"logprobs": 5, "temperature": 0}, "same"),
    "prompt_logprobs": ({"prompt_logprobs": 2, "temperature": 0}, "same"),
    "stop_string_inside_a_round": ({"stop": [")", "\n"], "temperature": 0, "max_tokens": 40}, "same"),
    "stop_token_ids": ({"stop_token_ids": [10, 11, 12], "temperature": 0, "max_tokens": 40}, "same"),
    "negative_temperature": ({"temperature": -1.0}, "same"),
    "huge_temperature": ({"temperature": 1e6, "seed": 1}, "valid"),
    "top_k_invalid": ({"top_k": -5, "temperature": 1.0}, "same"),
    "top_k_1_is_deterministic": ({"top_k": 1, "temperature": 1.0}, "same"),
    "top_p_zero": ({"top_p": 0.0, "temperature": 1.0}, "same"),
    "top_p_above_one": ({"top_p": 1.5, "temperature": 1.0}, "same"),
    "min_p_above_one": ({"min_p": 2.0, "temperature": 1.0}, "same"),
    "min_p_valid": ({"min_p": 0.2, "temperature": 1.0, "seed": 5}, "valid"),
    "logit_bias_out_of_range_id": ({"logit_bias": {"999999": 5}, "temperature": 0}, "same"),
    "logit_bias_valid_greedy": ({"logit_bias": {"50": 100}, "temperature": 0}, "same"),
    "empty_prompt": ({"prompt": ""}, "same"),
    "seed_sampled": ({"seed": 1234, "temperature": 0.9}, "valid"),
    "very_long_prompt": ({"prompt": LONG, "max_tokens": 40, "temperature": 0}, "same"),
    "max_tokens_zero": ({"max_tokens": 0}, "same"),
    "min_tokens_above_max_tokens": ({"min_tokens": 30, "max_tokens": 10}, "same"),
    "presence_penalty_out_of_range": ({"presence_penalty": 5.0, "temperature": 0.5}, "same"),
    "penalties_greedy": ({"repetition_penalty": 1.3, "frequency_penalty": 0.5, "temperature": 0}, "same"),
}


@pytest.fixture(scope="module")
def servers(ci_pair, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    spec_srv = Server(ci_pair.target, plugin_spec(ci_pair.draft, 3), log=logs / "plugin.log")
    base_srv = Server(ci_pair.target, None, log=logs / "baseline.log")
    try:
        spec_srv.wait_ready()
        base_srv.wait_ready()
        yield spec_srv, base_srv
    finally:
        spec_srv.stop()
        base_srv.stop()


def _healthy(srv):
    with urllib.request.urlopen(srv.url + "/health", timeout=10) as r:
        return r.status == 200


@pytest.mark.parametrize("name", list(CASES))
def test_bad_request_matrix(servers, name):
    spec_srv, base_srv = servers
    overrides, mode = CASES[name]
    body = {**BASE, **overrides}
    got_status, got = _post(spec_srv, body)
    want_status, want = _post(base_srv, body)
    assert got_status == want_status, (name, got_status, got, want_status, want)
    if got_status != 200:
        assert 400 <= got_status < 500, (name, got_status, got)
        assert got.get("error", {}).get("message"), got
    elif mode == "same":
        assert [c["text"] for c in got["choices"]] == [c["text"] for c in want["choices"]], name
        assert [c["finish_reason"] for c in got["choices"]] == [c["finish_reason"] for c in want["choices"]]
        if body.get("logprobs"):
            g, w = got["choices"][0]["logprobs"], want["choices"][0]["logprobs"]
            assert g["tokens"] == w["tokens"]
            assert g["token_logprobs"] == pytest.approx(w["token_logprobs"], abs=1e-3)
        if body.get("prompt_logprobs"):
            assert len(got["choices"][0]["prompt_logprobs"]) == len(want["choices"][0]["prompt_logprobs"])
    else:
        assert len(got["choices"]) == body.get("n", 1)
        for c in got["choices"]:
            assert c["finish_reason"] in ("length", "stop")
        assert got["usage"]["completion_tokens"] > 0
    assert _healthy(spec_srv) and _healthy(base_srv)


def test_same_seed_same_output(servers):
    spec_srv, _ = servers
    body = {**BASE, "seed": 99, "temperature": 1.0, "max_tokens": 32}
    assert _post(spec_srv, body)[1]["choices"][0]["text"] == _post(spec_srv, body)[1]["choices"][0]["text"]


def test_client_disconnect_mid_stream_leaves_no_draft_blocks(servers):
    spec_srv, _ = servers
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", spec_srv.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({**BASE, "max_tokens": 200, "stream": True,
                                                            "ignore_eos": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read1(200)          # a few chunks, then hang up mid-stream
        conn.close()
    time.sleep(3)
    status, out = _post(spec_srv, {**BASE, "temperature": 0})
    assert status == 200 and out["choices"][0]["text"]
    deadline = time.time() + 30
    while time.time() < deadline:
        used = [l for l in spec_srv.get("/metrics").splitlines()
                if l.startswith("specdec_draft_kv_blocks_used{")]
        if used and all(float(l.rsplit(" ", 1)[1]) == 0 for l in used):
            return
        time.sleep(1)
    pytest.fail(f"draft KV blocks still in use after aborted streams: {used}")
