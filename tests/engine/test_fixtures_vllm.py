"""vLLM (CPU) loads the ci fixture target and decodes greedily.

vLLM spawns processes, so the engine runs in a child interpreter (the script
below), never inside pytest.  Float32 on both sides: the 8 greedy tokens vLLM
produces must equal transformers' greedy tokens for the same prompt, which checks
that vLLM reads the config (GQA, RoPE, rms_norm_eps) the way the builder meant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
PROMPTS = ["import os\n\ndef main(argv):\n", "class Queue:\n    def __init__(self"]
NEW_TOKENS = 8

_SCRIPT = r"""
import json, sys
from vllm import LLM, SamplingParams

args = json.loads(sys.argv[1])
llm = LLM(model=args["model"], dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
sp = SamplingParams(temperature=0.0, max_tokens=args["new_tokens"], ignore_eos=True)
outs = llm.generate(args["prompts"], sp)
res = [{"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids),
        "text": o.outputs[0].text} for o in outs]
with open(args["out"], "w") as f:
    json.dump(res, f)
"""


@pytest.fixture(scope="module")
def ci_fixture():
    from specdec_fixtures import ensure_pair

    return ensure_pair("ci")


def test_vllm_loads_ci_target_and_decodes_greedily(ci_fixture, tmp_path):
    out = tmp_path / "out.json"
    args = {"model": str(ci_fixture.target), "prompts": PROMPTS, "new_tokens": NEW_TOKENS,
            "out": str(out)}
    p = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(args)],
                       env={**os.environ, **ENGINE_ENV}, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and out.exists(), (p.stdout + p.stderr)[-4000:]
    res = json.loads(out.read_text())
    assert len(res) == len(PROMPTS)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ci_fixture.target))
    model = AutoModelForCausalLM.from_pretrained(str(ci_fixture.target), dtype=torch.float32)
    bos = ci_fixture.manifest["tokenizer"]["bos_token_id"]
    for prompt, r in zip(PROMPTS, res):
        assert len(r["token_ids"]) == NEW_TOKENS
        ids = tok(prompt).input_ids
        assert ids[0] == bos
        assert r["prompt_token_ids"] == ids  # vLLM tokenises like transformers (bos added)
        with torch.inference_mode():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS)[0, len(ids):].tolist()
        assert r["token_ids"] == ref, (prompt, r["text"], tok.decode(ref))
