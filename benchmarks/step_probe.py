"""Host time per component inside one benchmark step (``vocab_cost``'s breakdown)."""

from __future__ import annotations

import importlib
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Callable


class Probe:
    """Per-component host time inside a step, by wrapping module attributes that the
    plugin looks up at call time. A missing attribute is reported, not fatal: the
    totals stay valid, only that component's share is lost."""

    # (module, attribute, component)
    TARGETS = (
        ("vllm_specdec_plugin.sampling.pipeline", "position_probs", "verify.p"),
        ("vllm_specdec_plugin.rejection", "rejection_sample", "verify.accept"),
        ("vllm_specdec_plugin.rejection", "greedy_verify", "verify.accept"),
        ("vllm_specdec_plugin.draft.sampler", "target_probs", "draft.q"),
        ("vllm_specdec_plugin.draft.sampler", "sample_from_weights", "draft.sample"),
    )

    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)
        self.missing: list[str] = []

    def reset(self) -> dict[str, float]:
        out, self.acc = dict(self.acc), defaultdict(float)
        return out

    @contextmanager
    def installed(self):
        saved = []
        for module, attr, label in self.TARGETS:
            mod = importlib.import_module(module)
            if not hasattr(mod, attr):
                self.missing.append(f"{module}.{attr}")
                continue
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, self._timed(getattr(mod, attr), label))
        if self.missing:
            print(f"vocab_cost: WARNING: breakdown probes missing (interface changed?): "
                  f"{', '.join(self.missing)}", file=sys.stderr)
        try:
            yield self
        finally:
            for mod, attr, fn in saved:
                setattr(mod, attr, fn)

    def _timed(self, fn: Callable, label: str) -> Callable:
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.acc[label] += time.perf_counter() - t0
        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    @contextmanager
    def section(self, label: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.acc[label] += time.perf_counter() - t0
