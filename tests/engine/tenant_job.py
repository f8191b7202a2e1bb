"""Run one in-process engine through phases of salted requests; write results as JSON.

Usage: python tests/engine/tenant_job.py JOB.json OUT.json

JOB.json: {"engine": {LLM kwargs}, "phases": [{"name": str, "salt": str | null,
  "prompts": [str], "params": {SamplingParams kwargs}, "abort_after": int | null}]}
A phase adds all its requests at once and steps until they finish; with
``abort_after`` it aborts the unfinished ones after that many steps. Then it takes one
more step, as a server would, so the worker hears of the finished requests.

OUT.json: {"phases": {name: [{"token_ids", "finish_reason", "spec_decode"}]},
           "corpus": {name: proposer corpus tokens per scope after the phase}}

The step-cost model is fed modelled seconds (``_model_clock``), not the wall clock:
hybrid's source choice reads the fitted costs, so timing noise alone would change the
drafted counts that the tenancy test compares between runs. The model is exactly
linear, so any run's fit reaches the same costs whatever other tenants sent.
"""

from __future__ import annotations

import json
import sys


def _model_clock() -> None:
    """Replace measured seconds by a fixed linear model of the step's work (the engine
    runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    from vllm_specdec_plugin.control.cost import StepCost

    step, draft, catch = StepCost.observe_step, StepCost.observe_draft, StepCost.observe_catch_up
    StepCost.observe_step = lambda self, _s, n, m, rows, _e=0.0, verified=False, _p=0: step(
        self, 0.02 + 0.0004 * n + 0.0002 * m + (0.001 if verified else 0.0), n, m, rows,
        0.001 if verified else 0.0, verified)
    StepCost.observe_draft = lambda self, _s, p, n: draft(self, 0.001 * p + 0.0001 * n, p, n)
    # the catch-up fit prices a lagging draft and bounds what a round feeds
    StepCost.observe_catch_up = lambda self, _s, n: catch(self, 0.001 + 0.0001 * n, n)


def main(job_path: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    from specdec_testing.introspect import flush_finished, proposer_snapshot

    _model_clock()
    job = json.loads(open(job_path).read())
    llm = LLM(**job["engine"])
    engine = llm.llm_engine
    phases, corpus = {}, {}
    for phase in job["phases"]:
        name, ids = phase["name"], []
        for i, text in enumerate(phase["prompts"]):
            prompt = {"prompt": text}
            if phase.get("salt") is not None:
                prompt["cache_salt"] = phase["salt"]
            ids.append(f"{name}-{i}")
            engine.add_request(ids[-1], prompt, SamplingParams(**phase.get("params", {})))
        done, steps = {}, 0
        while engine.has_unfinished_requests():
            if phase.get("abort_after") is not None and steps == phase["abort_after"]:
                engine.abort_request([r for r in ids if r not in done])
                break
            for out in engine.step():
                if out.finished:
                    c = out.outputs[0]
                    sd = getattr(c, "spec_decode_metrics", None)
                    done[out.request_id] = {"token_ids": list(c.token_ids),
                                            "finish_reason": c.finish_reason,
                                            "spec_decode": sd.to_dict() if sd else None}
            steps += 1
        flush_finished(llm)
        phases[name] = [done.get(r) for r in ids]
        corpus[name] = (proposer_snapshot(llm) or {}).get("corpus_tokens")
    with open(out_path, "w") as f:
        json.dump({"phases": phases, "corpus": corpus}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
