"""Reach the proposer inside an offline ``vllm.LLM`` (tests only; not in the wheel).

Why: tests must check draft-pool state (free == total after drain) and the proposer's
  counters; vLLM exposes no handle to a worker's drafter.
How: with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine core, executor, worker and
  model runner live in this process; walk llm.llm_engine -> engine_core (InprocClient)
  -> engine_core -> model_executor -> driver_worker -> worker -> model_runner.drafter.
Upstream: none planned; metrics (observability issue) expose the same numbers
  across processes.
Remove when: the attribute chain changes (returns None then; callers must cope).
"""

from __future__ import annotations

from typing import Any


def find_runner(llm: Any) -> Any | None:
    """The model runner if the engine runs in-process, else None."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return core.model_executor.driver_worker.worker.model_runner
    except AttributeError:
        return None


def find_proposer(llm: Any) -> Any | None:
    """The runner's drafter if the engine runs in-process, else None."""
    return getattr(find_runner(llm), "drafter", None)


def proposer_snapshot(llm: Any) -> dict | None:
    """Plain-data view of the proposer's pool and counters."""
    d = find_proposer(llm)
    if d is None or not hasattr(d, "stats"):
        return None
    from vllm_specdec_plugin.compat.draft_ids_return import counts
    from vllm_specdec_plugin.compat.scheduler import counts as plan

    s, a = d.stats, d.allocator
    return {
        "draft_ids_carried": counts["carried"], "draft_ids_rpc": counts["rpc"],
        "drafting_deferred": counts["deferred"],  # steps whose first tokens left first
        "plan_kept": plan["kept"], "plan_cut": plan["cut"], "plan_steps": plan["steps"],
        "plan_arrival": plan["arrival"],  # steps cut for a request expected to arrive
        "blocks_total": a.num_blocks if a else 0, "blocks_free": a.num_free if a else 0,
        "by_source": dict(s.by_source),
        "live_requests": len(d.requests), "rounds": s.rounds, "drafted": s.drafted,
        "accepted": s.accepted, "no_draft": dict(s.no_draft), "resyncs": s.resyncs,
        "prefill_tokens": s.prefill_tokens, "max_round_prefill": s.max_round_prefill, "draft_seconds": d.rounds.seconds,
        "draft_forwards": d.rounds.forwards,
        "model_class": type(d.model).__name__ if d.model is not None else None,
        # tokens of finished requests held per tenancy scope, e.g. {"salt:a": 512}
        "corpus_tokens": {":".join(str(x) for x in scope): n for scope, n in
                          d.planner.corpus.tokens_by_scope().items()}
        if d.planner.corpus is not None else None,
    }


def flush_finished(llm: Any) -> None:
    """Deliver pending finished-request ids to the workers, as a server would.

    The scheduler hands finished ids to the model runner with the *next* step. The
    server's busy loop takes that step (``EngineCoreProc.has_work`` counts finished
    requests); offline ``LLM.generate`` stops stepping once no request is unfinished.
    One more step here mirrors the server.
    """
    try:
        if llm.llm_engine.engine_core.engine_core.scheduler.has_finished_requests():
            llm.llm_engine.step()
    except AttributeError:
        pass  # multiprocess engine: the core process drains by itself
