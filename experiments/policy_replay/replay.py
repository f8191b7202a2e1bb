"""Replay of the plugin's n-gram drafting decisions in a closed-loop batch, on recorded
target answers, with a step clock from the served step-cost fit.

    python experiments/policy_replay/replay.py ANSWERS.jsonl [--batch 8] [--k 8]
        [--a-ms 95 --b-ms 2.13 --q-ms 0 --p-ms 2.5 --sigma-ms 1.3] [--fit-rows-as-tokens]
        [--specdec '{"ngram_min_prob": 0.1}']

What runs: the real ``DraftModelProposer`` in n-gram mode with adaptive k (its
controllers, match pricing, shadows, batch checks and row ledger), driven by a fake
runner. ``--batch`` rows decode at once (closed loop: a finished answer's row takes the
next prompt, which is prefilled in one step). Each row's drafts are verified against its
recorded greedy answer (the accepted prefix, then one more token), so acceptance is what
the target would give. The proposer's clock (``step_record``'s ``time.perf_counter``) is
a simulated one: a step with n decode/verify tokens and m prefill tokens takes
a + b·n + q·R + p·m over R decoding rows, plus σ on a step that verifies (as the exact
sampler's seconds), the served cost model's own form (``--q-ms`` 0: a row costs a token); ``--a-ms`` etc. default to the fit logged by the smol
float32 server at c = 8 (results/2026-11-28-28bf177-serving-smol-sharegpt-low-load-f32-spread/).
The same answers are replayed without drafts (the baseline) and, with
``--suffix-site``, with in-tree suffix decoding's drafts (k 32, depth 24, every
proposal verified, as vLLM 0.32 calls it). Reported: simulated tokens per second and
its ratio to the baseline, drafted request-rounds, and no-draft reasons.

It tests the decision rules under the cost model they assume, not the machine: a
served run's step times differ from a + b·n (host work, batch shape).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MAX_LEN = 2048


class Clock:
    """The simulated clock read by ``step_record`` (seconds)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Runner:
    """The parts of vLLM's GPU model runner the proposer reads."""

    def __init__(self, batch: int) -> None:
        self.input_batch = SimpleNamespace(
            req_ids=[None] * batch, req_id_to_index={},
            token_ids_cpu=np.zeros((batch, MAX_LEN), dtype=np.int64),
            num_tokens_no_spec=np.zeros(batch, dtype=np.int64),
            num_prompt_tokens=np.zeros(batch, dtype=np.int64))
        self.requests: dict[str, SimpleNamespace] = {}
        self.rejection_sampler = SimpleNamespace(exact_seconds=0.0)

    def admit(self, row: int, rid: str, prompt: list[int], max_tokens: int) -> None:
        b = self.input_batch
        old = b.req_ids[row]
        if old is not None:
            b.req_id_to_index.pop(old, None)
            self.requests.pop(old, None)
        b.req_ids[row] = rid
        b.req_id_to_index[rid] = row
        b.token_ids_cpu[row, :len(prompt)] = prompt
        b.num_tokens_no_spec[row] = len(prompt)
        b.num_prompt_tokens[row] = len(prompt)
        self.requests[rid] = SimpleNamespace(sampling_params=SimpleNamespace(
            temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None,
            repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
            logit_bias=None, max_tokens=max_tokens))


def simulate(rows: list[dict], batch: int, cost: dict, draft_fn=None, proposer=None) -> dict:
    """Closed-loop replay; ``draft_fn(slot, n)`` (suffix) or ``proposer`` (the plugin)
    proposes, neither: no speculation. Returns tokens, seconds, rounds."""
    clock = Clock()
    runner = Runner(batch)
    queue = list(enumerate(rows))
    slots: list[dict | None] = [None] * batch  # per row: rid, output, emitted, drafts
    finished: list[str] = []
    new: list[str] = []
    tokens = drafted_rounds = decode_rounds = 0
    if proposer is not None:
        from vllm_specdec_plugin import step_record
        step_record.time = SimpleNamespace(perf_counter=clock)  # that module's clock only
        proposer.bind_runner(runner)

    def refill(row: int) -> None:
        """The next prompt takes the row (after the step's scheduler output: vLLM's
        batch still holds a finished request then, and the corpus reads it)."""
        if not queue:
            slots[row] = None
            return
        i, r = queue.pop(0)
        rid = f"r{i}"
        runner.admit(row, rid, r["prompt"], len(r["output"]))
        slots[row] = {"rid": rid, "out": r["output"], "done": 0, "drafts": [], "new": True,
                      "slot": i}
        if draft_fn is not None:
            draft_fn("start", i, r["prompt"])

    empty = list(range(batch))  # rows to refill at the next step
    while empty or any(s is not None for s in slots):
        b = runner.input_batch
        sched = {}
        spec = {}
        take = queue[:len(empty)]  # the prompts this step admits
        for (i, r) in take:
            sched[f"r{i}"] = len(r["prompt"])
            new.append(f"r{i}")
        for row, s in enumerate(slots):
            if s is None or row in empty:
                continue
            else:
                sched[s["rid"]] = 1 + len(s["drafts"])
                if s["drafts"]:
                    spec[s["rid"]] = list(s["drafts"])
        so = SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=set(),
                             num_scheduled_tokens=sched, scheduled_spec_decode_tokens=spec,
                             specdec_scope=({rid: None for rid in new}, frozenset()))
        finished, new = [], []
        if proposer is not None:
            proposer.on_scheduler_output(so)
        for row in empty:
            refill(row)
        empty = []
        if not any(s is not None for s in slots):
            break
        n = m = rows_decoding = 0
        verify = False
        sampled: list[list[int]] = [[] for _ in range(batch)]
        for row, s in enumerate(slots):
            if s is None:
                continue
            out, t = s["out"], s["done"]
            if s["new"]:
                m += sched[s["rid"]]
                emit = out[:1]
                s["new"] = False
            else:
                d = s["drafts"]
                n += 1 + len(d)
                rows_decoding += 1
                verify = verify or bool(d)
                decode_rounds += 1
                drafted_rounds += bool(d)
                a = 0
                while a < len(d) and t + a < len(out) and d[a] == out[t + a]:
                    a += 1
                emit = out[t:t + a + 1]
            L = int(b.num_tokens_no_spec[row])
            b.token_ids_cpu[row, L:L + len(emit)] = emit
            b.num_tokens_no_spec[row] = L + len(emit)
            s["done"] = t + len(emit)
            tokens += len(emit)
            sampled[row] = list(emit)
            if draft_fn is not None:
                draft_fn("emit", s["slot"], emit)
        step = cost["a"] + cost["b"] * n + cost["q"] * rows_decoding + cost["p"] * m \
            + (cost["sigma"] if verify else 0.0)
        clock.t += step
        runner.rejection_sampler.exact_seconds = cost["sigma"] if verify else 0.0
        if proposer is not None:
            drafts = proposer.propose(sampled, b.num_tokens_no_spec, b.token_ids_cpu)
        else:
            drafts = [[] for _ in range(batch)]
        for row, s in enumerate(slots):
            if s is None:
                continue
            left = len(s["out"]) - s["done"]
            if left <= 0:
                finished.append(s["rid"])
                if draft_fn is not None:
                    draft_fn("stop", s["slot"], None)
                empty.append(row)
                continue
            if draft_fn is not None and not s["new"]:
                drafts[row] = draft_fn("draft", s["slot"], left - 1)
            s["drafts"] = list(drafts[row][:max(left - 1, 0)])
    return {"tokens": tokens, "seconds": clock.t, "tok_s": tokens / clock.t,
            "drafted_rounds": drafted_rounds, "decode_rounds": decode_rounds}


def suffix_drafter(site: Path, k: int = 32, depth: int = 24):
    """arctic-inference's suffix trees driven as vLLM 0.32's SuffixDecodingProposer does."""
    sys.path.insert(0, str(site))
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=10000)
    seqs: dict[int, list[int]] = {}

    def fn(what: str, i: int, arg):
        if what == "start":
            cache.start_request(i, arg)
            seqs[i] = list(arg)
        elif what == "emit":
            cache.add_active_response(i, list(arg))
            seqs[i].extend(arg)
        elif what == "stop":
            cache.stop_request(i)
        elif what == "draft":
            n = min(k, arg)
            if n <= 0:
                return []
            return list(cache.speculate(i, seqs[i][-depth:], max_spec_tokens=n,
                                        max_spec_factor=1.0, min_token_prob=0.1).token_ids)
    return fn


def make_proposer(target: str, k: int, specdec: dict):
    from vllm_specdec_plugin.compat import standalone
    from vllm_specdec_plugin.proposer import DraftModelProposer

    spec = {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
            "num_speculative_tokens": k, "draft_load_config": {"model_loader_extra_config": {
                "specdec": {"method": "ngram", "adaptive": True, **specdec}}}}
    p = DraftModelProposer(standalone.vllm_config(target, spec, max_model_len=MAX_LEN))
    p.load_model(None)
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("answers", type=Path)
    ap.add_argument("--target", default=str(REPO / ".cache/fixtures/v3/smol/target"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="first N answers only (0: all)")
    ap.add_argument("--a-ms", type=float, default=95.0)
    ap.add_argument("--b-ms", type=float, default=2.13)
    ap.add_argument("--q-ms", type=float, default=0.0, help="a decoding row beyond its token")
    ap.add_argument("--p-ms", type=float, default=2.5)
    ap.add_argument("--sigma-ms", type=float, default=1.3)
    ap.add_argument("--specdec", default="{}", help="extra plugin options (JSON)")
    ap.add_argument("--fit-rows-as-tokens", action="store_true",
                    help="feed the step fit no row counts (every token a row), for comparison")
    ap.add_argument("--suffix-site", type=Path, default=None)
    args = ap.parse_args()
    rows = [json.loads(x) for x in args.answers.read_text().splitlines()]
    rows = rows[:args.limit] if args.limit else rows
    rows = [r for r in rows if r["output"] and len(r["prompt"]) + len(r["output"]) < MAX_LEN]
    cost = {"a": args.a_ms / 1e3, "b": args.b_ms / 1e3, "q": args.q_ms / 1e3,
            "p": args.p_ms / 1e3, "sigma": args.sigma_ms / 1e3}
    base = simulate(rows, args.batch, cost)
    res = {"baseline": base}
    if args.suffix_site:
        res["suffix-k32"] = simulate(rows, args.batch, cost, draft_fn=suffix_drafter(args.suffix_site))
    p = make_proposer(args.target, args.k, json.loads(args.specdec))
    if args.fit_rows_as_tokens:  # the fit as it was before 2026-11-29: no row regressor
        observe = p.step_cost.observe_target_step
        p.step_cost.observe_target_step = lambda s, n, m=0, rows=None: observe(s, n, m)
    res["plugin"] = simulate(rows, args.batch, cost, proposer=p)
    res["plugin"]["no_draft"] = dict(Counter(p.stats.no_draft))
    res["plugin"]["drafted"], res["plugin"]["accepted"] = p.stats.drafted, p.stats.accepted
    for name, r in res.items():
        print(f"{name:12} {r['tok_s']:7.2f} tok/s  {r['tok_s'] / base['tok_s']:.3f}x  "
              f"drafted {r['drafted_rounds']}/{r['decode_rounds']} request-rounds"
              + (f"  no_draft {r['no_draft']}  drafted {r['drafted']} accepted {r['accepted']}"
                 if "no_draft" in r else ""))


if __name__ == "__main__":
    main()
