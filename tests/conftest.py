"""Shared test set-up: tiers (unit/engine/gpu), fixture pair paths, engine env."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    import shutil

    has_gpu = shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")
    for item in items:
        path = str(item.fspath)
        if "/tests/engine/" in path and not item.get_closest_marker("engine"):
            item.add_marker(pytest.mark.engine)
        tiered = any(item.get_closest_marker(m) for m in ("unit", "engine", "gpu", "slow"))
        if "/tests/unit/" in path and not tiered:
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("gpu") and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)"))


@pytest.fixture(scope="session")
def ci_pair():
    from specdec_fixtures import ensure_pair

    return ensure_pair("ci")
