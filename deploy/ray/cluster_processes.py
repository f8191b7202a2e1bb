"""The processes and ports of one Ray cluster on this machine, found without ``ray stop``.

"This cluster's processes" are those whose command line names its temp dir (Ray's own
daemons), or whose environment carries ``SPECDEC_RAY_CLUSTER=<temp dir>`` (set for
``ray start``, so inherited by every Ray worker, replica, vLLM EngineCore and worker),
and all their descendants. ``ray stop`` would kill every Ray process of the user on the
machine, other clusters included. Used by ``cluster.py`` (up/down/status) and its test.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Callable

MARKER = "SPECDEC_RAY_CLUSTER"   # environment variable naming the cluster's temp dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def owned_processes(temp_dir: str | Path) -> list:
    """Live (non-zombie) processes of the cluster under ``temp_dir``, with descendants."""
    import psutil

    temp_dir = str(temp_dir)
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if p.pid in me or p.uids().real != os.getuid():
                continue
            if temp_dir in " ".join(p.cmdline()) or p.environ().get(MARKER) == temp_dir:
                found[p.pid] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for p in list(found.values()):
        try:
            for c in p.children(recursive=True):
                if c.pid not in me:
                    found.setdefault(c.pid, c)
        except psutil.Error:
            pass
    alive = []
    for p in found.values():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return sorted(alive, key=lambda p: p.pid)


def describe(p) -> str:
    try:
        title = " ".join(p.cmdline())[:100] or p.name()
        return f"{p.pid} {title}"
    except Exception:
        return str(p.pid)


def stop_processes(temp_dir: Path, say: Callable[[str], None], grace_s: float = 15.0) -> list[str]:
    """SIGTERM, then SIGKILL, every process of the cluster; returns what is left."""
    import psutil

    for attempt in range(3):
        procs = owned_processes(temp_dir)
        if not procs:
            return []
        sig = signal.SIGTERM if attempt == 0 else signal.SIGKILL
        say(f"{'stopping' if sig == signal.SIGTERM else 'killing'} {len(procs)} processes")
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s if sig == signal.SIGTERM else 5)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=5)
        time.sleep(1)  # a dying raylet may still have forked a worker
    return [describe(p) for p in owned_processes(temp_dir)]
