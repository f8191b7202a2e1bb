"""Per-step wall-clock timers on an in-process model runner (benchmarks only).

Why: the benchmark's c' needs the target step and drafting time of every speculative
  method measured the same way; vLLM exposes no per-step timings.
How: wrap, on one runner instance (not the class), ``execute_model``,
  ``sample_tokens`` and ``propose_draft_token_ids``; used only by
  ``testing/engine_worker.py`` when a benchmark asks for timers.
Upstream: per-step timing in vLLM's own stats (e.g. step-level spec-decode metrics).
Remove when: vLLM reports draft and verify step latency itself.
"""

from __future__ import annotations

import time


class StepTimers:
    """Wall time of every model-runner step of an in-process engine, split into the
    drafting part and the rest (benchmarks derive the draft/target cost ratio c').

    Wraps, on the runner instance only, ``execute_model`` (target forward),
    ``sample_tokens`` (sampling, rejection sampling, bookkeeping, and drafting) and
    ``propose_draft_token_ids`` (the drafting, for every speculative method alike).
    A step's ``target_s`` is execute + sample minus propose. Steps are bucketed by
    kind and number of requests: ``decode`` when no new request is scheduled and each
    request runs 1 + (its scheduled drafts) tokens, else ``mixed`` (prefill inside).
    On CUDA the clocks are read after a device synchronize.
    """

    def __init__(self, runner) -> None:
        import torch

        self._sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self.buckets: dict[str, dict] = {}
        self._pending: tuple[str, float] | None = None
        self._propose_s = 0.0
        exec_model, sample, propose = (runner.execute_model, runner.sample_tokens,
                                       runner.propose_draft_token_ids)

        def execute_model(scheduler_output, *args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            out = exec_model(scheduler_output, *args, **kwargs)
            self._sync()
            key = self._classify(scheduler_output)
            dt = time.perf_counter() - t0
            if out is None:  # the usual path: sample_tokens finishes the step
                self._pending = (key, dt)
            else:
                self._add(key, dt, 0.0)
            return out

        def sample_tokens(*args, **kwargs):
            self._propose_s = 0.0
            t0 = time.perf_counter()
            out = sample(*args, **kwargs)
            self._sync()
            dt = time.perf_counter() - t0
            if self._pending is not None:
                key, dt0 = self._pending
                self._pending = None
                self._add(key, dt0 + dt - self._propose_s, self._propose_s)
            return out

        def propose_draft_token_ids(*args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            out = propose(*args, **kwargs)
            self._sync()
            self._propose_s += time.perf_counter() - t0
            return out

        runner.execute_model = execute_model
        runner.sample_tokens = sample_tokens
        runner.propose_draft_token_ids = propose_draft_token_ids

    @staticmethod
    def _classify(so) -> str:
        sched = getattr(so, "num_scheduled_tokens", None) or {}
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        decode = bool(sched) and not getattr(so, "scheduled_new_reqs", None) and all(
            n == 1 + len(spec.get(r, ())) for r, n in sched.items())
        return f"{'decode' if decode else 'mixed'}:{len(sched)}"

    def _add(self, key: str, target_s: float, propose_s: float) -> None:
        b = self.buckets.setdefault(key, {"steps": 0, "target_s": 0.0, "propose_s": 0.0})
        b["steps"] += 1
        b["target_s"] += target_s
        b["propose_s"] += propose_s

    def take(self) -> dict:
        out, self.buckets = self.buckets, {}
        return out
