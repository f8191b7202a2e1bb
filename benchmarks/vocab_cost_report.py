"""``vocab_cost``'s report: per (mix, B, k) both sides at every V, and the ratios."""

from __future__ import annotations

from collections import defaultdict

TARGET_RATIO = 1.15  # issue 30's bound: host time at V = 49,152 vs V = 2,048


def ratio_of(big: dict, small: dict) -> dict:
    step_big, step_small = big["verify_ms"] + big["draft_ms"], small["verify_ms"] + small["draft_ms"]
    return {"verify": big["verify_ms"] / small["verify_ms"],
            "draft": big["draft_ms"] / small["draft_ms"] if small["draft_ms"] > 0 else float("nan"),
            "step": step_big / step_small}


def summary(cells: list[dict], vocab: list[int]) -> list[dict]:
    """One row per (mix, B, k): both sides at every V and the largest/smallest V ratios."""
    groups: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for c in cells:
        groups[(c["mix"], c["batch"], c["k"])][c["vocab"]] = c
    rows = []
    for (mix, batch, k), by_v in groups.items():
        row = {"mix": mix, "batch": batch, "k": k,
               "verify_ms": {v: round(by_v[v]["verify_ms"], 4) for v in vocab},
               "draft_ms": {v: round(by_v[v]["draft_ms"], 4) for v in vocab}}
        if "intree_verify_ms" in by_v[vocab[0]]:
            row["intree_ms"] = {v: round(by_v[v]["intree_verify_ms"] + by_v[v]["intree_draft_ms"], 4)
                                for v in vocab}
            row["above_ms"] = {v: round(by_v[v]["verify_ms"] + by_v[v]["draft_ms"] - row["intree_ms"][v], 4)
                               for v in vocab}
        if len(vocab) > 1:
            row["ratio"] = {s: round(r, 3) for s, r in ratio_of(by_v[max(vocab)], by_v[min(vocab)]).items()}
        rows.append(row)
    return rows


def markdown(meta: dict, rows: list[dict], cells: list[dict], vocab: list[int]) -> str:
    m, git, s = meta["machine"], meta["git"], meta["settings"]
    lines = [
        "# Plugin host time per speculative step, by vocabulary size",
        "",
        f"Commit `{git.get('short')}`{' (dirty)' if git.get('dirty') else ''}; CPU {m['cpu_model']} "
        f"({m['logical_cpus']} logical); torch {meta['versions'].get('torch')}, "
        f"{s['torch_threads']} thread; logits {s['logits_dtype']}; prompt {s['prompt_len']} / "
        f"output {s['output_len']} tokens per request; median of >= {s['repeats']} steps.",
        "Excluded: the target's and the draft's model forwards. verify = vLLM's q gather + "
        "`exact_rejection_sample`; draft = `DraftSampler` + k `pick`s + `draft_probs.build`. "
        "x = ratio of the largest V to the smallest; step = verify + draft.",
        "",
    ]
    ratio_hdr = " verify x | draft x | step x | step <= 1.15 |" if len(vocab) > 1 else ""
    lines.append("| mix | B | k | " + " | ".join(f"verify ms V={v}" for v in vocab) + " | "
                 + " | ".join(f"draft ms V={v}" for v in vocab) + " |" + ratio_hdr)
    lines.append("|---" * (3 + 2 * len(vocab) + (4 if len(vocab) > 1 else 0)) + "|")
    for r in rows:
        cols = [r["mix"], str(r["batch"]), str(r["k"])]
        cols += [f"{r['verify_ms'][v]:.3f}" for v in vocab] + [f"{r['draft_ms'][v]:.3f}" for v in vocab]
        if "ratio" in r:
            x = r["ratio"]
            cols += [f"{x['verify']:.2f}", f"{x['draft']:.2f}", f"{x['step']:.2f}",
                     "yes" if x["step"] <= TARGET_RATIO else "**no**"]
        lines.append("| " + " | ".join(cols) + " |")
    if rows and "above_ms" in rows[0]:
        lines += intree_table(rows, vocab)
    labels = sorted({l for c in cells for l in c["components_ms"]})
    lines += ["", "## Breakdown", "",
              "Median ms per component; `other` = the side's total minus its probed parts; "
              "others' CPU = CPUs used by other processes while the cell ran (> 0.25: contended).",
              "",
              "| mix | B | k | V | " + " | ".join(labels) + " | others' CPU |",
              "|---" * (5 + len(labels)) + "|"]
    for c in cells:
        lines.append(f"| {c['mix']} | {c['batch']} | {c['k']} | {c['vocab']} | "
                     + " | ".join(f"{c['components_ms'].get(l, 0.0):.3f}" for l in labels)
                     + f" | {c['foreign_cpu_share']:.2f} |")
    if meta["probes_missing"]:
        lines += ["", f"Probes missing (components not split out): {', '.join(meta['probes_missing'])}"]
    return "\n".join(lines) + "\n"


def intree_table(rows: list[dict], vocab: list[int]) -> list[str]:
    """The plugin's step time beside vLLM's own host path on the same inputs, per V."""
    lines = ["", "## Beside vLLM's own path", "",
             "in-tree = vLLM's `RejectionSampler.forward` + its draft proposers' argmax per pass, "
             "on the same logits, drafts and q; plugin = verify + draft above; ratio = plugin / "
             "in-tree (below 1: the plugin's side is the cheaper).", "",
             "| mix | B | k | " + " | ".join(f"in-tree ms V={v}" for v in vocab) + " | "
             + " | ".join(f"plugin ms V={v}" for v in vocab) + " | "
             + " | ".join(f"ratio V={v}" for v in vocab) + " |",
             "|---" * (3 + 3 * len(vocab)) + "|"]
    for r in rows:
        step = {v: r["verify_ms"][v] + r["draft_ms"][v] for v in vocab}
        cols = [r["mix"], str(r["batch"]), str(r["k"])]
        cols += [f"{r['intree_ms'][v]:.3f}" for v in vocab] + [f"{step[v]:.3f}" for v in vocab]
        cols += [f"{step[v] / r['intree_ms'][v]:.2f}" for v in vocab]
        lines.append("| " + " | ".join(cols) + " |")
    return lines
