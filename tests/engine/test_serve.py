"""`vllm serve` (our launcher) with the plugin answers /v1/completions, chat (the
fixtures carry a chat template) and structured chat (OpenAI ``response_format``), and
/metrics; register() ran in the API-server and engine-core processes."""

import json

from harness import plugin_spec
from server import Server


def test_vllm_serve_with_plugin(ci_pair, tmp_path):
    trace = tmp_path / "register.jsonl"
    srv = Server(ci_pair.target, plugin_spec(ci_pair.draft, 3), env={"SPECDEC_REGISTER_TRACE": str(trace)},
                 log=tmp_path / "serve.log")
    try:
        srv.wait_ready()
        r = srv.post("/v1/completions", {"model": "fixture", "prompt": "def main(", "max_tokens": 24,
                                         "temperature": 0})
        assert r["choices"][0]["text"], r
        assert r["usage"]["completion_tokens"] == 24
        chat = srv.post("/v1/chat/completions", {"model": "fixture", "max_tokens": 16, "temperature": 0,
                                                 "messages": [{"role": "user", "content": "def main("}]})
        choice = chat["choices"][0]
        assert choice["message"]["content"] and chat["usage"]["completion_tokens"] == 16, chat
        assert choice["speculative_decoding"]["num_draft_tokens"] > 0, choice
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                  "additionalProperties": False}
        structured = srv.post("/v1/chat/completions", {
            "model": "fixture", "max_tokens": 48, "temperature": 0.8, "seed": 1,
            "messages": [{"role": "user", "content": "give a"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}})
        choice = structured["choices"][0]
        if choice["finish_reason"] == "stop":  # a tiny model may run out of tokens mid-number
            assert isinstance(json.loads(choice["message"]["content"])["a"], int), choice
        assert choice["message"]["content"].startswith("{"), choice
        assert "speculative_decoding" in choice, choice
        metrics = srv.get("/metrics")
        assert "vllm:spec_decode_num_draft_tokens_total" in metrics
        drafted = [l for l in metrics.splitlines()
                   if l.startswith("vllm:spec_decode_num_draft_tokens_total")]
        assert any(float(l.rsplit(" ", 1)[1]) > 0 for l in drafted), drafted
    finally:
        srv.stop()
    recs = [json.loads(l) for l in trace.read_text().splitlines()]
    by_pid = {r["pid"]: r for r in recs}
    assert len(recs) == len(by_pid), "register() must run once per process"
    # API server (the `vllm` script itself) -> EngineCore (its child) -> worker (the
    # EngineCore's child): the plugin was loaded in each.
    api = by_pid[srv.proc.pid]
    core = [r for r in recs if r["ppid"] == api["pid"] and r["process"].startswith("EngineCore")]
    assert len(core) == 1, recs
    workers = [r for r in recs if r["ppid"] == core[0]["pid"] and "Worker" in r["process"]]
    assert len(workers) == 1, recs
