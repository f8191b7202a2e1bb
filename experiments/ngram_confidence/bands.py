"""First-draft acceptance by the n-gram chain's confidence and by match bucket, on
recorded target answers (the replay of ``sim.py``: k 8, prior ``NGRAM_PRIOR``,
threshold 0.1, every proposal verified).

    python experiments/ngram_confidence/bands.py ANSWERS.jsonl

Prints P(first draft accepted) per confidence tenth and per match bucket (length
only), and per-token acceptance by the token's own confidence (the output of
2026-11-28: results/2026-11-28-5e16442-serving-smol-sharegpt-c8-f32-diagnose/confidence-bands.txt).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm_specdec_plugin import ngram, ngram_corpus  # noqa: E402

K = 8
_seen: list[float] = []  # confidences of the picks of the current proposal
_choose = ngram.choose


def _recording_choose(followers, recent, prior=None):
    pick = _choose(followers, recent, prior)
    _seen.append(pick[1])
    return pick


def scored(propose, *args):
    """(propose(*args), the confidence of each pick it made: one more than its drafts
    when the threshold stopped the chain)."""
    _seen.clear()
    out = propose(*args)
    return out, list(_seen)


def rounds_of(rows: list[dict]) -> list[tuple]:
    """Per round (bucket, confidences of its drafts, drafts, accepted), drafts chosen
    as ``planning._ngram_drafts`` chooses them, every proposal verified."""
    corpus = ngram_corpus.CorpusIndex(65536, 4, 1, 0.1)
    rounds = []
    for r in rows:
        own = ngram.NGramIndex(ngram.NGramConfig(4, 1, 1024, 0.1), r["prompt"])
        out, t = r["output"], 0
        while t < len(out):
            k = min(K, len(out) - t - 1)
            drafts, key, confs = [], None, []
            if k > 0:
                own_n = own.longest_match()
                (cd, n), cconf = scored(corpus.propose, own.tokens, k)
                if cd and n > own_n:
                    drafts, key, confs = cd, ("corpus", n.bit_length()), cconf
                    if len(cd) < min(k, n):
                        o, oconf = scored(own.propose, min(k, n))
                        if len(o) > len(cd) and o[:len(cd)] == cd:
                            drafts, confs = o, oconf
                else:
                    drafts, confs = scored(own.propose, k)
                    key = ("own", own_n)
            a = 0
            while a < len(drafts) and drafts[a] == out[t + a]:
                a += 1
            rounds.append((key, confs[:len(drafts)], len(drafts), a))
            own.extend(out[t:t + a + 1])
            t += a + 1
        corpus.add(r["prompt"] + r["output"])
    return rounds


def main() -> None:
    ngram.choose = ngram_corpus.choose = _recording_choose
    rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines()]
    drafted = [x for x in rounds_of(rows) if x[2] > 0]
    tenth = lambda c: min(int(c * 10), 9)  # noqa: E731
    first, bucket, token = (defaultdict(lambda: [0, 0]) for _ in range(3))
    for key, confs, n, a in drafted:
        for table, b in ((first, tenth(confs[0])), (bucket, key)):
            table[b][0] += a > 0
            table[b][1] += 1
        for i in range(min(n, a + 1)):  # positions that were decided
            token[tenth(confs[i])][0] += a > i
            token[tenth(confs[i])][1] += 1
    print(f"{len(drafted)} rounds with drafts")
    for b in sorted(first):
        s, t = first[b]
        print(f"first draft's confidence {b / 10:.1f}-{(b + 1) / 10:.1f}: n {t:5d}, accepted {s / t:.3f}")
    for b in sorted(bucket):
        s, t = bucket[b]
        print(f"bucket {b}: n {t:5d}, first draft accepted {s / t:.3f}")
    print("each decided draft by its own confidence")
    for b in sorted(token):
        s, t = token[b]
        print(f"  {b / 10:.1f}-{(b + 1) / 10:.1f}: n {t:5d}, accepted {s / t:.3f}")


if __name__ == "__main__":
    main()
