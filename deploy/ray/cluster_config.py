"""A Ray Serve config for ``cluster.py up``: ``${NAME}`` placeholders filled from the
environment, the ci fixture pair standing in for ``${SPECDEC_TARGET}`` /
``${SPECDEC_DRAFT}`` when they are not set."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(text: str, env: dict[str, str]) -> str:
    """Replace ``${NAME}`` with ``env[NAME]``; a missing name is an error."""
    missing = sorted({m for m in _PLACEHOLDER.findall(text) if m not in env})
    if missing:
        raise SystemExit(f"config placeholders without a value: {missing}; export them first")
    return _PLACEHOLDER.sub(lambda m: env[m.group(1)], text)


def fixture_env(text: str, say: Callable[[str], None]) -> dict[str, str]:
    """SPECDEC_TARGET/SPECDEC_DRAFT from the environment, else the ci pair (built if missing)."""
    env = dict(os.environ)
    needed = {"SPECDEC_TARGET", "SPECDEC_DRAFT"} & set(_PLACEHOLDER.findall(text))
    if needed and not needed <= set(env):
        from specdec_fixtures import ensure_pair

        say("ci fixture pair (building it if missing, ~2 min the first time)")
        pair = ensure_pair("ci")
        env.setdefault("SPECDEC_TARGET", str(pair.target))
        env.setdefault("SPECDEC_DRAFT", str(pair.draft))
    return env


def load_config(path: Path, say: Callable[[str], None]) -> dict:
    """applications[0] of a Serve config YAML, placeholders filled; ``say`` reports a fixture build."""
    import yaml

    text = path.read_text()
    cfg = yaml.safe_load(expand(text, fixture_env(text, say)))
    apps = cfg.get("applications") or []
    if not apps or "llm_configs" not in (apps[0].get("args") or {}):
        raise SystemExit(f"{path}: expected applications[0].args.llm_configs (a ray.serve.llm config)")
    return cfg
