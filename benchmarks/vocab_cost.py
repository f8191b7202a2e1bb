"""Host cost of the plugin's side of one speculative step, by vocabulary size.

Engine-free: no model runs. For each request mix, batch B and k, on random logits:
  - draft sampling: ``DraftSampler`` construction, its k ``pick`` passes, the drafts'
    host copy and ``draft_probs.build`` (the q channel);
  - verification: vLLM's ``_get_spec_decode_draft_probs`` (q gathered per draft row),
    then the plugin's ``exact_rejection_sample`` on target logits [sum(k_b) + B, V];
  - vLLM's own host path on the same inputs (``vocab_cost_vllm``): its rejection
    sampler, and its draft proposers' argmax per pass: what any speculative method
    pays at that V, beside the plugin's;
at each V (default 2,048 and 49,152), one torch thread (as vLLM's CPU worker), median
ms per step and the ratio of the largest V to the smallest.
Excluded: the target's and the draft's model forwards (lm_head included), vLLM's
scheduling, logprobs and output processing.

    python -m benchmarks.vocab_cost [--vocab 2048,49152] [--batches 1,8,32] [--ks 4,8]
        [--mixes greedy,t1,...] [--repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from benchmarks.machine import REPO, ForeignLoad, git_info, machine_info, versions
from benchmarks.step_probe import Probe
from benchmarks.vocab_cost_report import markdown, ratio_of, summary
from benchmarks.vocab_cost_vllm import DEVICE, InTree, fake_runner, spec_metadata
from benchmarks.vocab_cost_vllm import entries as vllm_entries


# ------------------------------------------------------------------------ request mixes

@dataclass(frozen=True)
class Mix:
    """One batch composition. ``params(row)`` gives that row's SamplingParams kwargs."""

    name: str
    about: str
    params: Callable[[int], dict]
    ngram: bool = False  # drafts are point masses from a lookup: no draft sampling, q None


GREEDY = {"temperature": 0.0}
T1 = {"temperature": 1.0}
MIXES = {m.name: m for m in (
    Mix("greedy", "all greedy", lambda b: GREEDY),
    Mix("t1", "all T=1", lambda b: T1),
    Mix("t1-topp", "all T=1, top_p=0.9", lambda b: {**T1, "top_p": 0.9}),
    Mix("t1-rep", "all T=1, repetition_penalty=1.2", lambda b: {**T1, "repetition_penalty": 1.2}),
    Mix("mixed", "even rows greedy (point-mass q), odd rows T=1", lambda b: GREEDY if b % 2 == 0 else T1),
    Mix("ngram-t1", "all T=1, n-gram drafts (q=None)", lambda b: T1, ngram=True),
)}


# ------------------------------------------------------------------- the plugin's entries

def _entries() -> SimpleNamespace:
    """Everything the benchmark calls, imported by name so a renamed or moved entry
    stops the run here with the name that is missing, not halfway through a sweep."""
    names = {
        "exact_rejection_sample": ("vllm_specdec_plugin.compat.rejection_adapter", "exact_rejection_sample"),
        "DraftSampler": ("vllm_specdec_plugin.draft.sampler", "DraftSampler"),
        "build_q": ("vllm_specdec_plugin.draft_probs", "build"),
        "SamplingSpec": ("vllm_specdec_plugin.sampling.pipeline", "SamplingSpec"),
        "SamplingParams": ("vllm", "SamplingParams"),
        "SpecDecodeMetadata": ("vllm.v1.spec_decode.metadata", "SpecDecodeMetadata"),
        "GPUModelRunner": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
        **vllm_entries(),
    }
    out = {}
    for key, (module, attr) in names.items():
        try:
            out[key] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise SystemExit(f"vocab_cost: interface changed: cannot get {module}.{attr}: {e}") from e
    return SimpleNamespace(**out)


# ------------------------------------------------------------------------------- a cell

@dataclass
class Cell:
    """Inputs of one (mix, B, k, V) step, built once outside the timed region."""

    mix: Mix
    batch: int
    k: int
    vocab: int
    draft_specs: list[Any]            # per row: SamplingSpec (sampled) or None (argmax)
    prompts: list[list[int]]
    outputs: list[list[int]]
    draft_logits: torch.Tensor        # [k, B, V] float32: what each draft pass returns
    target_logits: torch.Tensor       # [B * (k + 1), V]
    ngram_drafts: list[list[int]]
    runner: Any = None
    metadata: Any = None
    intree: Any = None                # InTree: vLLM's own path on these inputs


def make_cell(api: SimpleNamespace, mix: Mix, batch: int, k: int, vocab: int,
              args: argparse.Namespace) -> Cell:
    g = torch.Generator().manual_seed(1000 * batch + 10 * k + vocab)
    params = [api.SamplingParams(**mix.params(b)) for b in range(batch)]

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    specs = [api.SamplingSpec.from_sampling_params(sp) for sp in params]
    # Scale 2: peaked like LM logits; cost does not depend on it (no data-dependent loops).
    cell = Cell(
        mix=mix, batch=batch, k=k, vocab=vocab,
        draft_specs=[None if s.is_greedy else s for s in specs],
        prompts=[tokens(args.prompt_len) for _ in range(batch)],
        outputs=[tokens(args.output_len) for _ in range(batch)],
        draft_logits=torch.randn(k, batch, vocab, generator=g) * 2,
        target_logits=(torch.randn(batch * (k + 1), vocab, generator=g) * 2).to(args.logits_dtype),
        ngram_drafts=[tokens(k) for _ in range(batch)],
    )
    with loud(cell, "draft side (DraftSampler / draft_probs.build)"):
        drafts, q = draft_step(api, cell)   # the verify step consumes this step's drafts and q
    check_drafts(cell, drafts, q)
    cell.runner = fake_runner(params, cell.prompts, cell.outputs, q)
    cell.metadata = spec_metadata(api, drafts)
    with loud(cell, "vLLM's own path (RejectionSampler on the gathered q)"):
        q_rows = api.GPUModelRunner._get_spec_decode_draft_probs(cell.runner, cell.metadata)
        cell.intree = InTree(api, cell, params, drafts, q_rows)
    return cell


# ------------------------------------------------------------------------ the two sides

PROBE = Probe()


def draft_step(api: SimpleNamespace, c: Cell) -> tuple[list[list[int]], torch.Tensor | None]:
    """What the proposer does around the draft's forwards (``DraftBatch.run``, ``run_round``,
    ``DraftBatch.publish``): every row drafts all k tokens, rows in batch order."""
    if c.mix.ngram:
        with PROBE.section("draft.build"):
            return c.ngram_drafts, api.build_q([], None, c.ngram_drafts, c.vocab, DEVICE)
    with PROBE.section("draft.init"):
        sampler = api.DraftSampler(c.draft_specs, c.prompts, c.outputs, [None] * c.batch,
                                   c.k, c.vocab, DEVICE)
        drafts = torch.zeros((c.batch, c.k), dtype=torch.long, device=DEVICE)
    for pos in range(c.k):
        drafts[:, pos] = sampler.pick(c.draft_logits[pos], pos, drafts)
    drafts_list = drafts.tolist()     # the round's one device -> host copy
    sampled = [i for i, s in enumerate(c.draft_specs) if s is not None]
    with PROBE.section("draft.build"):
        q = api.build_q(sampled, sampler.q, drafts_list, c.vocab, DEVICE)
    return drafts_list, q


def verify_step(api: SimpleNamespace, c: Cell) -> torch.Tensor:
    """What runs between the target's logits and the step's token ids: vLLM's gather of
    q per draft row (the plugin's channel), then the plugin's exact rejection sampler."""
    with PROBE.section("verify.q_gather"):
        q = api.GPUModelRunner._get_spec_decode_draft_probs(c.runner, c.metadata)
    return api.exact_rejection_sample(c.runner, c.metadata, q, c.target_logits)


@contextmanager
def loud(c: Cell, what: str):
    """Name the cell and the entry when a plugin call raises: most likely its interface
    changed and the fake inputs (``vocab_cost_vllm.fake_runner``, ``make_cell``) need adapting."""
    try:
        yield
    except Exception as e:
        raise RuntimeError(f"vocab_cost: {what} failed on {c.mix.name} B={c.batch} k={c.k} "
                           f"V={c.vocab}: interface changed? {type(e).__name__}: {e}") from e


def check_drafts(c: Cell, drafts: list[list[int]], q: torch.Tensor | None) -> None:
    ok = len(drafts) == c.batch and all(len(d) == c.k and all(0 <= t < c.vocab for t in d)
                                        for d in drafts)
    sampled_rows = not c.mix.ngram and any(s is not None for s in c.draft_specs)
    ok = ok and (q is None) != sampled_rows
    if q is not None:
        ok = ok and tuple(q.shape) == (c.batch, c.k, c.vocab)
    if not ok:
        raise SystemExit(f"vocab_cost: interface changed: draft side of {c.mix.name} B={c.batch} "
                         f"k={c.k} V={c.vocab} returned drafts/q of an unexpected form "
                         f"(q {None if q is None else tuple(q.shape)})")


def check_verify(c: Cell, out: Any) -> None:
    ok = (isinstance(out, torch.Tensor) and tuple(out.shape) == (c.batch, c.k + 1)
          and bool((out[:, 0] >= 0).all()) and bool((out < c.vocab).all()))
    if not ok:
        raise SystemExit(f"vocab_cost: interface changed: a rejection sampler on {c.mix.name} "
                         f"B={c.batch} k={c.k} V={c.vocab} returned "
                         f"{getattr(out, 'shape', type(out))}, expected [{c.batch}, {c.k + 1}] ids")


# ------------------------------------------------------------------------------ timing

def time_cell(api: SimpleNamespace, c: Cell, args: argparse.Namespace) -> dict:
    """Median ms per step of each side, and of each probed component."""
    with loud(c, "verify side (_get_spec_decode_draft_probs / exact_rejection_sample)"):
        check_verify(c, verify_step(api, c))    # warm-up, and a loud interface check
    with loud(c, "vLLM's own path (RejectionSampler.forward)"):
        check_verify(c, c.intree.verify())
        c.intree.draft()
    # (the draft side was warmed up by make_cell, which ran it for the verify's inputs)
    PROBE.reset()
    load = ForeignLoad()
    mark = load.start()
    sides = (("draft", draft_step), ("verify", verify_step),
             ("intree_draft", lambda api, c: c.intree.draft()),
             ("intree_verify", lambda api, c: c.intree.verify()))
    totals: dict[str, list[float]] = {side: [] for side, _ in sides}
    parts: list[dict[str, float]] = []
    t_start = time.perf_counter()
    # At least --repeats steps; cheap cells repeat up to --min-time so the median is stable.
    while len(parts) < args.repeats or (time.perf_counter() - t_start < args.min_time
                                        and len(parts) < 50 * args.repeats):
        for side, fn in sides:
            t0 = time.perf_counter()
            fn(api, c)
            totals[side].append(time.perf_counter() - t0)
        parts.append(PROBE.reset())
    n = len(parts)
    for i, rep in enumerate(parts):           # what the probes did not cover
        for side in ("draft", "verify"):
            rep[side + ".other"] = totals[side][i] - sum(s for l, s in rep.items() if l.startswith(side + "."))
    labels = sorted({l for rep in parts for l in rep})
    ms = {l: 1e3 * statistics.median(rep.get(l, 0.0) for rep in parts) for l in labels}
    return {"mix": c.mix.name, "batch": c.batch, "k": c.k, "vocab": c.vocab, "repeats": n,
            **{f"{s}_ms": 1e3 * statistics.median(totals[s]) for s in totals},
            "components_ms": ms,
            **{f"{s}_ms_all": [round(1e3 * t, 4) for t in totals[s]] for s in totals},
            "foreign_cpu_share": round(load.cpu_share(mark), 3)}


def sweep(api: SimpleNamespace, args: argparse.Namespace) -> list[dict]:
    cells = []
    vmin, vmax = min(args.vocab), max(args.vocab)
    print(f"{'mix':9} {'B':>3} {'k':>2} | " + " ".join(f"{'verify@' + str(v):>13}" for v in args.vocab)
          + " | " + " ".join(f"{'draft@' + str(v):>12}" for v in args.vocab) + " | ratios v/d/step")
    for mix in args.mixes:
        for batch in args.batches:
            for k in args.ks:
                row = []
                for vocab in args.vocab:   # vocab innermost: both sides of a ratio close in time
                    cell = make_cell(api, MIXES[mix], batch, k, vocab, args)
                    row.append(time_cell(api, cell, args))
                    del cell
                cells += row
                by_v = {r["vocab"]: r for r in row}
                ratios = ratio_of(by_v[vmax], by_v[vmin]) if vmax != vmin else {}
                print(f"{mix:9} {batch:>3} {k:>2} | "
                      + " ".join(f"{by_v[v]['verify_ms']:13.3f}" for v in args.vocab) + " | "
                      + " ".join(f"{by_v[v]['draft_ms']:12.3f}" for v in args.vocab) + " | "
                      + " / ".join(f"{ratios.get(s, float('nan')):.2f}" for s in ("verify", "draft", "step")),
                      flush=True)
    return cells


# --------------------------------------------------------------------------------- CLI

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _mixes(text: str) -> list[str]:
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in MIXES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown mix {unknown}; known: {', '.join(MIXES)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vocab_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=_ints, default=[2048, 49152])
    p.add_argument("--batches", type=_ints, default=[1, 8, 32])
    p.add_argument("--ks", type=_ints, default=[4, 8])
    p.add_argument("--mixes", type=_mixes, default=list(MIXES),
                   help=f"comma-separated, of: {', '.join(MIXES)}")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per cell, at least")
    p.add_argument("--min-time", type=float, default=0.3,
                   help="seconds per cell below which cheap cells keep repeating")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--logits-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="target logits dtype (a bf16 model's lm_head output)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "tmp" / "vocab-cost")
    args = p.parse_args(argv)
    args.logits_dtype = getattr(torch, args.logits_dtype)
    if args.repeats < 1 or min(args.ks) < 1 or min(args.batches) < 1:
        p.error("--repeats, --ks and --batches must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)       # vLLM's CPU worker computes on one thread
    torch.manual_seed(0)           # unseeded rows draw from torch's default generator
    api = _entries()
    meta = {"machine": machine_info(), "git": git_info(), "versions": versions(),
            "settings": {"vocab": args.vocab, "batches": args.batches, "ks": args.ks,
                         "mixes": {m: MIXES[m].about for m in args.mixes},
                         "repeats": args.repeats, "min_time_s": args.min_time,
                         "prompt_len": args.prompt_len, "output_len": args.output_len,
                         "logits_dtype": str(args.logits_dtype).removeprefix("torch."),
                         "torch_threads": torch.get_num_threads(), "device": str(DEVICE)}}
    t0 = time.perf_counter()
    with PROBE.installed():
        cells = sweep(api, args)
    meta["probes_missing"] = PROBE.missing
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    rows = summary(cells, args.vocab)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({**meta, "summary": rows, "cells": cells}, indent=1))
    (args.out / "results.md").write_text(markdown(meta, rows, cells, args.vocab))
    print(f"wrote {args.out / 'results.json'} and results.md ({meta['wall_s']} s)")


if __name__ == "__main__":
    main()
