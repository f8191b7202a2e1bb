"""What a verification step's sampling costs, greedy against sampled and seeded rows.

Times the plugin's verification work after the target forward (``rejection_sample``
on the positions it reaches: the sampling pipeline there and, for seeded rows, vLLM's
fused Gumbel-max op on the request's seed stream) on random logits at V = 49,152 (the
smol pair's vocabulary), B rows of k drafts each, point-mass drafts (n-gram) or draft
distributions q, drafts all accepted (k + 1 positions a row) or rejected at once (one);
beside it, vLLM's own plain sampling of B rows (``Sampler`` on one position per row),
what a step without drafts pays:

    python -m benchmarks.sampled_rows --out results/DIR

One thread (as ``vllm serve``'s engine on these machines). Writes ``sampled_rows.json``
and prints a table: ms per step, median of ``--repeat`` timings after warm-up.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch

MODES = {"greedy": {"temperature": 0.0},
         "sampled": {"temperature": 0.7, "top_p": 0.9},
         "seeded": {"temperature": 0.7, "top_p": 0.9, "seed": 1234}}
DRAFTS = ("accepted", "rejected")


def _time(fn, repeat: int) -> float:
    fn()
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(out)


def verify_ms(mode: str, batch: int, k: int, vocab: int, with_q: bool, drafts_kind: str,
              repeat: int) -> dict:
    """ms of one verification step's sampling work, as ``compat.rejection_adapter`` runs
    it: ``rejection_sample`` on a ``TargetRows`` that runs the pipeline (and, seeded,
    vLLM's op) on the positions verification reaches. drafts_kind "accepted": each
    draft is its position's dominant token (every position reached, k + 1 a row);
    "rejected": random drafts (about one position a row)."""
    from vllm_specdec_plugin.compat.seeded import seeded_tokens
    from vllm_specdec_plugin.rejection import TargetRows, rejection_sample
    from vllm_specdec_plugin.sampling.pipeline import SamplingSpec, position_probs
    from vllm_specdec_plugin.token_draw import SeedStream

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(batch * (k + 1), vocab, generator=g) * 3.0   # [T, V]
    specs = [SamplingSpec(**MODES[mode])] * batch
    drafts = [[int(x) for x in torch.randint(0, vocab, (k,), generator=g)] for _ in range(batch)]
    if drafts_kind == "accepted":   # p(draft) about 1 at every position
        for b, row in enumerate(drafts):
            for j, x in enumerate(row):
                logits[b * (k + 1) + j, x] = 100.0
    seeded = [mode == "seeded"] * batch
    draft_ids = torch.tensor(drafts, dtype=torch.long)
    n = torch.full((batch,), k, dtype=torch.long)
    q = torch.softmax(torch.randn(batch * k, vocab, generator=g), -1) if with_q else None
    if q is not None and drafts_kind == "accepted":
        q[torch.arange(batch * k), draft_ids.flatten()] = 1.0   # q(draft) <= p(draft)
    greedy = torch.tensor([mode == "greedy"] * batch)
    outputs = [[1, 2, 3]] * batch
    made = []

    def rows(idx):
        made.append(idx.numel())
        return position_probs(logits, specs, [[]] * batch, outputs, drafts, keep_logits=seeded,
                              rows=idx.tolist())

    def seeded_rows(idx, got):
        return torch.cat([seeded_tokens(got[i:i + 1], SeedStream(1234 + r // (k + 1), 10),
                                        r % (k + 1)) for i, r in enumerate(idx.tolist())])

    target = TargetRows((batch * (k + 1), vocab), torch.device("cpu"), rows,
                        seeded_rows if mode == "seeded" else None)

    def verify():
        made.clear()
        return rejection_sample(draft_ids, n, q, target, greedy, seeded)

    ms = _time(verify, repeat)
    return {"verify_ms": ms, "positions": sum(made)}


def vllm_plain_ms(mode: str, batch: int, vocab: int, repeat: int) -> float | None:
    """ms of vLLM's own sampling of B rows, one position each (a plain step), where
    its Sampler can be built without an engine; None elsewhere."""
    try:
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.sampler import Sampler
    except ImportError:
        return None
    m = MODES[mode]
    t = m["temperature"]
    gens = {b: torch.Generator().manual_seed(1234 + b) for b in range(batch)} if "seed" in m else {}
    try:
        md = SamplingMetadata(
            temperature=None if t == 0 else torch.full((batch,), t),
            all_greedy=t == 0, all_random=t > 0,
            top_p=torch.full((batch,), m["top_p"]) if "top_p" in m else None, top_k=None,
            generators=gens, max_num_logprobs=None, no_penalties=True,
            prompt_token_ids=None, frequency_penalties=torch.zeros(batch),
            presence_penalties=torch.zeros(batch), repetition_penalties=torch.ones(batch),
            output_token_ids=[[] for _ in range(batch)], allowed_token_ids_mask=None,
            bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    except TypeError as err:   # another vLLM's fields
        print(f"vLLM plain sampler not timed: {err}")
        return None
    sampler = Sampler()
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(1)) * 3.0
    return _time(lambda: sampler(logits.clone(), md), repeat)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from benchmarks import machine

    torch.set_num_threads(1)
    rows = []
    for batch in map(int, a.batches.split(",")):
        plain = {mode: vllm_plain_ms(mode, batch, a.vocab, a.repeat) for mode in MODES}
        for k in map(int, a.ks.split(",")):
            for with_q, drafts_kind, mode in itertools.product((False, True), DRAFTS, MODES):
                r = {"batch": batch, "k": k, "q": with_q, "drafts": drafts_kind, "mode": mode,
                     "vllm_plain_ms": plain[mode],
                     **verify_ms(mode, batch, k, a.vocab, with_q, drafts_kind, a.repeat)}
                rows.append(r)
                print(" ".join(f"{key} {v:.2f}" if isinstance(v, float) else f"{key} {v}"
                               for key, v in r.items()), flush=True)
    res = {"rows": rows, "meta": {"args": {k: str(v) for k, v in vars(a).items()},
                                  "threads": torch.get_num_threads(),
                                  "machine": machine.machine_info(), "git": machine.git_info()}}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sampled_rows.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
