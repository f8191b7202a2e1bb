"""Profile one plugin (or nospec) smol server's worker under ShareGPT chat at c = 64."""
import argparse, json, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "/work/main")
from benchmarks.configs import expand
from benchmarks.serving_client import Load, bench, write_dataset
from benchmarks.serving_server import Server
from benchmarks.workloads import sharegpt_pool
from specdec_fixtures import ensure_pair

name, conc = sys.argv[1], int(sys.argv[2])
out = Path("/tmp/rx"); pair = ensure_pair("smol")
args = argparse.Namespace(max_model_len=2048, dtype="bfloat16", eager=False, output_len=128,
                          temperature=0.0, seed=0, cell_timeout=900)
cfg = {c.name: c for c in expand()}
chats = sharegpt_pool(str(pair.target), 128, 2048, 0)
ds = out / "mixed.jsonl"; write_dataset(ds)
s = Server(cfg[name], str(pair.target), str(pair.draft), args, out / f"prof-{name}.log")
s.wait_ready(900)
bench(s, "mixed", Load("max_concurrency", 1), 2, args, ds, out / "w.json", str(pair.target))
data = out / "cell.json"; data.write_text(json.dumps(chats[-4 * conc:]))
spies = []
for role in (b"Worker", b"EngineCore"):
    pid = [p for p in s.pids() if role in Path(f"/proc/{p}/cmdline").read_bytes()][0]
    spies.append(subprocess.Popen([sys.argv[3], "record", "-p", str(pid), "-d", "50", "-r", "50",
                                   "-f", "raw", "-o", str(out / f"prof2-{name}-{role.decode()}.txt"),
                                   "--nonblocking"]))
c = bench(s, "sharegpt", Load("max_concurrency", conc), 4 * conc, args, data, out / "r.json", str(pair.target))
print(name, f"{c['output_throughput']:.1f} tok/s TPOT p50 {c['median_tpot_ms']:.1f}", flush=True)
[p.wait() for p in spies]; s.stop()
