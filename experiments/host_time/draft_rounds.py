"""Which draft-model rounds are long: every ``DraftBatch.run`` of the hybrid proposer in
an in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on the smol pair's ShareGPT
chat, a closed loop of ``--concurrency`` rows over ``--n`` requests with answers of
64-192 tokens.

    PYTHONPATH=. python experiments/host_time/draft_rounds.py --n 64 --concurrency 16

Prints the rounds' count and seconds, then each round over ``--min-ms``: its decoding
rows, plans, the committed tokens fed to the draft (catch-up: sum and largest), the ks,
and whether a controller was probing. Not a benchmark (one engine, no control).
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from experiments.host_time.step_phases import speculative_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--min-ms", type=float, default=30.0)
    args = ap.parse_args()
    from vllm import LLM, SamplingParams

    import vllm_specdec_plugin.proposer as proposer_mod
    from benchmarks.workloads import sharegpt_pool
    from specdec_fixtures.layout import pair_dir
    from vllm_specdec_plugin.draft.batch import DraftBatch

    rounds: list[dict] = []
    current: dict = {}
    run, propose = DraftBatch.run, proposer_mod.DraftModelProposer.propose

    def timed_run(self, runner, kernels, device, plans, token_ids_cpu):  # noqa: ANN001
        t = time.perf_counter()
        try:
            return run(self, runner, kernels, device, plans, token_ids_cpu)
        finally:
            p = current["proposer"]
            rounds.append(dict(
                s=time.perf_counter() - t, rows=current["rows"], ks=[x.k for x in plans],
                feed=[len(x.new_tokens) for x in plans],
                probing={src: (c.probing, c.load_probing) for src, c in p.controllers.items()}))

    def noting_propose(self, sampled_token_ids, *a, **kw):  # noqa: ANN001
        current["proposer"], current["rows"] = self, sum(1 for s in sampled_token_ids if s)
        return propose(self, sampled_token_ids, *a, **kw)

    DraftBatch.run = timed_run
    proposer_mod.DraftModelProposer.propose = noting_propose
    target = str(pair_dir("smol") / "target")
    llm = LLM(target, dtype="bfloat16", max_model_len=2048, seed=0, kv_cache_memory_bytes=2**29,
              max_num_seqs=args.concurrency, speculative_config=speculative_config("hybrid"))
    pool = sharegpt_pool(target, 128, 2048, 7)[: args.n]
    msgs = [[{"role": "user", "content": c["conversations"][0]["value"]}] for c in pool]
    lengths = random.Random(1)
    params = [SamplingParams(temperature=0.0, max_tokens=lengths.randint(64, 192)) for _ in msgs]
    llm.chat(msgs[:2], params[:2])  # warm-up
    rounds.clear()
    t0 = time.perf_counter()
    llm.chat(msgs, params)
    print(f"{len(msgs)} requests in {time.perf_counter() - t0:.1f} s; {len(rounds)} draft-model "
          f"rounds, {sum(r['s'] for r in rounds):.2f} s")
    for r in rounds:
        if 1e3 * r["s"] >= args.min_ms:
            print(f"  {1e3 * r['s']:.0f} ms: {r['rows']} rows, {len(r['ks'])} plans, fed "
                  f"{sum(r['feed'])} tokens (largest {max(r['feed'])}), ks {r['ks']}, "
                  f"probing (probe, load probe) {r['probing']}")


if __name__ == "__main__":
    main()
