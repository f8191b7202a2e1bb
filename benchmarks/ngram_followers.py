"""Would n-gram drafts drawn from their followers' distribution pay at T > 0?

Under exact rejection a point-mass draft x is accepted with probability p(x); a draft
drawn from q, with probability 1 - TV(p, q) = sum_v min(p_v, q_v). Where an n-gram
context has several recorded followers, q = their counts / the occurrences is exact to
use. This measures both on the first draft of every round the plugin's own lookup would
draft (``ngram.NGramIndex`` rules: longest match of 4..1 tokens in the request's last
1,024, confidence >= ``NGRAM_MIN_PROB``):

    python -m benchmarks.ngram_followers --pair smol --prompts 64 --out results/DIR

The real target samples held-out ShareGPT answers at T 0.7 / top-p 0.9 (transformers,
float32, one request at a time); p at each output position is its sampling
distribution there (temperature, then top-p), from one forward over prompt + answer.
Writes ``ngram_followers.json`` (per position: followers, p(x), 1 - TV) and prints the
means over all drafted positions and over those whose context had two or more followers.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_testing.ngram_reference import match_followers
from vllm_specdec_plugin.ngram import choose
from vllm_specdec_plugin.tuning import NGRAM_MAX_N, NGRAM_MIN_N, NGRAM_MIN_PROB, NGRAM_WINDOW


def followers_at(ctx: list[int]) -> tuple[dict[int, int], int] | None:
    """The plugin's lookup over ``ctx`` (its last ``NGRAM_WINDOW`` tokens): the longest
    suffix's follower counts and the most recent one's follower (None: no match)."""
    return match_followers(ctx, max(0, len(ctx) - NGRAM_WINDOW), min(NGRAM_MAX_N, len(ctx) - 1),
                           NGRAM_MIN_N)


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """[T, V] logits -> [T, V] the target's sampling distribution (temperature, top-p as
    vLLM: keep the most probable tokens whose mass reaches top_p)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(dim=-1) - sorted_p >= top_p   # mass before a token already >= p
    sorted_p[drop] = 0.0
    out = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
    return out / out.sum(dim=-1, keepdim=True)


def measure(target: str, prompts: int, max_new: int, temperature: float, top_p: float,
            seed: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.workloads import sharegpt_pool

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    chats = sharegpt_pool(target, max_new, 2048, seed)[:prompts]
    torch.manual_seed(seed)
    rows = []
    for chat in chats:
        text = tok.apply_chat_template([{"role": "user", "content": chat["conversations"][0]["value"]}],
                                       add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            seq = model.generate(ids, do_sample=True, temperature=temperature, top_p=top_p,
                                 top_k=0, max_new_tokens=max_new, pad_token_id=tok.eos_token_id)
            logits = model(seq).logits[0]
        n_prompt, full = ids.shape[1], seq[0].tolist()
        p = sampling_probs(logits[n_prompt - 1:len(full) - 1], temperature, top_p)  # [answer, V]
        for t in range(len(full) - n_prompt):
            found = followers_at(full[:n_prompt + t])
            if found is None:
                continue
            counts, recent = found
            x, conf = choose(counts, recent)
            if conf < NGRAM_MIN_PROB:
                continue   # the plugin drafts nothing here
            total = sum(counts.values())
            ids_ = torch.tensor(list(counts))
            q = torch.tensor([c / total for c in counts.values()])
            rows.append({"followers": len(counts), "p_x": float(p[t, x]),
                         "one_minus_tv": float(torch.minimum(p[t, ids_], q).sum()),
                         "sampled_in_followers": full[n_prompt + t] in counts})
    return {"prompts": len(chats), "positions": rows}


def summary(rows: list[dict]) -> dict:
    def mean(key: str, sel: list[dict]) -> float | None:
        return round(sum(r[key] for r in sel) / len(sel), 4) if sel else None

    multi = [r for r in rows if r["followers"] >= 2]
    return {"drafted_positions": len(rows), "multi_follower_positions": len(multi),
            "point_mass_acceptance": mean("p_x", rows), "distribution_acceptance": mean("one_minus_tv", rows),
            "multi_point_mass_acceptance": mean("p_x", multi),
            "multi_distribution_acceptance": mean("one_minus_tv", multi)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="smol")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from specdec_fixtures import ensure_pair

    from benchmarks import machine

    t0 = time.time()
    res = measure(str(ensure_pair(a.pair).target), a.prompts, a.max_new, a.temperature, a.top_p,
                  a.seed)
    res["summary"] = summary(res["positions"])
    res["meta"] = {"args": {k: str(v) for k, v in vars(a).items()}, "seconds": round(time.time() - t0),
                   "machine": machine.machine_info(), "git": machine.git_info()}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ngram_followers.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"], indent=1))


if __name__ == "__main__":
    main()
