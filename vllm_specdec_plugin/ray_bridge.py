"""Mirror the plugin's ``specdec_*`` metrics into Ray's metrics export (Ray Serve replicas).

Why: under ``ray.serve.llm`` the only Prometheus endpoint is Ray's metrics export port,
  and Ray exports only what a Ray process records through ``ray.util.metrics`` (vLLM's
  own metrics get there through its ``RayPrometheusStatLogger``, as ``ray_vllm_*``). The
  ``specdec_*`` metrics are recorded with prometheus_client in the vLLM worker, on CPU a
  plain subprocess of the replica (replica -> EngineCore -> worker), not a Ray worker;
  without ``PROMETHEUS_MULTIPROC_DIR`` they stay in its memory.
How: ``maybe_start()`` runs in the replica process from the ``create_engine_config``
  wrapper (``compat/engine_config.py``; only when our proposer is configured), before
  vLLM spawns the engine. Inside a Ray Serve replica, and only if
  ``PROMETHEUS_MULTIPROC_DIR`` is unset, it exports a private folder as that variable
  (the EngineCore and worker spawned afterwards inherit it) and starts a daemon thread
  that every ``INTERVAL_S`` aggregates the folder (``MultiProcessCollector``) and sets
  one ``ray.util.metrics.Gauge`` per ``specdec_*`` sample name (counters' ``_total``,
  histograms' ``_bucket``/``_sum``/``_count``, gauges), with the sample's labels plus
  ``ReplicaId`` (the label vLLM's Ray metrics carry). Ray exports them as
  ``ray_specdec_*``; counters become gauges of the cumulative value, so ``rate()`` works.
  Seen with Ray 2.60 (OpenTelemetry exporter): a gauge ``specdec_x_total`` is exported as
  ``ray_specdec_x_total`` (TYPE gauge, no suffix added or stripped) with its tags as
  labels (``le`` included) plus Ray's own; a value of 0 is exported. Names must match
  ``[a-zA-Z_][a-zA-Z0-9_]*`` (others are discarded with a warning; one with ``:`` only
  warns but is not exported), and every tag key needs a value on ``set`` (ValueError
  otherwise): hence one gauge per sample name.
Limits: a GPU deployment uses vLLM's Ray executor (the worker is a Ray actor that does
  not inherit the replica's environment) and builds the engine config in a separate
  Ray task, so ``maybe_start()`` returns False there; not covered. Outside Ray Serve it
  returns False and changes nothing.
Upstream: a hook for stat-logger plugins in worker processes, or Ray exporting a
  replica's prometheus_client multiprocess folder.
Remove when: worker-side plugin metrics reach Ray's exporter without a bridge.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Any, Callable, Iterable

logger = logging.getLogger("vllm.specdec_plugin")

PREFIX = "specdec_"
REPLICA_LABEL = "ReplicaId"
INTERVAL_S = 2.0
_SKIP_SUFFIXES = ("_created",)  # timestamps, not values (multiprocess mode writes none)

_bridge: "Bridge | None" = None


def maybe_start() -> bool:
    """Start the bridge if this process is a Ray Serve replica; True if it runs (idempotent)."""
    global _bridge
    if _bridge is not None:
        return True
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return False  # someone else collects the folder (e.g. our `vllm` launcher)
    replica_id = _replica_id()
    if replica_id is None:
        return False
    path = tempfile.mkdtemp(prefix="specdec-prometheus-", dir=_session_dir())
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    _bridge = Bridge(path, replica_id, _ray_gauge)
    threading.Thread(target=_bridge.run_forever, name="specdec-ray-metrics", daemon=True).start()
    logger.info("specdec: mirroring specdec_* metrics from %s to Ray metrics (ReplicaId %s)",
                path, replica_id)
    return True


def _replica_id() -> str | None:
    # A Ray worker has imported and initialised ray long before vLLM builds a config;
    # checking first keeps `import ray` out of every other process.
    ray = sys.modules.get("ray")
    if ray is None or not getattr(ray, "is_initialized", lambda: False)():
        return None
    try:
        from ray import serve
    except Exception:  # broken ray install: not a replica we can serve metrics from
        return None
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # RayServeException outside a replica
        return None


def _session_dir() -> str | None:
    """Ray's session folder (removed with the cluster's temporary files), else None (the
    system default). Ray 2.60 has no public accessor: ``ray._private``'s, on any failure
    None (upstream: a session-dir accessor in ``ray.runtime_context``)."""
    try:
        import ray._private.worker as worker

        path = worker._global_node.get_session_dir_path() or None
    except Exception:  # not in a Ray worker, or Ray's internals moved
        return None
    return path if path and os.path.isdir(path) else None


def _ray_gauge(name: str, description: str, tag_keys: tuple[str, ...]) -> Any:
    from ray.util.metrics import Gauge

    return Gauge(name, description=description, tag_keys=tag_keys)


def collect(path: str) -> Iterable[tuple[str, str, dict[str, str], float]]:
    """(sample name, family help, labels, value) of every ``specdec_*`` sample in ``path``."""
    from prometheus_client.multiprocess import MultiProcessCollector

    for family in MultiProcessCollector(None, path=path).collect():
        for s in family.samples:
            if s.name.startswith(PREFIX) and not s.name.endswith(_SKIP_SUFFIXES):
                yield s.name, family.documentation, dict(s.labels), float(s.value)


class Bridge:
    """Copies the samples of one multiprocess folder into gauges made by ``make_gauge``.

    ``make_gauge(name, description, tag_keys)`` returns an object with
    ``set(value, tags=dict)`` (``ray.util.metrics.Gauge``; a fake in unit tests).
    """

    def __init__(self, path: str, replica_id: str,
                 make_gauge: Callable[[str, str, tuple[str, ...]], Any]):
        self.path, self.replica_id, self._make_gauge = path, replica_id, make_gauge
        self._gauges: dict[str, tuple[Any, tuple[str, ...]]] = {}
        self._warned: set[str] = set()
        self._stop = threading.Event()

    def sync(self) -> int:
        """One pass: set every gauge from the folder; returns the number of samples set."""
        n = 0
        for name, doc, labels, value in collect(self.path):
            labels[REPLICA_LABEL] = self.replica_id
            entry = self._gauges.get(name)
            if entry is None:
                keys = tuple(sorted(labels))
                entry = self._gauges[name] = (self._make_gauge(name, doc, keys), keys)
            gauge, keys = entry
            if set(labels) != set(keys):  # same name, other label set: cannot be one gauge
                if name not in self._warned:
                    self._warned.add(name)
                    logger.warning("specdec: %s labels %s differ from %s; not mirrored",
                                   name, sorted(labels), list(keys))
                continue
            gauge.set(value, tags=labels)
            n += 1
        return n

    def run_forever(self, interval_s: float = INTERVAL_S) -> None:
        failed = False
        while not self._stop.wait(interval_s):
            try:
                self.sync()
                failed = False
            except Exception:  # never kill the thread; say so once per failure streak
                if not failed:
                    logger.warning("specdec: mirroring metrics to Ray failed", exc_info=True)
                failed = True

    def stop(self) -> None:
        self._stop.set()
