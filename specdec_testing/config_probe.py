"""Build VllmConfigs for a list of engine-argument sets; report what each raised.

Usage: python -m specdec_testing.config_probe CASES.json OUT.json

CASES.json: [{"name": str, "engine": {EngineArgs kwargs}}]. OUT.json: {name: {"ok":
bool, "type": exception class name, "message": str, "ours": bool}}. Runs the same
path as `vllm serve` up to the point where engine processes would be spawned
(``EngineArgs.create_engine_config``), so start-up checks are exercised without
starting an engine. One process for all cases: vLLM's import dominates the cost.
"""

from __future__ import annotations

import json
import sys


def main(cases_path: str, out_path: str) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from vllm_specdec_plugin.errors import SpecDecError

    out = {}
    for case in json.loads(open(cases_path).read()):
        try:
            EngineArgs(**case["engine"]).create_engine_config()
            out[case["name"]] = {"ok": True}
        except Exception as e:  # what a user would see is the point of the probe
            out[case["name"]] = {"ok": False, "type": type(e).__name__, "message": str(e),
                                 "ours": isinstance(e, SpecDecError)}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
