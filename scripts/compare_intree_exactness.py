"""Run the end-to-end sampled-distribution statistics against vLLM's in-tree
`draft_model` method (plugin disabled with VLLM_PLUGINS="") on the ci pair.

Usage: .venv/bin/python scripts/compare_intree_exactness.py [--draft-sample-method greedy|probabilistic]

Prints, per configuration, the three p-values of tests/engine/test_sampled_distribution.py
and whether the in-tree method passes at 99.9%. min_p and logit_bias are skipped:
vLLM refuses them under speculation.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "engine"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # specdec_fixtures, specdec_testing

from harness import engine_kwargs, run_engine  # noqa: E402
from test_sampled_distribution import ALPHA, PROMPT, _configs, _job, _samples  # noqa: E402

from specdec_fixtures import ensure_pair  # noqa: E402
from specdec_testing.two_sample import two_sample_chi2  # noqa: E402


KS = (1, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft-sample-method", default="greedy")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    pair = ensure_pair("ci")
    cfgs = {n: c for n, c in _configs(AutoTokenizer.from_pretrained(str(pair.target))).items()
            if n not in ("min_p", "logit_bias")}
    off = {"VLLM_PLUGINS": ""}
    kw = dict(max_num_seqs=256, max_model_len=128)
    base = run_engine(engine_kwargs(pair.target, **kw), [_job(n, p, 0) for n, (_, p) in cfgs.items()], env=off)
    for k in KS:
        spec = {"method": "draft_model", "model": str(pair.draft), "num_speculative_tokens": k,
                "draft_sample_method": args.draft_sample_method}
        names = [n for n, (kk, _) in cfgs.items() if kk == k]
        res = run_engine(engine_kwargs(pair.target, spec, **kw), [_job(n, cfgs[n][1], 10**6) for n in names], env=off)
        for n in names:
            keep = (lambda i: i % 4 != 0) if n == "mixed" else None
            a, b = _samples(base, n, keep), _samples(res, n, keep)
            ps = [two_sample_chi2([x[:2] for x in a], [x[:2] for x in b])[2],
                  two_sample_chi2([x[1:] for x in a], [x[1:] for x in b])[2],
                  two_sample_chi2([x[2] for x in a], [x[2] for x in b])[2]]
            verdict = "PASS" if min(ps) >= ALPHA else "FAIL"
            print(f"in-tree draft_model ({args.draft_sample_method}) k={k} {n:10s} "
                  f"p(t1t2)={ps[0]:.2e} p(t2t3)={ps[1]:.2e} p(t3)={ps[2]:.2e} {verdict}", flush=True)


if __name__ == "__main__":
    main()
