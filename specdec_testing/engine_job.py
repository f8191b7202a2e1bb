"""Run one vLLM engine over a list of generation jobs; write results as JSON.

Usage: python -m specdec_testing.engine_job JOB.json OUT.json

An engine spawns processes and pins a core, so tests start one engine at a time in a
subprocess and free it before the next. JOB.json::

    {"engine": {LLM kwargs...},
     "jobs": [{"name": str, "prompts": [str | [token ids]], "batch_size": int,
               "params": {SamplingParams kwargs} | [one per prompt]}]}

OUT.json: {"jobs": {name: [{"token_ids": [...], "text": str, "finish_reason": str,
                             "spec_decode": {per-sequence acceptance} | null}]},
           "metrics": {name: value}, "proposer": {...} | null,
           "rss_mib": {name: {"before": MiB, "peak": MiB}}}

The RSS of this process is sampled every 2 ms while a job runs (with
VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine runs here, so that is the engine's).
"""

from __future__ import annotations

import json
import sys
import threading
import time


class PeakRSS:
    """Peak resident set size of this process while the ``with`` block runs, in MiB."""

    def __enter__(self) -> "PeakRSS":
        self.before = self.peak = _rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mib())


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _metrics(llm) -> dict:
    from specdec_testing import metric_values

    try:
        return metric_values(llm)
    except Exception as e:  # metrics are best effort; results are what tests check
        return {"error": repr(e)}


def _from_json(params: dict) -> dict:
    """JSON object keys are strings; logit_bias wants token ids. A
    ``structured_outputs`` dict becomes vLLM's StructuredOutputsParams."""
    if params.get("logit_bias"):
        params = {**params, "logit_bias": {int(t): b for t, b in params["logit_bias"].items()}}
    if isinstance(params.get("structured_outputs"), dict):
        from vllm.sampling_params import StructuredOutputsParams

        params = {**params, "structured_outputs": StructuredOutputsParams(**params["structured_outputs"])}
    return params


def main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(open(job_path).read())
    t0 = time.perf_counter()
    llm = LLM(**spec["engine"])
    startup = time.perf_counter() - t0
    results: dict = {}
    timings: dict = {}
    rss: dict = {}
    for job in spec["jobs"]:
        prompts = [TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p
                   for p in job["prompts"]]
        params = job.get("params", {})
        plist = params if isinstance(params, list) else [params] * len(prompts)
        plist = [_from_json(p) for p in plist]
        bs = job.get("batch_size") or len(prompts)
        outs = []
        t1 = time.perf_counter()
        for i in range(0, len(prompts), bs):
            with PeakRSS() as mem:
                res = llm.generate(prompts[i:i + bs], [SamplingParams(**p) for p in plist[i:i + bs]],
                                   use_tqdm=False)
            prev = rss.get(job["name"], {"before": mem.before, "peak": 0.0})
            rss[job["name"]] = {"before": prev["before"], "peak": max(prev["peak"], mem.peak)}
            for r in res:
                for c in r.outputs:
                    sd = getattr(c, "spec_decode_metrics", None)
                    outs.append({"token_ids": list(c.token_ids), "text": c.text,
                                 "finish_reason": c.finish_reason,
                                 "prompt_len": len(r.prompt_token_ids or []),
                                 "spec_decode": sd.to_dict() if sd is not None else None})
        timings[job["name"]] = time.perf_counter() - t1
        results[job["name"]] = outs
    from specdec_testing.introspect import flush_finished, proposer_snapshot

    flush_finished(llm)

    out = {"jobs": results, "metrics": _metrics(llm), "startup_s": startup, "job_s": timings,
           "proposer": proposer_snapshot(llm), "rss_mib": rss}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
