"""A vLLM engine held in a subprocess, driven by JSON lines on stdin/stdout.

Benchmarks keep one engine per configuration alive and interleave workloads across
them, so machine drift hits every configuration alike. Only one engine computes at
any moment (vLLM on CPU pins its worker to a core; concurrent engines would fight).

Protocol: one JSON object per line.
  -> {"op": "generate", "prompts": [[ids]...], "params": {...}, "batch_size": n}
  <- {"ok": true, "seconds": s, "outputs": [[ids]...], "metrics": {...}}
  -> {"op": "quit"}
"""

from __future__ import annotations

import json
import sys
import time


def _metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        v = getattr(m, "value", None)
        if v is None:
            v = getattr(m, "values", None)
        if m.name.startswith("vllm:spec_decode") or m.name.startswith("specdec"):
            out[m.name] = v
    return out


def main() -> None:
    import os

    # vLLM (and its child processes) log to fd 1: keep the protocol on a private
    # duplicate of stdout and send fd 1 to stderr before vLLM is imported.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_specdec_plugin.compat.introspect import proposer_snapshot

    engine_kwargs = json.loads(sys.argv[1])
    llm = LLM(**engine_kwargs)
    out.write(json.dumps({"ok": True, "ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        prompts = [TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]]
        sp = SamplingParams(**cmd["params"])
        bs = cmd.get("batch_size") or len(prompts)
        outputs = []
        t0 = time.perf_counter()
        for i in range(0, len(prompts), bs):
            for r in llm.generate(prompts[i:i + bs], sp, use_tqdm=False):
                outputs.append(list(r.outputs[0].token_ids))
        dt = time.perf_counter() - t0
        out.write(json.dumps({"ok": True, "seconds": dt, "outputs": outputs,
                              "metrics": _metrics(llm), "proposer": proposer_snapshot(llm)}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
