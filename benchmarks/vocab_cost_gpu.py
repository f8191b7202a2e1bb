"""The plugin's side of one speculative step on a GPU, by vocabulary size, without vLLM.

For machines where vLLM cannot be installed but a GPU and PyTorch are (the lent device
machines: no network, and vLLM's wheels are far over what can be carried). The
plugin's verify and draft-sampling code is vLLM-free below its adapter, so it runs
here on CUDA tensors as in a served engine:
  - draft: ``DraftSampler`` and its k ``pick`` passes over the draft's [B, V] logits,
    the round's one device -> host copy, ``draft_probs.build`` (q);
  - verify: the runner's q gather (as vLLM 0.32's ``_get_spec_decode_draft_probs``),
    then ``exact_rejection_sample`` on target logits [B (k + 1), V] (bf16), with
    duck-typed runner, metadata and SamplingParams (attributes it reads, nothing else).
Mixes without top-p, top-k or penalties (those call vLLM's own sampler ops). Each
side is timed from a synchronised device to a synchronised device (wall ms: host and
device time on the step's critical path); median [IQR] over the repeats.

Before timing, two checks on the device: greedy verification gives the same tokens as
on the CPU for the same logits, and the first token of sampled verification follows p
(chi-square over 200k rows at V = 8), with a negative control (drafts drawn from a q
other than the one passed) that must fail.

    python -m benchmarks.vocab_cost_gpu [--vocab 2048,49152,128256] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks.machine import REPO, git_info, machine_info
from benchmarks.vocab_cost import MIXES, Mix
from benchmarks.vocab_cost_vllm import logit_rows
from vllm_specdec_plugin.compat.rejection_adapter import exact_rejection_sample
from vllm_specdec_plugin.draft.sampler import DraftSampler
from vllm_specdec_plugin.draft_probs import build as build_q
from vllm_specdec_plugin.rejection import rejection_sample
from vllm_specdec_plugin.sampling.pipeline import SamplingSpec

GPU_MIXES = ("greedy", "t1", "mixed", "ngram-t1")


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Cell:
    """Inputs of one (mix, B, k, V) step on ``dev``, built outside the timers."""

    def __init__(self, mix: Mix, batch: int, k: int, vocab: int, dev: torch.device):
        self.mix, self.batch, self.k, self.vocab, self.dev = mix, batch, k, vocab, dev
        g = torch.Generator(device=dev).manual_seed(1000 * batch + 10 * k + vocab)
        params = [SimpleNamespace(**mix.params(b)) for b in range(batch)]
        specs = [SamplingSpec.from_sampling_params(sp) for sp in params]
        self.draft_specs = [None if s.is_greedy else s for s in specs]
        self.draft_logits = torch.randn(k, batch, vocab, generator=g, device=dev) * 2
        self.target_logits = (torch.randn(batch * (k + 1), vocab, generator=g, device=dev)
                              * 2).to(torch.bfloat16)
        self.ngram = torch.randint(0, vocab, (batch, k), generator=g, device=dev).tolist()
        req_ids = [f"req-{b}" for b in range(batch)]
        self.runner = SimpleNamespace(
            input_batch=SimpleNamespace(req_ids=req_ids),
            requests={r: SimpleNamespace(sampling_params=sp, prompt_token_ids=[1] * 128,
                                         output_token_ids=[2] * 64, num_tokens=192)
                      for r, sp in zip(req_ids, params)})
        drafts, self.q = self.draft()
        self.metadata = metadata(drafts, dev)

    def draft(self) -> tuple[list[list[int]], torch.Tensor | None]:
        if self.mix.ngram:
            return self.ngram, build_q([], None, self.ngram, self.vocab, self.dev)
        sampler = DraftSampler(self.draft_specs, [[]] * self.batch, [[]] * self.batch,
                               [None] * self.batch, self.k, self.vocab, self.dev)
        drafts = torch.zeros((self.batch, self.k), dtype=torch.long, device=self.dev)
        for pos in range(self.k):
            drafts[:, pos] = sampler.pick(self.draft_logits[pos], pos, drafts)
        drafts_list = drafts.tolist()
        sampled = [i for i, s in enumerate(self.draft_specs) if s is not None]
        return drafts_list, build_q(sampled, sampler.q, drafts_list, self.vocab, self.dev)

    def verify(self) -> torch.Tensor:
        q = None if self.q is None else torch.cat([self.q[b, :self.k] for b in range(self.batch)])
        return exact_rejection_sample(self.runner, self.metadata, q, self.target_logits)


def metadata(drafts: list[list[int]], dev: torch.device) -> SimpleNamespace:
    """What the adapter reads of vLLM's SpecDecodeMetadata: request b's draft rows,
    then its bonus row."""
    target, bonus = logit_rows(drafts)
    flat = [t for d in drafts for t in d]
    return SimpleNamespace(
        num_draft_tokens=[len(d) for d in drafts], max_spec_len=max(len(d) for d in drafts),
        draft_token_ids=torch.tensor(flat, dtype=torch.int32, device=dev),
        target_logits_indices=torch.tensor(target, dtype=torch.int32, device=dev),
        bonus_logits_indices=torch.tensor(bonus, dtype=torch.int32, device=dev))


# ---------------------------------------------------------------------------- checks

def check_greedy_matches_cpu(dev: torch.device) -> dict:
    """Greedy verification on the device gives the CPU's tokens for the same logits."""
    cell = Cell(MIXES["greedy"], 32, 8, 49152, dev)
    # Drafts that agree with the target's argmax for a prefix, so some are accepted.
    arg = cell.target_logits.float().argmax(-1).view(32, 9)[:, :8].tolist()
    drafts = [row[: b % 9] + [0] * (8 - b % 9) for b, row in enumerate(arg)]
    cell.metadata = metadata(drafts, dev)
    gpu = cell.verify().cpu()
    cpu = exact_rejection_sample(cell.runner, metadata(drafts, torch.device("cpu")), None,
                                 cell.target_logits.cpu())
    return {"check": "greedy verify, device == CPU (B 32, k 8, V 49,152)",
            "passed": bool(torch.equal(gpu, cpu)), "accepted": int((gpu >= 0).sum()) - 32}


def check_sampled_first_token(dev: torch.device, rows: int = 200_000) -> list[dict]:
    """First output token ~ p (one draft from q, k 1, V 8), and a negative control."""
    from scipy.stats import chisquare

    g = torch.Generator(device=dev).manual_seed(7)
    p1 = torch.softmax(torch.randn(8, generator=g, device=dev) * 1.5, -1)
    q1 = torch.softmax(torch.randn(8, generator=g, device=dev) * 1.5, -1)
    other = torch.softmax(torch.randn(8, generator=g, device=dev) * 1.5, -1)
    out = []
    for name, draw_from, should_pass in (("exact", q1, True),
                                         ("negative control: drafts from another q", other, False)):
        drafts = torch.multinomial(draw_from.expand(rows, 8), 1, generator=g)      # [rows, 1]
        p = torch.stack([p1, p1], 0).repeat(rows, 1)          # per row: draft row, bonus row
        q = q1.expand(rows, 8).contiguous()
        n = torch.ones(rows, dtype=torch.int64, device=dev)
        greedy = torch.zeros(rows, dtype=torch.bool, device=dev)
        tokens, _ = rejection_sample(drafts, n, q, p, greedy, None, None)
        counts = torch.bincount(tokens[:, 0], minlength=8).cpu().double()
        pv = float(chisquare(counts.numpy(), (p1.double().cpu() * rows).numpy()).pvalue)
        out.append({"check": f"sampled first token ~ p, {name} (V 8, {rows} rows)",
                    "p_value": pv, "passed": (pv > 1e-3) == should_pass})
    return out


# ---------------------------------------------------------------------------- timing

def time_cell(cell: Cell, repeats: int) -> dict:
    dev = cell.dev
    for _ in range(3):                                   # warm-up
        cell.draft(); cell.verify()
    times: dict[str, list[float]] = {"draft": [], "verify": []}
    for _ in range(repeats):
        for side, fn in (("draft", cell.draft), ("verify", cell.verify)):
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            times[side].append(1e3 * (time.perf_counter() - t0))
    res = {"mix": cell.mix.name, "batch": cell.batch, "k": cell.k, "vocab": cell.vocab}
    for side, ts in times.items():
        qs = statistics.quantiles(ts, n=4)
        res[f"{side}_ms"] = statistics.median(ts)
        res[f"{side}_iqr_ms"] = [qs[0], qs[2]]
    res["step_ms"] = res["draft_ms"] + res["verify_ms"]
    return res


def markdown(meta: dict, checks: list[dict], cells: list[dict], vocab: list[int]) -> str:
    lo, hi = min(vocab), max(vocab)
    lines = [f"# Plugin side of a step on {meta['machine']['gpu']} (vLLM-free path)", "",
             "Median wall ms per step, device synchronised before and after each side.", "",
             "## Checks on the device", ""]
    lines += [f"- {'PASS' if c['passed'] else 'FAIL'}: {c['check']}"
              + (f" (p = {c['p_value']:.3g})" if "p_value" in c else "") for c in checks]
    lines += ["", "| mix | B | k | " + " | ".join(f"step @ {v}" for v in vocab)
              + f" | {hi} / {lo} step | verify {hi} / {lo} | draft {hi} / {lo} |",
              "|---|---:|---:|" + "---:|" * (len(vocab) + 3)]
    by = {(c["mix"], c["batch"], c["k"], c["vocab"]): c for c in cells}
    for mix, b, k in sorted({(c["mix"], c["batch"], c["k"]) for c in cells},
                            key=lambda t: (GPU_MIXES.index(t[0]), t[1], t[2])):
        row = [by[(mix, b, k, v)] for v in vocab]
        r = lambda side: by[(mix, b, k, hi)][side] / by[(mix, b, k, lo)][side]
        lines.append(f"| {mix} | {b} | {k} | " + " | ".join(f"{c['step_ms']:.2f}" for c in row)
                     + f" | {r('step_ms'):.2f} | {r('verify_ms'):.2f} | {r('draft_ms'):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ints = lambda s: [int(x) for x in s.split(",") if x]
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vocab_cost_gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=ints, default=[2048, 49152, 128256])
    ap.add_argument("--batches", type=ints, default=[1, 8, 32])
    ap.add_argument("--ks", type=ints, default=[4, 8])
    ap.add_argument("--mixes", default=",".join(GPU_MIXES))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "tmp" / "vocab-cost-gpu")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    meta = {"machine": machine_info(), "git": git_info(),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    t0 = time.perf_counter()
    checks = [check_greedy_matches_cpu(dev), *check_sampled_first_token(dev)]
    for c in checks:
        print(("PASS " if c["passed"] else "FAIL ") + json.dumps(c), flush=True)
    cells = []
    for mix in args.mixes.split(","):
        for b in args.batches:
            for k in args.ks:
                for v in args.vocab:
                    cell = Cell(MIXES[mix], b, k, v, dev)
                    cells.append(time_cell(cell, args.repeats))
                    del cell
                print(mix, b, k, " ".join(f"{c['step_ms']:.2f}" for c in cells[-len(args.vocab):]),
                      flush=True)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({**meta, "checks": checks, "cells": cells},
                                                      indent=1))
    (args.out / "results.md").write_text(markdown(meta, checks, cells, args.vocab))
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
