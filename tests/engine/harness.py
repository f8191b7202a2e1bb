"""Start a real vLLM engine in a subprocess, one at a time, and collect results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class EngineFailed(RuntimeError):
    def __init__(self, rc: int, output: str):
        super().__init__(f"engine exited {rc}:\n{output[-4000:]}")
        self.rc, self.output = rc, output


def engine_kwargs(target: Path, spec: dict | None = None, **kw) -> dict:
    args = dict(model=str(target), dtype="float32", max_model_len=512, enforce_eager=True,
                max_num_seqs=16, seed=0, disable_log_stats=False)
    if spec is not None:
        args["speculative_config"] = spec
    args.update(kw)
    return args


def plugin_spec(draft: Path, k: int, **opts) -> dict:
    """The plugin with ``draft`` at k: the draft model at a fixed k unless ``opts`` say
    otherwise (every round drafts k, so exactness tests verify every draft path)."""
    opts = {"method": "draft", "adaptive": False, **opts}
    return {"method": "custom_class", "model": "vllm_specdec_plugin.DraftModelProposer",
            "num_speculative_tokens": k,
            "draft_load_config": {"model_loader_extra_config": {"specdec": {"draft_model": str(draft), **opts}}}}


def run_engine(engine: dict, jobs: list[dict], env: dict | None = None, timeout: int = 900) -> dict:
    with tempfile.TemporaryDirectory() as d:
        job, out = Path(d, "job.json"), Path(d, "out.json")
        job.write_text(json.dumps({"engine": engine, "jobs": jobs}))
        full_env = {**os.environ, **ENGINE_ENV, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(  # specdec_testing lives at the repo root
            filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
        p = subprocess.run([sys.executable, "-m", "specdec_testing.engine_job", str(job), str(out)],
                           env=full_env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0 or not out.exists():
            raise EngineFailed(p.returncode, p.stdout + p.stderr)
        return json.loads(out.read_text())
