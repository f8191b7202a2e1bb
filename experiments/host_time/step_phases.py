"""Host time per engine step, by phase, with and without the plugin: an in-process
engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the smol pair's ShareGPT chat prompts
(``--pair bench``: the bench pair on ``unique`` code prompts), all submitted at once,
``max_tokens`` each with ``ignore_eos`` so the batch stays full.

    PYTHONPATH=. python experiments/host_time/step_phases.py --config nospec --n 64
    PYTHONPATH=. python experiments/host_time/step_phases.py --config floor --n 64

Per decode step without a prompt (all ``--n`` rows running), medians in ms: the
scheduler's ``schedule``, the worker's ``execute_model`` (forward, sampling, and the
plugin's ``propose``), ``propose`` alone, ``update_from_output``, and the whole
``EngineCore.step``. Configs are the serving benchmark's of the same names.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CONFIGS = {
    "nospec": None,
    "floor": {"method": "ngram", "adaptive": True, "ngram_min_prob": 1.0},
    "ngram": {"method": "ngram", "adaptive": True},
    "hybrid": {"method": "hybrid", "adaptive": True},
}


def speculative_config(name: str, pair: str = "smol") -> dict | None:
    """vLLM's ``speculative_config`` for config ``name`` on ``pair`` (k 8)."""
    from specdec_fixtures.layout import pair_dir

    if CONFIGS[name] is None:
        return None
    specdec = dict(CONFIGS[name])
    if specdec["method"] != "ngram":
        specdec["draft_model"] = str(pair_dir(pair) / "draft")
    return {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
            "num_speculative_tokens": 8,
            "draft_load_config": {"model_loader_extra_config": {"specdec": specdec}}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="floor")
    ap.add_argument("--pair", choices=("smol", "bench"), default="smol")
    ap.add_argument("--out", default=None, help="append a JSON line here")
    args = ap.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    from benchmarks.workloads import sharegpt_pool, unique_code_prompts
    from specdec_fixtures.layout import pair_dir

    target = str(pair_dir(args.pair) / "target")
    spec = speculative_config(args.config, args.pair)
    rec: dict[str, float] = {}
    steps: list[dict] = []

    def timed(cls, name, key):  # noqa: ANN001
        orig = getattr(cls, name)

        def wrapper(*a, **kw):  # noqa: ANN001
            t = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                rec[key] = rec.get(key, 0.0) + time.perf_counter() - t
        setattr(cls, name, wrapper)

    timed(Scheduler, "schedule", "schedule")
    timed(Scheduler, "update_from_output", "update")
    step_orig = EngineCore.step

    def step(self):  # noqa: ANN001
        rec.clear()
        t = time.perf_counter()
        out = step_orig(self)
        total = time.perf_counter() - t
        sched = self.scheduler
        rows = len(sched.running)
        prompt = any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) \
            or bool(sched.waiting)
        steps.append({"total": total, "rows": rows, "prompt": prompt, **rec})
        return out
    EngineCore.step = step
    if spec is not None:
        import vllm_specdec_plugin.proposer as pm
        timed(pm.DraftModelProposer, "propose", "propose")
        timed(pm.DraftModelProposer, "on_scheduler_output", "on_sched")

    from vllm.model_executor.models.llama import LlamaForCausalLM
    timed(LlamaForCausalLM, "forward", "forward")
    max_len = 2048 if args.pair == "smol" else 1024
    llm = LLM(target, dtype="bfloat16", max_model_len=max_len, seed=0,
              kv_cache_memory_bytes=2**30, max_num_seqs=max(args.n, 8),
              speculative_config=spec)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    if args.pair == "smol":
        pool = sharegpt_pool(target, 128, max_len, 7)[: args.n + 2]
        msgs = [[{"role": "user", "content": c["conversations"][0]["value"]}] for c in pool]
        run = lambda batch: llm.chat(batch, params)  # noqa: E731
    else:
        msgs = unique_code_prompts()[: args.n + 2]
        run = lambda batch: llm.generate(batch, params)  # noqa: E731
    run(msgs[-2:])  # warm-up
    steps.clear()
    t0 = time.perf_counter()
    outs = run(msgs[: args.n])
    wall = time.perf_counter() - t0
    full = [s for s in steps if s["rows"] == args.n and not s["prompt"]]
    med = lambda k: 1000 * statistics.median(s.get(k, 0.0) for s in full)  # noqa: E731
    res = {"config": args.config, "pair": args.pair, "n": args.n, "wall_s": wall,
           "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
           "steps": len(steps), "full_steps": len(full),
           **{f"{k}_ms": med(k) for k in ("total", "schedule", "update", "propose", "on_sched", "forward")}}
    res["rest_ms"] = res["total_ms"] - res["schedule_ms"] - res["update_ms"]
    import threading
    res["threads"] = len(os.listdir("/proc/self/task"))
    res["py_threads"] = [t.name for t in threading.enumerate()]
    res["torch_threads"] = __import__("torch").get_num_threads()
    print(json.dumps(res))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
