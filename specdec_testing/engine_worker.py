"""A vLLM engine held in a subprocess, driven by JSON lines on stdin/stdout.

Benchmarks keep one engine per configuration alive and interleave workloads across
them, so machine drift hits every configuration alike. Only one engine computes at
any moment (vLLM on CPU pins its worker to a core; concurrent engines would fight).

Protocol: one JSON object per line.
  <- {"ok": true, "ready": true, "pid": int, "torch_threads": int, "cpu_affinity": [int]}
  -> {"op": "generate", "prompts": [[ids]...], "params": {...} | [{...} per prompt],
      "batch_size": n, "timers": false}
  <- {"ok": true, "seconds": s, "outputs": [[ids]...], "metrics": {...},
      "proposer": {...} | null, "timers": {...} (only if asked)}
  -> {"op": "quit"}

``metrics`` and ``proposer`` are cumulative over the engine's life. ``timers`` (needs
``VLLM_ENABLE_V1_MULTIPROCESSING=0``; null otherwise) covers this call only; see
``StepTimers``.
"""

from __future__ import annotations

import json
import sys
import time


def _metrics(llm) -> dict:
    from specdec_testing import metric_values

    return metric_values(llm, ("vllm:spec_decode", "specdec"))


from vllm_specdec_plugin.compat.introspect import find_runner  # noqa: E402
from vllm_specdec_plugin.compat.step_timers import StepTimers  # noqa: E402


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
    import torch

    timers: StepTimers | None = None
    out.write(json.dumps({"ok": True, "ready": True, "pid": os.getpid(),
                          "torch_threads": torch.get_num_threads(),
                          "cpu_affinity": sorted(os.sched_getaffinity(0))}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        prompts = [TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]]
        params = cmd["params"]
        sps = ([SamplingParams(**p) for p in params] if isinstance(params, list)
               else [SamplingParams(**params)] * len(prompts))
        bs = cmd.get("batch_size") or len(prompts)
        if cmd.get("timers") and timers is None:
            runner = find_runner(llm)
            timers = StepTimers(runner) if runner is not None else None
        if timers is not None:
            timers.take()
        outputs = []
        t0 = time.perf_counter()
        for i in range(0, len(prompts), bs):
            for r in llm.generate(prompts[i:i + bs], sps[i:i + bs], use_tqdm=False):
                outputs.append(list(r.outputs[0].token_ids))
        dt = time.perf_counter() - t0
        reply = {"ok": True, "seconds": dt, "outputs": outputs,
                 "metrics": _metrics(llm), "proposer": proposer_snapshot(llm)}
        if cmd.get("timers"):
            reply["timers"] = timers.take() if timers is not None else None
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
