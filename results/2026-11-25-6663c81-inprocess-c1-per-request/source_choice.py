import sys, time, json
import vllm_specdec_plugin.planning as planning
log = []
orig = planning.choose_source
PHASE = {"p": -1}
def choose_source(candidates, min_gain, allow_none):
    out = orig(candidates, min_gain, allow_none)
    if PHASE["p"] == 1:
        log.append((PHASE["i"], {k: (round(v[0], 3), v[1], round(v[2], 3), round(v[3], 3)) for k, v in candidates.items()}, out))
    return out
planning.choose_source = choose_source
from vllm import LLM, SamplingParams
from benchmarks.workloads import load_prompt_set
from benchmarks.configs import expand
from vllm_specdec_plugin.fixtures import ensure_pair
cfg = {c.name: c for c in expand()}["plugin-hybrid-adaptive-k24"]
pair = ensure_pair("bench")
llm = LLM(model=str(pair.target), dtype="float32", max_model_len=1024, seed=0,
          speculative_config=cfg.speculative_config(str(pair.draft)))
sp = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
llm.generate(load_prompt_set("general")[:2], sp, use_tqdm=False)
for p_ in (0, 1):
    PHASE["p"] = p_
    for i, p in enumerate(load_prompt_set("mixed")):
        PHASE["i"] = i
        llm.generate([p], sp, use_tqdm=False)
for row in log:
    if row[0] in (0, 1):
        print("WHY", row)
