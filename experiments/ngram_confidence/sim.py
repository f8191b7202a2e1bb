"""Replay of the plugin's n-gram drafting on recorded target answers: how many tokens a
verifying step yields, by the chain's confidence threshold.

    python experiments/ngram_confidence/sim.py DIR/answers.jsonl [--k 8]

For each answer in order (the corpus holds every earlier prompt + answer, one scope,
as ``ngram_corpus_scope: global``), rounds go as the plugin's would with k drafts
always verified: drafts as ``planning._ngram_drafts`` picks them (the request's own
history or the corpus, whichever matches the longer context), the accepted prefix is
the one the recorded greedy answer agrees with, then one more token. Variants: the
index before this change (most recent occurrence, no threshold: ``ngram.py`` at ``BEFORE``,
read with git)
and the current one at each ``--probs`` threshold (with ``--prior P``, its confidence's
prior count ``tuning.NGRAM_PRIOR`` set to P; the corpus matched from ``CORPUS_MIN_N``
tokens, its drafts capped at the match length); with ``--suffix-site DIR`` (where
``scripts/install_suffix.sh`` put arctic-inference) also vLLM's in-tree ``suffix``
method's drafting, replayed the way vLLM 0.32's ``SuffixDecodingProposer`` calls
``SuffixDecodingCache`` (prompt in a per-request tree, earlier answers in the global
tree, tree depth 24, ``max_spec_factor`` 1, ``min_token_prob`` 0.1). Reported per variant: drafted and
accepted tokens per round, accepted per drafted token, and tokens per step-cost
sum(1 + accepted) / sum(1 + c' * drafted) for a draft token's verify cost c' (a
share of a plain step; about 0.02-0.05 on this CPU at c = 1, more in a busy batch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

from vllm_specdec_plugin import ngram, ngram_corpus
from vllm_specdec_plugin.tuning import NGRAM_MAX_N

# The current index: its two modules seen as one, as the old ngram.py held both.
new = types.SimpleNamespace(**vars(ngram), CorpusIndex=ngram_corpus.CorpusIndex)

BEFORE = "673da04"  # the last commit whose ngram.py drafted the most recent occurrence's follower
CORPUS_MIN_N = 1  # the current code's ngram_corpus_min_n (the index before: 3)


def module_at(commit: str, path: str, name: str):
    """Import ``path`` as it was at ``commit`` (git show), without a copy in the tree."""
    src = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    mod = types.ModuleType(name)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    exec(compile(src, f"{commit}:{path}", "exec"), mod.__dict__)
    return mod


def drafts_for(mod, own, corpus, k: int) -> list[int]:
    own_n = own.longest_match()
    drafts, n = corpus.propose(own.tokens, k)
    if drafts and n > own_n:
        room = min(k, n) if mod is new else k  # as planning: capped at the match
        if len(drafts) < room:
            o = own.propose(room)
            if len(o) > len(drafts) and o[:len(drafts)] == drafts:
                return o
        return drafts
    return own.propose(k)


def play(out: list[int], k: int, draft, emit, per_round: list) -> None:
    """One answer's rounds: ``draft(n)`` proposes at most n tokens, the recorded answer
    decides the accepted prefix, ``emit(tokens)`` takes it plus one more token; each
    round's (drafted, accepted) goes to ``per_round``."""
    t = 0
    while t < len(out):
        d = draft(min(k, len(out) - t - 1)) if t < len(out) - 1 else []
        a = 0
        while a < len(d) and d[a] == out[t + a]:
            a += 1
        per_round.append((len(d), a))
        emit(out[t:t + a + 1])
        t += a + 1


def replay(rows: list[dict], mod, k: int, min_prob: float | None, max_n: int = NGRAM_MAX_N) -> dict:
    kw = {} if min_prob is None else {"min_prob": min_prob}
    corpus = mod.CorpusIndex(65536, max_n, CORPUS_MIN_N if mod is new else 3, **kw)
    per_round: list = []
    for r in rows:
        own = mod.NGramIndex(mod.NGramConfig(max_n, 1, 1024, **kw), r["prompt"])
        play(r["output"], k, lambda n: drafts_for(mod, own, corpus, n), own.extend, per_round)
        corpus.add(r["prompt"] + r["output"])
    return summary(per_round)


def replay_suffix(rows: list[dict], k: int, depth: int = 24, factor: float = 1.0,
                  min_prob: float = 0.1) -> dict:
    """As ``replay``, with arctic-inference's suffix trees as the draft source."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)
    per_round: list = []
    for i, r in enumerate(rows):
        cache.start_request(i, r["prompt"])
        seq = list(r["prompt"])

        def draft(n: int) -> list[int]:
            return cache.speculate(i, seq[-depth:], max_spec_tokens=n, max_spec_factor=factor,
                                   min_token_prob=min_prob).token_ids

        def emit(tokens: list[int]) -> None:
            cache.add_active_response(i, tokens)
            seq.extend(tokens)

        play(r["output"], k, draft, emit, per_round)
        cache.stop_request(i)
    return summary(per_round)


def summary(per_round: list) -> dict:
    """Totals over every round's (drafted, accepted)."""
    rounds = len(per_round)
    drafted, accepted = sum(d for d, _ in per_round), sum(a for _, a in per_round)
    res = {"rounds": rounds, "drafted_per_round": drafted / rounds,
           "accepted_per_round": accepted / rounds,
           "alpha_per_draft_token": accepted / max(drafted, 1)}
    for c in (0.02, 0.05, 0.1, 0.2, 0.4):
        res[f"tokens_per_cost@{c}"] = sum(1 + a for _, a in per_round) / \
            sum(1 + c * d for d, _ in per_round)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("answers", type=Path)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--probs", default="0,0.05,0.1,0.15,0.2,0.3,0.5")
    ap.add_argument("--prior", type=float, default=None,
                    help="the confidence's prior count (tuning.NGRAM_PRIOR) for the current index")
    ap.add_argument("--max-n", default=str(NGRAM_MAX_N),
                    help="comma-separated longest contexts (ngram_max_n) for the current index")
    ap.add_argument("--suffix-site", type=Path, default=None,
                    help="arctic-inference's install folder (.cache/suffix/site)")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.answers.read_text().splitlines()]
    if args.prior is not None:
        new.NGRAM_PRIOR = args.prior  # read by ngram.choose at each call
    old = module_at(BEFORE, "vllm_specdec_plugin/ngram.py", "ngram_before")
    out = {"answers": len(rows), "k": args.k,
           "before (most recent, no threshold)": replay(rows, old, args.k, None)}
    for n in [int(x) for x in args.max_n.split(",")]:
        for p in [float(x) for x in args.probs.split(",")]:
            name = f"current, prior {new.NGRAM_PRIOR}, min_prob {p}" + \
                (f", max_n {n}" if n != NGRAM_MAX_N else "")
            out[name] = replay(rows, new, args.k, p, n)
    if args.suffix_site:
        sys.path.insert(0, str(args.suffix_site))
        out["in-tree suffix (depth 24, min_prob 0.1)"] = replay_suffix(rows, args.k)
    cols = ["drafted_per_round", "accepted_per_round", "alpha_per_draft_token"] + \
        [f"tokens_per_cost@{c}" for c in (0.02, 0.05, 0.1, 0.2, 0.4)]
    print(f"{len(rows)} answers, k {args.k}")
    print(f"{'variant':52} " + " ".join(f"{c[:22]:>22}" for c in cols))
    for name, r in out.items():
        if isinstance(r, dict):
            print(f"{name:52} " + " ".join(f"{r[c]:22.3f}" for c in cols))
    tag = ("" if args.prior is None else f"-prior{args.prior:g}") + \
        ("" if args.max_n == str(NGRAM_MAX_N) else f"-n{args.max_n.replace(',', '-')}")
    (args.answers.parent / f"sim-k{args.k}{tag}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
