"""The target's decode step time against the tokens it verifies, at a fixed batch.

    PYTHONPATH=. VLLM_PLUGINS="" python experiments/verify_cost/measure.py [--pair smol]
        [--dtype float32] [--batch 8] [--k 4] [--tokens 128] [--context 0]

Run at k 0 (no speculation), 1 and 4 and compare the medians by token count: the
repetitive prompts make nearly every row draft k, so one run covers few counts.

An in-process vLLM engine (compiled, as served) runs in-tree ``ngram`` speculation (k
drafts when the prompt-lookup matches, fewer or none otherwise) over ``--batch``
repetitive prompts at once, so its decode steps carry between B and B·(1 + k) tokens
at the same B. Each decode step's target time (forward, sampling and rejection,
drafting excluded: ``compat/step_timers.py``) is regressed on its token count: the
slope is what one more verify token costs at that batch, the thing the plugin's
online fit (``target_fit.TargetFit``) estimates from served steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="smol")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--context", type=int, default=0,
                    help="prefix each prompt with this many tokens of prose (docs/), so every "
                         "row attends over a served-length context")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the runner
    from vllm import LLM, SamplingParams

    from benchmarks.workloads import load_prompt_set
    from specdec_fixtures import ensure_pair
    from vllm_specdec_plugin.compat.introspect import find_runner

    pair = ensure_pair(a.pair)
    spec = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_max": 4,
            "prompt_lookup_min": 1}
    llm = LLM(model=str(pair.target), dtype=a.dtype, max_model_len=2048, max_num_seqs=a.batch,
              speculative_config=spec if a.k else None, seed=0)  # k 0: no speculation
    runner = find_runner(llm)
    steps: list[tuple[int, int, float]] = []  # (rows, tokens, seconds) of decode steps
    execute, sample = runner.execute_model, runner.sample_tokens
    pending = {}

    def execute_model(so, *args, **kw):
        t0 = time.perf_counter()
        out = execute(so, *args, **kw)
        sched = so.num_scheduled_tokens or {}
        spec_ = so.scheduled_spec_decode_tokens or {}
        decode = sched and not so.scheduled_new_reqs and all(
            n == 1 + len(spec_.get(r, ())) for r, n in sched.items())
        pending["step"] = (len(sched), sum(sched.values()), t0) if decode else None
        return out

    def sample_tokens(*args, **kw):
        out = sample(*args, **kw)
        step = pending.pop("step", None)
        if step is not None:
            steps.append((step[0], step[1], time.perf_counter() - step[2]))
        return out

    runner.execute_model, runner.sample_tokens = execute_model, sample_tokens
    prompts = (load_prompt_set("repetitive") * a.batch)[:a.batch]
    if a.context:
        from pathlib import Path

        tok = llm.get_tokenizer()
        prose = (Path(__file__).resolve().parents[2] / "docs/serving-and-tuning.md").read_text()
        ctx = tok(prose, add_special_tokens=False)["input_ids"][:a.context]
        prompts = [{"prompt_token_ids": ctx + tok(p, add_special_tokens=False)["input_ids"]}
                   for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up (compiles shapes)
    steps.clear()
    for _ in range(2):
        llm.generate(prompts, params, use_tqdm=False)
    full = [(n, t) for rows, n, t in steps if rows == a.batch]
    xs, ys = [n for n, _ in full], [t for _, t in full]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    print(f"pair {a.pair}, {a.dtype}, batch {a.batch}, k {a.k}, context {a.context}: "
          f"{len(full)} decode steps at "
          f"B {a.batch}, tokens {min(xs)}-{max(xs)} (mean {mx:.1f})")
    print(f"step = {1e3 * (my - b * mx):.1f} ms + {1e3 * b:.2f} ms/token")
    by_n: dict[int, list[float]] = {}
    for n, t in full:
        by_n.setdefault(n, []).append(t)
    for n in sorted(by_n):
        print(f"  {n:3d} tokens: {len(by_n[n]):4d} steps, median {1e3 * statistics.median(by_n[n]):.1f} ms")


if __name__ == "__main__":
    main()
