"""Where the proposer's host time goes: cProfile of ``DraftModelProposer.propose`` in an
in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the smol pair's ShareGPT
chat, all prompts at once (as a closed loop at c = n starts).

    PYTHONPATH=. python experiments/host_time/profile_propose.py --n 64 --config hybrid

``--prometheus`` writes the metrics to files (multiprocess mode), as ``vllm serve``
does; without it they stay in memory and cost less than served.

Prints propose()'s mean ms per call by batch size and by path (steps the host gate
skipped, steps that planned), then its top functions by cumulative time. Not a benchmark: the profiler slows Python code several-fold; read
the shares, not the milliseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import collections
import os
import pstats
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from experiments.host_time.step_phases import CONFIGS, speculative_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--config", choices=sorted(c for c in CONFIGS if CONFIGS[c]), default="hybrid")
    ap.add_argument("--profile", action="store_true", help="cProfile propose() (slower)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--pair", choices=("smol", "bench", "ci"), default="smol")
    ap.add_argument("--prometheus", action="store_true",
                    help="metrics in multiprocess mode (files), as under vllm serve")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    if args.prometheus:  # before prometheus_client is imported: it reads the variable then
        import tempfile
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="specdec-prom-")
    from vllm import LLM, SamplingParams

    from benchmarks.workloads import sharegpt_pool
    from specdec_fixtures.layout import pair_dir
    import vllm_specdec_plugin.proposer as proposer_mod

    target = str(pair_dir(args.pair) / "target")
    spec = speculative_config(args.config, args.pair)
    llm = LLM(target, dtype="bfloat16", max_model_len=2048, seed=0, kv_cache_memory_bytes=2**29,
              max_num_seqs=max(args.n, 8), speculative_config=spec)
    pool = sharegpt_pool(target, args.max_tokens, 2048, 7)[: args.n]
    msgs = [[{"role": "user", "content": c["conversations"][0]["value"]}] for c in pool]

    prof = cProfile.Profile()
    per_rows: dict[int, list[float]] = collections.defaultdict(list)
    per_path: dict[str, list[float]] = collections.defaultdict(list)  # host gate skipped or not
    gate_held = [0]  # stats.no_draft["host_time"] after the last call
    orig = proposer_mod.DraftModelProposer.propose

    def timed(self, sampled_token_ids, *a, **kw):  # noqa: ANN001
        t = time.perf_counter()
        if args.profile:
            prof.enable()
        try:
            return orig(self, sampled_token_ids, *a, **kw)
        finally:
            if args.profile:
                prof.disable()
            rows = sum(1 for s in sampled_token_ids if s)
            per_rows[rows].append(time.perf_counter() - t)
            skipped = self.stats.no_draft["host_time"] > gate_held[0]
            gate_held[0] = self.stats.no_draft["host_time"]
            per_path["gate-skipped" if skipped else "planned"].append(time.perf_counter() - t)

    proposer_mod.DraftModelProposer.propose = timed
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.chat(msgs[:2], params)  # warm-up
    per_rows.clear()
    per_path.clear()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    outs = llm.chat(msgs, params)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    total = sum(sum(v) for v in per_rows.values())
    print(f"{args.config}: {len(outs)} requests, {tokens} tokens in {wall:.1f} s; "
          f"propose() {total:.2f} s in {sum(len(v) for v in per_rows.values())} calls")
    for lo, hi in ((0, 0), (1, 8), (9, 32), (33, 64), (65, 10**6)):
        v = [x for r, xs in per_rows.items() if lo <= r <= hi for x in xs]
        if v:
            print(f"  rows {lo}-{hi}: {len(v)} calls, mean {1000 * sum(v) / len(v):.2f} ms")
    for path, v in sorted(per_path.items()):
        print(f"  {path}: {len(v)} calls, mean {1000 * sum(v) / len(v):.2f} ms, "
              f"median {1000 * sorted(v)[len(v) // 2]:.2f} ms")
    if args.profile:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
