import sys, time, json, os
from vllm import LLM, SamplingParams
from benchmarks.workloads import load_prompt_set
from benchmarks.configs import expand
from vllm_specdec_plugin.fixtures import ensure_pair
name = sys.argv[1]
cfg = {c.name: c for c in expand()}[name]
pair = ensure_pair("bench")
spec = cfg.speculative_config(str(pair.draft))
llm = LLM(model=str(pair.target), dtype="float32", max_model_len=1024, seed=0,
          speculative_config=spec, disable_log_stats=False)
prompts = load_prompt_set("mixed")
sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
def counters():
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value"):
            out[m.name.split("num_")[1]] = out.get(m.name.split("num_")[1], 0) + m.value
    return out
warm = load_prompt_set("general")[:2]
llm.generate(warm, sp, use_tqdm=False)
rows = []
for rep in range(2):
    for i, p in enumerate(prompts):
        c0 = counters(); t = time.perf_counter()
        o = llm.generate([p], sp, use_tqdm=False)[0]
        dt = time.perf_counter() - t; c1 = counters()
        d = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
        rows.append(dict(rep=rep, i=i, s=round(dt, 3), **d))
        print(name, rep, i, round(dt, 3), d, flush=True)
json.dump(rows, open(f"/tmp/s12/perreq-{name}.json", "w"))
