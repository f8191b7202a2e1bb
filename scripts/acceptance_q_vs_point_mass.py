"""Acceptance at temperature 1.0 on the bench pair: drafts sampled from the full draft
distribution q (handed to the rejection sampler) vs argmax drafts as point masses.

Usage: .venv/bin/python scripts/acceptance_q_vs_point_mass.py [--k 4] [--tokens 96]
Both are lossless; this measures which accepts more.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specdec_fixtures, specdec_testing

from harness import engine_kwargs, plugin_spec, run_engine  # noqa: E402
from prompts import PROMPTS  # noqa: E402

from specdec_fixtures import ensure_pair  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--pair", default="bench")
    args = ap.parse_args()
    pair = ensure_pair(args.pair)
    job = {"name": "t1", "prompts": PROMPTS, "batch_size": 32,
           "params": [{"temperature": 1.0, "max_tokens": args.tokens, "ignore_eos": True, "seed": i}
                      for i in range(len(PROMPTS))]}
    for mode in ("sample", "greedy"):
        res = run_engine(engine_kwargs(pair.target, plugin_spec(pair.draft, args.k, draft_sampling=mode),
                                       dtype="bfloat16", max_model_len=1024, max_num_seqs=32), [job])
        m = res["metrics"]
        drafted, acc = m["vllm:spec_decode_num_draft_tokens"], m["vllm:spec_decode_num_accepted_tokens"]
        rounds = m["vllm:spec_decode_num_drafts"]
        print(f"{args.pair} k={args.k} T=1.0 draft_sampling={mode:6s}: acceptance {acc / drafted:.3f} "
              f"({acc}/{drafted}), mean accepted length {1 + acc / rounds:.2f}, "
              f"per position {m.get('vllm:spec_decode_num_accepted_tokens_per_pos')}", flush=True)


if __name__ == "__main__":
    main()
