"""One ``vllm serve`` process of the serving benchmark, and what it reports.

``Server`` starts a configuration's ``vllm serve`` (VLLM_PLUGINS as ``configs`` says),
waits for ``/health``, reads its process tree's CPU seconds by role (API server,
EngineCore, worker) and scrapes the ``/metrics`` series below, whose deltas over a
cell give that cell's acceptance, draft cost, decode steps and step-plan cuts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.configs import BenchConfig
from specdec_testing import stop_process_group

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# /metrics series summed over label sets before and after each cell; their deltas give
# the cell's acceptance (vLLM's counters, every method) and draft cost (the plugin's).
SPEC_SERIES = {"vllm:spec_decode_num_drafts_total": "drafts",
               "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
               "vllm:spec_decode_num_accepted_tokens_total": "accepted",
               "specdec_draft_step_seconds_sum": "draft_s",
               "specdec_draft_step_seconds_count": "draft_rounds"}
# vLLM's request latency histograms (every method): their sums and counts give each
# cell's mean time in the waiting queue (arrival to first schedule), in prefill (first
# schedule to first token) and to the first token as the engine sees it.
LATENCY_SERIES = {"vllm:request_queue_time_seconds_sum": "queue_s",
                  "vllm:request_queue_time_seconds_count": "queued",
                  "vllm:request_prefill_time_seconds_sum": "prefill_s",
                  "vllm:request_prefill_time_seconds_count": "prefilled",
                  "vllm:time_to_first_token_seconds_sum": "ttft_s",
                  "vllm:time_to_first_token_seconds_count": "first_tokens"}
# The plugin's shadow n-gram drafts (label outcome="drafted"|"accepted"): "shadow_<outcome>".
SHADOW_SERIES = "specdec_shadow_draft_tokens_total"
# The plugin's step plan (label outcome="kept"|"cut"): "plan_<outcome>", draft tokens of
# steps that carried a prompt, verified or cut before verification.
PLAN_SERIES = "specdec_step_plan_verify_tokens_total"
PLAN_DEFERRED_SERIES = "specdec_step_plan_prompts_deferred_total"
# The plugin's verified and accepted draft tokens by source (label source="draft"|"ngram"):
# "<drafted|accepted>_<source>", each cell's acceptance per draft source.
SOURCE_SERIES = {"specdec_draft_tokens_total": "drafted",
                 "specdec_accepted_tokens_total": "accepted"}
# the plugin's request rounds without drafts, by reason (metrics.NO_DRAFT_REASONS)
NO_DRAFT_SERIES = "specdec_no_draft_rounds_total"
# The plugin's decode steps by kind (labels kind="verify"|"plain"): "<kind>_<field>".
# Their means show what a verifying step costs over a plain one at the cell's load.
STEP_SERIES = {"specdec_target_step_seconds_sum": "step_s",
               "specdec_target_step_seconds_count": "steps",
               "specdec_emitted_tokens_total": "emitted"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One ``vllm serve`` process for one configuration."""

    def __init__(self, config: BenchConfig, target: str, draft: str | None, args: argparse.Namespace,
                 log: Path):
        self.config, self.port = config, _free_port()
        self.name = config.name
        cmd = [str(BIN / "vllm"), "serve", target, "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", self.name, "--max-model-len", str(args.max_model_len),
               "--dtype", args.dtype, "--seed", "0"]
        if args.eager:
            cmd.append("--enforce-eager")
        if getattr(args, "no_chunked_prefill", False):
            cmd.append("--no-enable-chunked-prefill")
        spec = config.speculative_config(draft)
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        # KV cache size by flag: VLLM_CPU_KVCACHE_SPACE takes whole GiB only, and it
        # overrides the flag when set (vLLM's workers reject it empty), so it is unset.
        cmd += ["--kv-cache-memory-bytes", str(int(args.kv_cache_gib * 2**30))]
        env = {**os.environ, **SERVER_ENV, **config.engine_env(REPO)}
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        self.log = open(log, "w")
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def pids(self) -> set[int]:
        """The server's process tree (API server, engine core), for the foreign-load meter."""
        out, todo = set(), [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.add(pid)
            try:
                for t in Path(f"/proc/{pid}/task").iterdir():
                    children = (t / "children").read_text().split()
                    todo += [int(c) for c in children if int(c) not in out]
            except OSError:
                pass
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) so far of the API server process, the engine
        core, its model-runner worker, and any other process of the server's tree."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {"api": 0.0, "engine": 0.0, "worker": 0.0, "other": 0.0}
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                title = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue   # exited meanwhile
            role = ("api" if pid == self.proc.pid else "engine" if b"EngineCore" in title
                    else "worker" if b"Worker" in title else "other")
            out[role] += (int(fields[11]) + int(fields[12])) / tick   # utime, stime
        return out

    def wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: vllm serve exited {self.proc.returncode} "
                                   f"(log: {self.log.name})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise TimeoutError(f"{self.name}: not healthy after {timeout:.0f} s (log: {self.log.name})")

    def stop(self) -> None:
        stop_process_group(self.proc, signal.SIGINT, 60)
        self.log.close()

    def spec_counters(self) -> dict[str, float]:
        """SPEC_SERIES, LATENCY_SERIES, STEP_SERIES, SHADOW_SERIES and the PLAN_ series from the
        server's /metrics (0 for a series it does not export), and the plugin's request
        rounds without drafts by reason (``no_draft_<reason>``, where exported)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            text = r.read().decode()
        series = {**SPEC_SERIES, **LATENCY_SERIES}
        out = dict.fromkeys(series.values(), 0.0)
        out.update({f"{kind}_{f}": 0.0 for kind in ("verify", "plain") for f in STEP_SERIES.values()})
        out.update(shadow_drafted=0.0, shadow_accepted=0.0, plan_kept=0.0, plan_cut=0.0,
                   plan_deferred=0.0)
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in series:
                out[series[name]] += float(line.rsplit(" ", 1)[1])
            elif name in STEP_SERIES:
                kind = "verify" if 'kind="verify"' in line else "plain"
                out[f"{kind}_{STEP_SERIES[name]}"] += float(line.rsplit(" ", 1)[1])
            elif name == SHADOW_SERIES:
                outcome = "accepted" if 'outcome="accepted"' in line else "drafted"
                out[f"shadow_{outcome}"] += float(line.rsplit(" ", 1)[1])
            elif name == PLAN_SERIES:
                outcome = "cut" if 'outcome="cut"' in line else "kept"
                out[f"plan_{outcome}"] += float(line.rsplit(" ", 1)[1])
            elif name == PLAN_DEFERRED_SERIES:
                out["plan_deferred"] += float(line.rsplit(" ", 1)[1])
            elif name in SOURCE_SERIES and 'source="' in line:
                source = line.split('source="', 1)[1].split('"', 1)[0]
                key = f"{SOURCE_SERIES[name]}_{source}"
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
            elif name == NO_DRAFT_SERIES and 'reason="' in line:
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                key = f"no_draft_{reason}"
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return out
