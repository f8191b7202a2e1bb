"""One benchmark engine: a ``specdec_testing.engine_worker`` subprocess.

Every configuration runs the same way: in-process engine core
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the worker can read the proposer and time
the model runner's steps), the same LLM arguments, and a VLLM_PLUGINS value that
loads our plugin only where it is the method under test.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.configs import PLUGINS_SPECDEC, BenchConfig
from benchmarks.machine import REPO

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",        # GiB of KV cache per engine
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

WORKER_MODULE = "specdec_testing.engine_worker"


class EngineError(RuntimeError):
    pass


def _proc_status(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def thread_affinities(pid: int) -> dict[str, int]:
    """Cpus_allowed_list -> number of threads of ``pid`` with that mask."""
    out: dict[str, int] = {}
    try:
        for t in Path(f"/proc/{pid}/task").iterdir():
            for line in (t / "status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    mask = line.split(":", 1)[1].strip()
                    out[mask] = out.get(mask, 0) + 1
    except OSError:
        pass
    return out


class Engine:
    """A live engine worker. ``start`` returns once the engine is ready."""

    def __init__(self, config: BenchConfig, engine_kwargs: dict, log_path: Path,
                 extra_env: dict | None = None, worker_module: str = WORKER_MODULE,
                 worker_args: tuple[str, ...] = (), cpus: list[int] | None = None,
                 threads: int | None = None) -> None:
        self.config = config
        self.engine_kwargs = engine_kwargs
        self.log_path = log_path
        self.trace_path = log_path.with_suffix(".register.jsonl")
        self.env = {**os.environ, **ENGINE_ENV, **(extra_env or {}),
                    **config.engine_env(REPO),
                    "SPECDEC_REGISTER_TRACE": str(self.trace_path)}
        # the engine worker module (specdec_testing) lives at the repo root
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO), self.env.get("PYTHONPATH")]))
        if threads is not None:
            self.env["OMP_NUM_THREADS"] = str(threads)
        self.cpus = cpus
        self.worker_module, self.worker_args = worker_module, worker_args
        self.proc: subprocess.Popen | None = None
        self.ready: dict = {}
        self.startup_s = 0.0
        self._lines: queue.Queue = queue.Queue()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _reader(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise EngineError(f"{self.config.name}: no answer within {timeout:.0f} s; "
                              f"log: {self.log_path}") from None
        if line is None:
            rc = self.proc.wait(timeout=30) if self.proc else None
            raise EngineError(f"{self.config.name}: engine exited (rc={rc}); last log lines:\n"
                              + self.log_tail())
        return json.loads(line)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _pin(self) -> None:
        # In the child before exec: every thread the engine creates inherits the mask.
        # (In-process engines get no binding from vLLM: its OMPProcessManager binds
        # only workers spawned by the multiprocess executor.)
        os.sched_setaffinity(0, self.cpus)

    def start(self, timeout: float = 900.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.trace_path.unlink(missing_ok=True)
        log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.worker_module, *self.worker_args,
             json.dumps(self.engine_kwargs)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=self.env,
            preexec_fn=self._pin if self.cpus else None)
        log.close()
        threading.Thread(target=self._reader, daemon=True).start()
        self.ready = self._read(timeout)
        self.startup_s = time.perf_counter() - t0
        if not self.ready.get("ready"):
            raise EngineError(f"{self.config.name}: unexpected first line {self.ready}")
        self._check_plugin_loading()

    def plugin_registrations(self) -> int:
        try:
            return len(self.trace_path.read_text().splitlines())
        except OSError:
            return 0

    def _check_plugin_loading(self) -> None:
        """Our plugin must be loaded exactly where it is under test (VLLM_PLUGINS)."""
        n = self.plugin_registrations()
        want = self.config.vllm_plugins == PLUGINS_SPECDEC
        if want != (n > 0):
            self.close()
            raise EngineError(f"{self.config.name}: VLLM_PLUGINS={self.config.vllm_plugins!r} "
                              f"but the plugin registered {n} time(s)")

    def generate(self, prompts: list[list[int]], params: dict | list[dict], batch_size: int,
                 timeout: float = 3600.0) -> dict:
        if not self.proc or self.proc.poll() is not None:
            raise EngineError(f"{self.config.name}: engine is not running")
        self.proc.stdin.write(json.dumps({"op": "generate", "prompts": prompts, "params": params,
                                          "batch_size": batch_size, "timers": True}) + "\n")
        self.proc.stdin.flush()
        reply = self._read(timeout)
        if not reply.get("ok"):
            raise EngineError(f"{self.config.name}: {reply}")
        return reply

    def memory(self) -> dict:
        pid = self.pid
        if pid is None:
            return {}
        return {"rss_gib": round((_proc_status(pid, "VmRSS") or 0) / 2**30, 3),
                "peak_rss_gib": round((_proc_status(pid, "VmHWM") or 0) / 2**30, 3)}

    def close(self, timeout: float = 120.0) -> None:
        p = self.proc
        if p is None:
            return
        try:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
        except OSError:
            pass
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.terminate()  # our own child, by pid
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.proc = None
