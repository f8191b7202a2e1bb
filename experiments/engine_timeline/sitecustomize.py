"""A per-step timeline of vLLM's engine core and worker, identical for every
configuration (with or without the plugin): where a served cell's wall time goes.

Put this folder on PYTHONPATH with SPECDEC_TIMELINE=1; every vLLM process then
prints, per engine step, one ``timeline E`` line (engine core: the loop time before
the step, schedule, execute (the RPC to the worker until its output), update_from_output,
post_step, in ms; tokens scheduled, rows, new prompts) and per worker call one
``timeline W`` line (execute_model: the forward; sample_tokens: sampling, and with a
proposer its propose(), in ms) to stderr, which the serving benchmark keeps in each
server's log. ``summarize.py`` reads them. Experiment only: nothing in the package
imports this, and without SPECDEC_TIMELINE it patches nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time

_TARGETS = {"vllm.v1.engine.core", "vllm.v1.worker.gpu_worker"}


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f}"


def _shape(so) -> str:
    """Tokens, rows, new prompts and draft tokens of a SchedulerOutput."""
    spec = sum(len(v) for v in (so.scheduled_spec_decode_tokens or {}).values())
    return (f" | tok {so.total_num_scheduled_tokens} rows {len(so.num_scheduled_tokens)} "
            f"new {len(so.scheduled_new_reqs)} spec {spec}")


def _patch_engine(mod) -> None:
    core = mod.EngineCore
    step0 = core.step
    state = {"end": None}

    def wrap(self) -> None:
        """Time the calls step() makes, on this engine's own scheduler and executor."""
        self._tl, self._tl_shape = {}, ""
        for obj, name in ((self.scheduler, "schedule"), (self.scheduler, "update_from_output"),
                          (self.model_executor, "execute_model"),
                          (self.model_executor, "sample_tokens")):
            fn = getattr(obj, name)

            def timed(*a, _fn=fn, _name=name, **kw):
                t = time.perf_counter()
                out = _fn(*a, **kw)
                self._tl[_name] = self._tl.get(_name, 0.0) + time.perf_counter() - t
                if _name == "schedule":
                    self._tl_shape = _shape(out)
                return out
            setattr(obj, name, timed)

    def step(self):
        if not hasattr(self, "_tl"):
            wrap(self)
        self._tl.clear()
        t0 = time.perf_counter()
        out = step0(self)
        self._tl_step = (t0, time.perf_counter())
        return out

    def process_engine_step(self):
        """The busy loop's step: step(), queueing its outputs, post_step (which the
        plugin's compat.draft_ids_return may cut short: timed here, around it)."""
        self.__dict__.pop("_tl_step", None)
        executed = proc0(self)
        t2 = time.perf_counter()
        if not executed or "_tl_step" not in self.__dict__:
            return executed
        t0, t1 = self._tl_step
        loop = t0 - state["end"] if state["end"] is not None else 0.0
        state["end"] = t2
        tl = self._tl
        print(f"timeline E t {t0:.4f} loop {_ms(loop)} sched {_ms(tl.get('schedule', 0))} "
              f"exec {_ms(tl.get('execute_model', 0) + tl.get('sample_tokens', 0))} "
              f"update {_ms(tl.get('update_from_output', 0))} step {_ms(t1 - t0)} "
              f"post {_ms(t2 - t1)}{self._tl_shape}", file=sys.stderr)
        return executed

    proc = mod.EngineCoreProc
    proc0 = proc._process_engine_step
    core.step, proc._process_engine_step = step, process_engine_step


def _patch_worker(mod) -> None:
    w = mod.Worker
    ex0, sa0 = w.execute_model, w.sample_tokens

    def execute_model(self, scheduler_output, *a, **kw):
        t = time.perf_counter()
        out = ex0(self, scheduler_output, *a, **kw)
        self._tl_fwd = time.perf_counter() - t
        # an engine step (the engine times only steps that schedule tokens); a step
        # whose output came back from execute_model sampled nothing apart
        if out is not None and scheduler_output.total_num_scheduled_tokens > 0:
            print(f"timeline W fwd {_ms(self._tl_fwd)} sample 0", file=sys.stderr)
        return out

    def sample_tokens(self, grammar_output, *a, **kw):
        t = time.perf_counter()
        out = sa0(self, grammar_output, *a, **kw)
        print(f"timeline W fwd {_ms(getattr(self, '_tl_fwd', 0.0))} "
              f"sample {_ms(time.perf_counter() - t)}", file=sys.stderr)
        return out

    w.execute_model, w.sample_tokens = execute_model, sample_tokens


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec0 = spec.loader.exec_module

        def exec_module(module):
            exec0(module)
            (_patch_engine if name.endswith("core") else _patch_worker)(module)
        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("SPECDEC_TIMELINE") == "1":
    sys.meta_path.insert(0, _Finder())
