import sys, time, collections, statistics
from vllm.v1.worker import gpu_model_runner as gmr
rec = collections.defaultdict(list)
orig = gmr.GPUModelRunner._model_forward
def _model_forward(self, input_ids=None, positions=None, *a, **kw):
    t = time.perf_counter(); out = orig(self, input_ids, positions, *a, **kw)
    n = (input_ids if input_ids is not None else kw.get("inputs_embeds")).shape[0]
    rec[n].append(time.perf_counter() - t); return out
gmr.GPUModelRunner._model_forward = _model_forward
from vllm import LLM, SamplingParams
from benchmarks.workloads import load_prompt_set
from benchmarks.configs import expand
from vllm_specdec_plugin.fixtures import ensure_pair
name = sys.argv[1]
cfg = {c.name: c for c in expand()}[name]
pair = ensure_pair("bench")
llm = LLM(model=str(pair.target), dtype="float32", max_model_len=1024, seed=0,
          speculative_config=cfg.speculative_config(str(pair.draft)) if cfg.k else None, disable_log_stats=False)
sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
llm.generate(load_prompt_set("general")[:2], sp, use_tqdm=False)
rec.clear()
t = time.perf_counter()
for p in load_prompt_set("mixed"):
    llm.generate([p], sp, use_tqdm=False)
print(name, "fresh pass", round(time.perf_counter() - t, 3))
for n in sorted(rec):
    v = rec[n]
    if n <= 40:
        print(name, "n", n, "calls", len(v), "median ms", round(1000 * statistics.median(v), 1), "mean", round(1000 * statistics.mean(v), 1))
print(name, "big", sum(len(v) for n, v in rec.items() if n > 40), round(sum(sum(v) for n, v in rec.items() if n > 40), 2), "s")
