"""Ray's session folder, for the Ray Serve metrics bridge.

Why: the bridge keeps a replica's prometheus multiprocess files inside Ray's session
  folder, so they are removed with the cluster's temporary files. Ray 2.60 has no
  public accessor for that folder.
How: ``ray._private.worker._global_node.get_session_dir_path()``; None on any
  failure (the bridge then uses the system temp folder).
Upstream: a public session-dir accessor in ``ray.runtime_context``.
Remove when: Ray offers one, or changes the private path (the fallback covers it).
"""

from __future__ import annotations


def session_dir() -> str | None:
    try:
        import ray._private.worker as worker

        return worker._global_node.get_session_dir_path() or None
    except Exception:  # not in a Ray worker, or Ray's internals moved
        return None
