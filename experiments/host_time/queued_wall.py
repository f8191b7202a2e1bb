"""Wall time of an in-process engine over many ``unique`` code prompts (bench pair),
``--rows`` at a time, every prompt queued at once: the plugin's host cost when the
queue never empties (each step then has a prompt next, so the proposer only holds).

    PYTHONPATH=. python experiments/host_time/queued_wall.py --config nospec|hybrid|floor [--profile]

Prints one JSON line (wall seconds, output tokens, ms per token); ``--profile`` adds
cProfile's top plugin functions (cProfile inflates Python calls: time a suspect plainly
before trusting its share). Configs are ``step_phases``'s (k 8).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from step_phases import CONFIGS, speculative_config  # noqa: E402  (same folder)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", choices=sorted(CONFIGS), default="hybrid")
    ap.add_argument("--rows", type=int, default=64, help="max_num_seqs")
    ap.add_argument("--n", type=int, default=256, help="prompts")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    from vllm import LLM, SamplingParams

    from benchmarks.workloads import unique_code_prompts
    from specdec_fixtures.layout import pair_dir

    llm = LLM(str(pair_dir("bench") / "target"), dtype="bfloat16", max_model_len=1024, seed=0,
              kv_cache_memory_bytes=2**30, max_num_seqs=args.rows,
              speculative_config=speculative_config(args.config, "bench"))
    prompts = unique_code_prompts()
    rng = random.Random(0)  # answers of 32-96 tokens, as the serving benchmark's unique cells
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(32, 96), ignore_eos=True)
              for _ in range(args.n)]
    llm.generate(prompts[-4:], params[:4])  # warm-up
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    outs = llm.generate(prompts[: args.n], params)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print(json.dumps({"config": args.config, "wall_s": round(wall, 2), "tokens": tokens,
                      "ms_per_token": round(1000 * wall / tokens, 3)}))
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats("vllm_specdec_plugin", 40)
        print(s.getvalue())


if __name__ == "__main__":
    main()
