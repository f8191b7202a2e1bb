"""The plugin's Prometheus metrics (``specdec_*``), recorded in the worker process.

They reach ``vllm serve``'s ``/metrics`` through prometheus_client's multiprocess mode
(samples in files under ``$PROMETHEUS_MULTIPROC_DIR``, which vLLM's handler aggregates;
our ``vllm`` launcher sets it when the command line selects the plugin). Names follow
Prometheus conventions and carry vLLM's ``model_name`` label, so the dashboard joins the
two; vLLM drops collectors named ``vllm:*``, hence ``specdec_``. Imports
prometheus_client only (a vLLM dependency), never vLLM.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

_K_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32)
_RATE_BUCKETS = tuple(i / 10 for i in range(1, 11))
# Step latencies on CPU run from ~1 ms (draft, small batch) to seconds (large prefills).
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

NO_DRAFT_REASONS = ("pool_full", "length_guard", "adaptive", "batch", "ngram_miss",
                    "prefill_budget", "first_token", "latency", "grammar_reasoning",
                    "grammar_diverged", "host_time")
STEP_KINDS = ("verify", "plain")
DRAFT_SOURCES = ("draft", "ngram")
SOURCES = (*DRAFT_SOURCES, "none")
SHADOW_OUTCOMES = ("drafted", "accepted")
PLAN_OUTCOMES = ("kept", "cut")

_families: dict | None = None  # one set of collectors per process (registries reject duplicates)


def _create_families() -> dict:
    from prometheus_client import Counter, Gauge, Histogram

    m = ("model_name",)
    return {
        "draft_tokens": Counter("specdec_draft_tokens",
                                "Draft tokens verified by the target, by draft source.",
                                m + ("source",)),
        "accepted_tokens": Counter("specdec_accepted_tokens",
                                   "Draft tokens the target accepted, by draft source.",
                                   m + ("source",)),
        "shadow_tokens": Counter("specdec_shadow_draft_tokens",
                                 "Shadow n-gram drafts (proposed for rows that verified "
                                 "none, checked against the committed tokens), by outcome.",
                                 m + ("outcome",)),
        "request_rate": Histogram(
            "specdec_request_acceptance_rate",
            "Acceptance rate (accepted/drafted) of each finished request that had drafts.",
            m, buckets=_RATE_BUCKETS),
        "draft_step": Histogram(
            "specdec_draft_step_seconds",
            "Wall time of one drafting round: all draft forwards for the whole batch.",
            m, buckets=_SECONDS_BUCKETS),
        "target_step": Histogram(
            "specdec_target_step_seconds",
            "Wall time of a target step (forward + sampling), by kind: verify = it "
            "verified drafts, plain = pure decode without drafts.",
            m + ("kind",), buckets=_SECONDS_BUCKETS),
        "emitted": Counter("specdec_emitted_tokens", "Tokens emitted by target steps, by kind.",
                           m + ("kind",)),
        "k": Histogram("specdec_draft_k", "Draft tokens chosen per request and round (0 = none).",
                       m, buckets=_K_BUCKETS),
        "no_draft": Counter("specdec_no_draft_rounds",
                            "Request-rounds decoded without drafts, by reason.", m + ("reason",)),
        "source": Counter("specdec_draft_source_rounds",
                          "Request-rounds by the draft source chosen: draft (model), ngram, "
                          "none (decoded without drafts).", m + ("source",)),
        "backed_off": Gauge("specdec_backed_off_requests",
                            "Requests of the latest step that the step policy priced out "
                            "(reasons adaptive and batch): the back-off state.",
                            m, multiprocess_mode="mostrecent"),
        # mostrecent: one value per worker pool; a restarted worker's value replaces
        # the old one instead of being summed with it.
        "plan_tokens": Counter("specdec_step_plan_verify_tokens",
                               "Draft tokens of steps the scheduler bounded for a first token "
                               "(a prompt in the step, or a request just finished), by "
                               "outcome: kept (verified) or cut (never verified).",
                               m + ("outcome",)),
        "blocks_used": Gauge("specdec_draft_kv_blocks_used", "Draft KV cache blocks in use.",
                             m, multiprocess_mode="mostrecent"),
        "blocks_total": Gauge("specdec_draft_kv_blocks_total", "Draft KV cache blocks in the pool.",
                              m, multiprocess_mode="mostrecent"),
    }


def _bound(model_name: str) -> tuple[dict, dict]:
    global _families
    if _families is None:
        _families = _create_families()
    return _families, {"model_name": model_name}


class PlanMetrics:
    """The scheduler side's collectors (EngineCore process, ``compat.scheduler``)."""

    def __init__(self, model_name: str):
        f, lab = _bound(model_name)
        self._tokens = {o: f["plan_tokens"].labels(outcome=o, **lab) for o in PLAN_OUTCOMES}
        for c in self._tokens.values():
            c.inc(0)

    def verify_tokens(self, kept: int, cut: int) -> None:
        self._tokens["kept"].inc(kept)
        self._tokens["cut"].inc(cut)


class ProposerMetrics:
    """Bound (model_name-labelled) collectors for one proposer. Cheap to call per step."""

    def __init__(self, model_name: str):
        f, lab = _bound(model_name)
        self._draft_tokens = {src: f["draft_tokens"].labels(source=src, **lab)
                              for src in DRAFT_SOURCES}
        self._accepted = {src: f["accepted_tokens"].labels(source=src, **lab)
                          for src in DRAFT_SOURCES}
        self._request_rate = f["request_rate"].labels(**lab)
        self._shadow = {o: f["shadow_tokens"].labels(outcome=o, **lab) for o in SHADOW_OUTCOMES}
        self._draft_step = f["draft_step"].labels(**lab)
        self._target_step = {k: f["target_step"].labels(kind=k, **lab) for k in STEP_KINDS}
        self._emitted = {k: f["emitted"].labels(kind=k, **lab) for k in STEP_KINDS}
        self._k = f["k"].labels(**lab)
        self._no_draft = {r: f["no_draft"].labels(reason=r, **lab) for r in NO_DRAFT_REASONS}
        self._source = {src: f["source"].labels(source=src, **lab) for src in SOURCES}
        self._backed_off = f["backed_off"].labels(**lab)
        self._blocks_used = f["blocks_used"].labels(**lab)
        self._blocks_total = f["blocks_total"].labels(**lab)
        for c in (*self._no_draft.values(), *self._emitted.values(), *self._source.values(),
                  *self._shadow.values(), *self._draft_tokens.values(), *self._accepted.values()):
            c.inc(0)  # export every series from the start, so rate() has a baseline

    def verified(self, drafted: Mapping[str, int], accepted: Mapping[str, int]) -> None:
        """One step's verified draft tokens and accepted ones, by source ("draft", "ngram")."""
        for src, n in drafted.items():
            if n:
                self._draft_tokens[src].inc(n)
                self._accepted[src].inc(accepted.get(src, 0))

    def shadow(self, drafted: int, accepted: int) -> None:
        """One decided shadow proposal: ``drafted`` drafts, ``accepted`` of them matched."""
        self._shadow["drafted"].inc(drafted)
        self._shadow["accepted"].inc(accepted)

    def request_finished(self, drafted: int, accepted: int) -> None:
        if drafted:
            self._request_rate.observe(accepted / drafted)

    def target_step(self, kind: str, seconds: float, emitted_tokens: int) -> None:
        self._target_step[kind].observe(seconds)
        self._emitted[kind].inc(emitted_tokens)

    def draft_step(self, seconds: float) -> None:
        self._draft_step.observe(seconds)

    def sources(self, rounds: Mapping[str, int]) -> None:
        """Request-rounds by source: "draft", "ngram" or "none" -> count."""
        for src, n in rounds.items():
            self._source[src].inc(n)

    def backed_off(self, num_requests: int) -> None:
        self._backed_off.set(num_requests)

    def no_draft(self, reason: str, n: int = 1) -> None:
        self._no_draft[reason].inc(n)

    def step_done(self, ks: Iterable[int], no_draft: Mapping[str, int],
                  rounds: Mapping[str, int], backed_off: int) -> None:
        """One propose() step: each drafting row's k, rows without drafts by reason (k = 0),
        rounds by source, and requests backed off."""
        counts = Counter(ks)
        for reason, n in no_draft.items():
            self.no_draft(reason, n)
            counts[0] += n
        for k, n in counts.items():
            observe_many(self._k, k, n)
        self.sources(rounds)
        self.backed_off(backed_off)

    def kv_blocks(self, used: int, total: int) -> None:
        self._blocks_used.set(used)
        self._blocks_total.set(total)


def observe_many(hist, value: float, n: int) -> None:
    """``n`` observations of ``value`` in a bound Histogram, as ``n`` ``observe`` calls.

    Why: a step observes one k per row, and in multiprocess mode each observe writes two
    mmap values (7 % of propose()'s host time at c = 16). How: one increment of the
    bucket by n and of the sum by n·value, through prometheus_client's private
    ``_buckets``/``_upper_bounds``/``_sum`` (0.26; tested against n observes).
    Remove when: prometheus_client can observe a value n times."""
    if n <= 0:
        return
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    total = getattr(hist, "_sum", None)
    if bounds is None or buckets is None or total is None or n == 1:
        for _ in range(n):
            hist.observe(value)
        return
    total.inc(value * n)
    for bound, bucket in zip(bounds, buckets):
        if value <= bound:
            bucket.inc(n)
            break
