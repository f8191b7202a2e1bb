"""Start `vllm serve` (the installed `vllm` script) on 127.0.0.1 for a test; stop it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness import ENGINE_ENV

from specdec_testing import stop_process_group


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, target: Path, spec: dict | None, extra_args=(), env=None, log=None,
                 name: str = "fixture"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        vllm = Path(sys.executable).parent / "vllm"
        cmd = [str(vllm), "serve", str(target), "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
               "--served-model-name", name, *extra_args]
        if spec is not None:
            cmd += ["--speculative-config", json.dumps(spec)]
        self.log = open(log or os.devnull, "w")
        self.proc = subprocess.Popen(cmd, env={**os.environ, **ENGINE_ENV, **(env or {})},
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        raise TimeoutError("vllm serve did not become healthy")

    def post(self, path, body, timeout=120):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # keep the server's explanation in the failure
            raise AssertionError(f"{path} -> {e.code}: {e.read().decode()[:2000]}") from None

    def get(self, path, timeout=30) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read().decode()

    def stop(self):
        stop_process_group(self.proc, signal.SIGTERM, 30)
        self.log.close()
