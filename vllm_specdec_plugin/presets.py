"""A YAML preset of plugin options (``preset: NAME``): found by path or by name in the
repository's ``configs/`` folder, read, and its file paths resolved.

A preset holds option: value pairs, at the top or under ``specdec:``; ``draft_model``
and ``draft_vocab`` may use ``$VARS`` and be relative to the preset file. It may not
name another preset. ``config.merge_sources`` puts explicit options above it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vllm_specdec_plugin.config import CONFIG_KEY
from vllm_specdec_plugin.errors import SpecDecConfigError

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def load_preset(ref: str) -> dict[str, Any]:
    """Read a YAML preset given as a path or as a name in the repo's configs/ folder."""
    import yaml

    candidates = [Path(ref), REPO_CONFIGS / ref, REPO_CONFIGS / f"{ref}.yaml"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise SpecDecConfigError(
            f"preset {ref!r} not found (looked at {[str(c) for c in candidates]}). Fix: "
            f"pass an existing YAML path or one of {sorted(p.stem for p in REPO_CONFIGS.glob('*.yaml'))}.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecDecConfigError(
            f"preset {path} is not valid YAML{where}: {getattr(e, 'problem', None) or e}. "
            "Fix the file.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecDecConfigError(
            f"preset {path} must be a YAML mapping of option: value. Fix the file.")
    data = dict(data.get(CONFIG_KEY, data))
    if "preset" in data:
        raise SpecDecConfigError(
            f"preset {path} may not name another preset. Fix: copy its options instead.")
    # Paths in a preset may use $VARS and be relative to the preset file.
    for key in ("draft_model", "draft_vocab"):
        ref = data.get(key)
        if isinstance(ref, str) and ref:
            ref = os.path.expandvars(ref)
            if not os.path.isabs(ref) and (path.parent / ref).exists():
                ref = str(path.parent / ref)
            data[key] = ref
    return data
