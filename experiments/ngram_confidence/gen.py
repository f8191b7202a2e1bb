"""Target greedy answers, for the n-gram replay (sim.py).

    VLLM_PLUGINS="" python experiments/ngram_confidence/gen.py --n 320 --out DIR/answers.jsonl
    VLLM_PLUGINS="" python experiments/ngram_confidence/gen.py --pair bench --n 320 --out DIR/answers.jsonl

smol (default): the smol target through vLLM's offline engine (no speculation), greedy,
128 tokens, chat template; prompts from ``workloads.sharegpt_pool`` with a seed other
than the serving benchmark's. bench: the bench target on the ``unique`` workload's
held-out code prompts (``workloads.unique_code_prompts``, raw completion as the
serving benchmark sends them), greedy, 96 tokens past any EOS (the serving runs'
longest answer; they send ``--ignore-eos``).
Writes one JSON line per prompt: prompt ids, output ids.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.workloads import sharegpt_pool, unique_code_prompts
from specdec_fixtures.layout import pair_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=320)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--pair", choices=("smol", "bench"), default="smol")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from vllm import LLM, SamplingParams

    target = str(pair_dir(args.pair) / "target")
    max_model_len = 1024 if args.pair == "bench" else 2048  # as the serving runs of each pair
    llm = LLM(target, dtype="bfloat16", max_model_len=max_model_len, seed=0, enforce_eager=False)
    tok = llm.get_tokenizer()
    if args.pair == "bench":
        prompts = unique_code_prompts()[: args.n]
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True))
    else:
        pool = sharegpt_pool(target, 128, max_model_len, args.seed)[: args.n]
        msgs = [[{"role": "user", "content": c["conversations"][0]["value"]}] for c in pool]
        outs = llm.chat(msgs, SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=False))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for o in outs:
            f.write(json.dumps({"prompt": list(o.prompt_token_ids),
                                "output": list(o.outputs[0].token_ids)}) + "\n")
    print(f"wrote {len(outs)} answers to {args.out} ({tok.name_or_path})")


if __name__ == "__main__":
    main()
