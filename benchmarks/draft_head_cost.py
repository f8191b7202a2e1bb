"""One draft decode pass with the whole head against a reduced draft vocabulary.

Loads a pair's draft through the plugin's own loader (vLLM's model class and CPU
attention backend, eager), prefills every row with a context, then times single-token
decode passes per batch size, interleaved in one process: the whole-vocabulary head,
the ``draft_vocab`` head with the [n, V] row (-1e20 fill of the other logits; what
sampled or masked rounds take) and its logits alone (what greedy rounds take).
Reports the median ms per pass and the ratios to the whole head.

    python -m benchmarks.draft_head_cost --pair smol [--compile] [--batches 1,8,32] [--out DIR]

A benchmark: it measures, asserts nothing. Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draft_head_cost")
    ap.add_argument("--pair", default="smol")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=_ints, default=[1, 8, 32])
    ap.add_argument("--context", type=int, default=256, help="tokens per row before the timed passes")
    ap.add_argument("--passes", type=int, default=40, help="timed passes per arm and batch")
    ap.add_argument("--vocab", type=Path, default=None, help="default: the pair's draft/draft_vocab.json")
    ap.add_argument("--compile", action="store_true", help="vLLM's compilation, as served (default: eager)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    from benchmarks.machine import git_info, machine_info, thread_settings
    from specdec_fixtures import ensure_pair
    from vllm_specdec_plugin import draft_vocab
    from vllm_specdec_plugin.compat import draft_model, standalone
    from vllm_specdec_plugin.draft.round import _slots

    pair = ensure_pair(args.pair)
    vocab_path = args.vocab or pair.draft / "draft_vocab.json"
    dtype = getattr(torch, args.dtype)
    bs = 32
    cfg = standalone.vllm_config(str(pair.target), None, dtype=args.dtype,
                                 max_model_len=args.context + args.passes + 64,
                                 enforce_eager=not args.compile)
    per_row = -(-(args.context + args.passes + 8) // bs)
    cpu = torch.device("cpu")
    full = draft_model.load(cfg, pair.draft, bs, per_row * max(args.batches), dtype, cpu)
    V = int(json.loads((pair.draft / "config.json").read_text())["vocab_size"])
    ids = draft_vocab.load(vocab_path, V)
    reduced = replace(full, vocab_size=V, vocab_ids=ids,
                      head=draft_model.reduced_head(full.model, ids, cpu))
    g = torch.Generator().manual_seed(0)
    rows = []
    for B in args.batches:
        table = torch.arange(B * per_row, dtype=torch.int32).view(B, per_row)
        # prefill every row's context in one varlen pass
        ctx = torch.randint(4, V, (B * args.context,), generator=g, dtype=torch.int32)
        qsl = torch.arange(0, B * args.context + 1, args.context, dtype=torch.int32)
        seq = torch.full((B,), args.context, dtype=torch.int32)
        pos = torch.arange(args.context).repeat(B)
        row_of = torch.arange(B).repeat_interleave(args.context)
        slots = _slots(table, row_of, pos, bs)
        with torch.inference_mode():
            md = full.metadata(qsl, qsl, seq, seq, len(ctx), args.context, args.context, table,
                               slots, pos)
            full.forward(md, ctx, pos, slots, (qsl[1:] - 1).long())
            times = {"full": [], "reduced": [], "argmax": []}
            one = torch.arange(B + 1, dtype=torch.int32)
            for i in range(args.passes + 4):
                length = args.context + i       # the pass writes position `length`
                p = torch.full((B,), length, dtype=torch.long)
                s = torch.full((B,), length + 1, dtype=torch.int32)
                slot = _slots(table, None, p, bs, B)
                tok = torch.randint(4, V, (B,), generator=g, dtype=torch.int32)
                arms = [("full", full, False), ("reduced", reduced, False),
                        ("argmax", reduced, True)]
                for name, k, only_set in arms[i % 3:] + arms[:i % 3]:
                    m = k.metadata(one, one, s, s, B, 1, length + 1, table, slot, p)
                    t0 = time.perf_counter()
                    k.forward(m, tok, p, slot, torch.arange(B), only_set)
                    if i >= 4:                  # the first passes warm up
                        times[name].append((time.perf_counter() - t0) * 1e3)
        f, r, a = (statistics.median(times[n]) for n in ("full", "reduced", "argmax"))
        rows.append({"batch": B, "full_ms": round(f, 3), "reduced_ms": round(r, 3),
                     "ratio": round(r / f, 3), "argmax_ms": round(a, 3),
                     "argmax_ratio": round(a / f, 3),
                     **{f"{n}_iqr_ms": _iqr(times[n]) for n in times}})
        print(f"batch {B}: full head {f:.2f} ms, {len(ids)}-token head {r:.2f} ms ({r / f:.2f}x), "
              f"its logits alone (greedy rounds) {a:.2f} ms ({a / f:.2f}x)")
    result = {"pair": args.pair, "dtype": args.dtype, "vocab_size": V, "draft_vocab": len(ids),
              "context": args.context, "passes": args.passes, "eager": not args.compile,
              "machine": machine_info(), "threads": thread_settings(), "git": git_info(),
              "rows": rows}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "draft_head_cost" + ("-compiled" if args.compile else "") + ".json"
        (args.out / name).write_text(json.dumps(result, indent=1))
    return 0


def _iqr(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4)
    return [round(q[0], 3), round(q[2], 3)]


if __name__ == "__main__":
    raise SystemExit(main())
