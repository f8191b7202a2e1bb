"""Profile the plugin's drafting round on a fixture pair: where do its milliseconds go?

Runs an in-process offline engine with the plugin (greedy, fixed k), wraps the
proposer's phases with wall-clock timers and runs cProfile over ``propose``. Prints
ms per round by phase and the top functions by own time, per batch size.

    python scripts/profile_draft_step.py [--pair bench] [--k 4] [--batches 1,8] [--tokens 96]

Used for the benchmark note ("where the plugin falls short and why"); not a test.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections import defaultdict


def _wrap(obj, name, acc, key):
    fn = getattr(obj, name)

    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            acc[key] += time.perf_counter() - t

    setattr(obj, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", default="bench", help="fixture pair (bench, smol: real weights)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--no-cprofile", action="store_true", help="wall-clock phase timers only "
                    "(cProfile inflates Python-heavy paths)")
    ap.add_argument("--dtype", default="auto", help="engine dtype (auto: the checkpoint's, bf16)")
    ap.add_argument("--compile", action="store_true", help="vLLM's default compilation (no enforce_eager)")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # reach the proposer
    from vllm import LLM, SamplingParams

    from benchmarks.workloads import load_prompt_set
    from vllm_specdec_plugin.compat.introspect import find_proposer
    from specdec_fixtures import ensure_pair
    from vllm_specdec_plugin.compat import draft_model
    from vllm_specdec_plugin.draft import sampler

    pair = ensure_pair(a.pair)
    spec = {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
            "num_speculative_tokens": a.k,
            "draft_load_config": {"model_loader_extra_config": {"specdec": {"draft_model": str(pair.draft)}}}}
    llm = LLM(model=str(pair.target), dtype=a.dtype, max_model_len=1024, enforce_eager=not a.compile, max_num_seqs=32,
              speculative_config=spec, seed=0)
    prop = find_proposer(llm)
    acc: dict[str, float] = defaultdict(float)
    _wrap(prop.rounds, "run", acc, "draft round (all passes)")
    _wrap(draft_model.DraftKernels, "forward", acc, "  model forward + logits")
    _wrap(draft_model.DraftKernels, "metadata", acc, "  attention metadata")
    _wrap(sampler.DraftSampler, "pick", acc, "  sample (argmax/q)")
    _wrap(prop.rounds, "publish", acc, "publish q")
    _wrap(prop.planner, "plan", acc, "plan (per request)")
    _wrap(prop.planner, "fit", acc, "fit (budget, reserve)")
    _wrap(prop, "_verified", acc, "rollback (per request)")
    prompts = load_prompt_set("general")
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    for bs in [int(b) for b in a.batches.split(",")]:
        llm.generate(prompts[:bs], params, use_tqdm=False)  # warm-up
        acc.clear()
        rounds0, fwd0 = prop.stats.rounds, prop.rounds.forwards
        prof = cProfile.Profile()
        inner = prop.propose

        def propose(*args, **kw):
            if a.no_cprofile:
                return inner(*args, **kw)
            prof.enable()
            try:
                return inner(*args, **kw)
            finally:
                prof.disable()

        prop.propose = propose
        t0 = time.perf_counter()
        llm.generate(prompts[:bs], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        prop.propose = inner
        rounds = prop.stats.rounds - rounds0
        forwards = prop.rounds.forwards - fwd0
        print(f"\n=== batch {bs}, k={a.k}: {rounds} rounds, {forwards} draft forwards, "
              f"wall {wall:.2f} s ===")
        for key in sorted(acc, key=lambda x: (x.startswith("  "), x)):
            print(f"{key:28s} {1e3 * acc[key] / max(rounds, 1):8.3f} ms/round")
        print(f"{'draft forward (one pass)':28s} {1e3 * acc['  model forward + logits'] / max(forwards, 1):8.3f} ms")
        if a.no_cprofile:
            continue
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
        print(s.getvalue())


if __name__ == "__main__":
    main()
