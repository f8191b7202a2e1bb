"""A reduced draft vocabulary: the draft model proposes only from a fixed set of
token ids, so its head computes N of the V logits (FR-Spec, Zhao et al. 2025).

At V = 49,152 the smol draft's head is 28 M of its 44 M weights: most of a draft
token's time. The tokens a draft can usefully propose are the frequent ones; a rare
target token is seldom guessed anyway. Exact by construction: the rejection sampler
sees the distribution the drafts were drawn from, which puts no mass outside the set.

The file is JSON, ``{"ids": [...], ...}`` (extra keys are provenance) or a bare list
of target token ids, most frequent first. ``python -m vllm_specdec_plugin.draft_vocab``
writes one from a ShareGPT file or plain text, counted with the target's tokenizer.

Imports no vLLM; torch only in ``load``, and transformers' tokenizer in the command.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from vllm_specdec_plugin.errors import SpecDecConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch

# The logit of a token outside the set. Finite, so a row whose grammar or allowed ids
# admit only tokens outside the set still has a distribution (uniform over them), not
# NaN; low enough that exp(OUTSIDE / T - max) is exactly 0 beside any in-set logit.
# Stays finite in float32 through T >= 1e-5 (vLLM's greedy threshold) or a repetition
# penalty up to 1e18.
OUTSIDE = -1.0e20


def load(path: str | Path, vocab_size: int) -> "torch.Tensor":
    """The ids of ``path``, sorted, int64 [N]; errors name the fix."""
    import torch  # here: the start-up checks import this module before torch is needed

    p = Path(path).expanduser()
    fix = ("Fix: point draft_vocab at a JSON file of target token ids, e.g. written by "
           "`python -m vllm_specdec_plugin.draft_vocab`, or remove the option.")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecDecConfigError(f"draft_vocab file {p} does not exist. {fix}") from None
    except (OSError, ValueError) as e:
        raise SpecDecConfigError(f"draft_vocab file {p} is not readable JSON ({e}). {fix}") from None
    ids = data.get("ids") if isinstance(data, dict) else data
    if not isinstance(ids, list) or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecDecConfigError(
            f"draft_vocab file {p} must hold a non-empty list of integer token ids "
            f"(or {{\"ids\": [...]}}). {fix}")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise SpecDecConfigError(
            f"draft_vocab file {p} has ids outside the vocabulary [0, {vocab_size}): "
            f"{bad[:5]}. It was written for another tokenizer. {fix}")
    if len(set(ids)) != len(ids):
        raise SpecDecConfigError(f"draft_vocab file {p} repeats token ids. {fix}")
    return torch.tensor(sorted(ids), dtype=torch.long)


def ranking(streams: Iterable[list[int]], size: int,
            always: Iterable[int] = ()) -> tuple[list[int], float]:
    """The ids of ``always`` (special tokens: the chat template puts them in every
    answer) and then the most frequent ids over ``streams`` (ties: lower id first),
    ``size`` in all; and the share of all counted tokens they cover."""
    counts: Counter[int] = Counter()
    for s in streams:
        counts.update(s)
    keep = list(dict.fromkeys(always))
    kept = set(keep)
    for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(keep) >= size:
            break
        if t not in kept:
            keep.append(t)
    total = sum(counts.values())
    return keep[:size], (sum(counts[t] for t in keep[:size]) / total if total else 0.0)


def write(path: Path, streams: list[list[int]], size: int, always: Iterable[int],
          **provenance) -> dict:
    """Rank ``streams`` (``ranking``) and write ``path`` as ``{"ids", "size", "coverage",
    "tokens_counted", **provenance}``; returns what it wrote."""
    ids, cover = ranking(streams, size, always)
    meta = {"ids": ids, "size": len(ids), "coverage": round(cover, 5),
            "tokens_counted": sum(len(s) for s in streams), **provenance}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta), encoding="utf-8")
    return meta


def _texts(path: Path, limit: int) -> list[str]:
    """Every turn of a ShareGPT JSON file (``[{"conversations": [{"value"}]}]``), or a
    plain-text file's lines; at most ``limit`` characters in all."""
    text = path.read_text(encoding="utf-8")
    out: list[str] = []
    if path.suffix == ".json":
        for conv in json.loads(text):
            out.extend(t.get("value", "") for t in conv.get("conversations", []))
    else:
        out = text.splitlines()
    kept, n = [], 0
    for t in out:
        if n >= limit:
            break
        kept.append(t)
        n += len(t)
    return kept


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vllm_specdec_plugin.draft_vocab",
        description="Write a draft_vocab file: the SIZE most frequent target token ids "
                    "in a corpus like the traffic to be served.")
    ap.add_argument("--tokenizer", required=True, help="the target's tokenizer (folder or name)")
    ap.add_argument("--corpus", required=True, type=Path,
                    help="ShareGPT-format .json, or a text file (one document per line)")
    ap.add_argument("--size", type=int, default=16384, help="ids to keep (default 16384)")
    ap.add_argument("--max-chars", type=int, default=50_000_000,
                    help="read at most this many characters of the corpus")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    texts = _texts(args.corpus, args.max_chars)
    streams = tok(texts, add_special_tokens=False)["input_ids"]
    meta = write(args.out, streams, args.size, tok.all_special_ids,
                 tokenizer=str(args.tokenizer), corpus=str(args.corpus))
    print(f"{args.out}: {meta['size']} ids covering {meta['coverage']:.4f} of "
          f"{meta['tokens_counted']} corpus tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
