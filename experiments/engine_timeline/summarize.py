"""Where each benchmark cell's wall time goes, per server log with ``timeline`` lines
(``sitecustomize.py``): engine steps split at idle gaps (> 1 s: the server between
cells), and per busy stretch the sums, in seconds, of the engine loop between steps,
schedule, the wait for the worker (step less schedule and update), update_from_output
and post_step; the worker's forward (execute_model) and sample_tokens (sampling and,
with a proposer, propose()); the steps that carried a new prompt; and the stalls:
``sample_tokens`` or post_step calls over ``STALL_MS`` in a step of more than one row
(where a proposer's draft round or deferred drafting holds the whole batch).

    python experiments/engine_timeline/summarize.py results/RUN/serve-*-rep0.log [...]
"""

from __future__ import annotations

import re
import sys

E = re.compile(r"timeline E t (\S+) loop (\S+) sched (\S+) exec \S+ update (\S+) step (\S+) "
               r"post (\S+) \| tok (\d+) rows (\d+) new (\d+) spec (\d+)")
W = re.compile(r"timeline W fwd (\S+) sample (\S+)")
IDLE_MS = 1000.0
STALL_MS = 50.0  # several plain steps at chat c = 8 on the smol pair (~25-50 ms a step)


def read(path: str) -> tuple[list[dict], list[tuple[float, float]]]:
    eng, wrk = [], []
    for line in open(path, errors="replace"):
        if (m := E.search(line)):
            t, loop, sched, update, step, post = map(float, m.groups()[:6])
            tok, rows, new, spec = map(int, m.groups()[6:])
            eng.append(dict(t=t, loop=loop, sched=sched, update=update, step=step, post=post,
                            tok=tok, rows=rows, new=new, spec=spec))
        elif (m := W.search(line)):
            wrk.append((float(m.group(1)), float(m.group(2))))
    return eng, wrk


def stretches(eng: list[dict]) -> list[list[dict]]:
    out: list[list[dict]] = [[]]
    for s in eng:
        if s["loop"] >= IDLE_MS and out[-1]:
            out.append([])
        out[-1].append(s)
    return [p for p in out if p]


def read_paired(path: str) -> tuple[list[dict], bool]:
    """The engine steps of ``read``, each with its worker call's ``fwd`` and ``sample``
    (ms; 0 for every step when the worker's lines do not pair with the engine's, step
    by step), and whether they paired."""
    eng, wrk = read(path)
    paired = len(wrk) == len(eng)
    for i, s in enumerate(eng):
        s["fwd"], s["sample"] = wrk[i] if paired else (0.0, 0.0)
    return eng, paired


def main(paths: list[str]) -> None:
    for path in paths:
        eng, paired = read_paired(path)
        if not paired:
            print(f"{path}: engine and worker lines unpaired (no fwd or sample)")
        name = path.rsplit("/", 1)[-1]
        for part in stretches(eng)[1:]:  # the first stretch is the server's warm-up
            part[0] = {**part[0], "loop": 0.0}  # its loop time is the idle wait before it
            S = lambda key, rows=part: sum(s[key] for s in rows) / 1e3  # noqa: E731
            wait = S("step") - S("sched") - S("update")
            new = [s for s in part if s["new"]]
            print(f"{name}: {len(part)} steps up to {max(s['rows'] for s in part)} rows, "
                  f"{part[-1]['t'] - part[0]['t']:.2f} s: loop {S('loop'):.2f} sched "
                  f"{S('sched'):.2f} wait {wait:.2f} (fwd {S('fwd'):.2f} sample "
                  f"{S('sample'):.2f} other {wait - S('fwd') - S('sample'):.2f}) update "
                  f"{S('update'):.2f} post {S('post'):.2f} | with a prompt {len(new)} steps, "
                  f"fwd {S('fwd', new):.2f} sample {S('sample', new):.2f} | spec tokens "
                  f"{sum(s['spec'] for s in part)}")
            busy = [s for s in part if s["rows"] > 1]
            stalls = [f"{key} {s[key]:.0f}" for s in busy for key in ("sample", "post")
                      if s[key] > STALL_MS]
            print(f"    stalls (> {STALL_MS:.0f} ms at > 1 row): {len(stalls)}"
                  + (f": {', '.join(stalls)} ms" if stalls else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
