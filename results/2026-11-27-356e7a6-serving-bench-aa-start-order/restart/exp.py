"""Restart experiment: is the first-started server slow by start order?"""
import argparse, sys, time, json
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks.configs import expand
from benchmarks.serving_client import Load, bench, write_dataset
from benchmarks.serving_server import Server
from specdec_fixtures import ensure_pair

out = Path("/tmp/rx"); pair = ensure_pair("bench")
args = argparse.Namespace(max_model_len=1024, dtype="float32", eager=False, output_len=64,
                          temperature=0.0, seed=0, cell_timeout=900)
cfg = {c.name: c for c in expand()}
ds = out / "mixed.jsonl"; write_dataset(ds)
def start(name):
    s = Server(cfg[name], str(pair.target), str(pair.draft), args, out / f"{name}-{time.time():.0f}.log")
    s.wait_ready(900); bench(s, "mixed", Load("max_concurrency", 1), 2, args, ds, out / "w.json", str(pair.target))
    return s
def meas(s, tag):
    c = bench(s, "mixed", Load("max_concurrency", 8), 32, args, ds, out / "r.json", str(pair.target))
    print(f"{tag} {s.name}: {c['output_throughput']:.1f} tok/s TPOT p50 {c['median_tpot_ms']:.1f}", flush=True)
order = sys.argv[1].split(",")
servers = {n: start(n) for n in order}
print("started", order, flush=True)
for r in range(2):
    for n in order: meas(servers[n], f"phase1 r{r}")
if len(sys.argv) > 2:
    for r in range(1):
        for n in order: meas(servers[n], f"phase1b r{r}")
    for s in servers.values(): s.stop()
    sys.exit()
first = order[0]
servers[first].stop(); time.sleep(5)
servers[first] = start(first)
print("restarted", first, flush=True)
for r in range(2):
    for n in order[::-1]: meas(servers[n], f"phase2 r{r}")
for s in servers.values(): s.stop()
