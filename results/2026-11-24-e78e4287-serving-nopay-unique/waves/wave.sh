cd /work/main; source scripts/cpu_env.sh
NAME=$1; SPEC=$2; PLUG=$3; PORT=$4; DS=$5
T=.cache/fixtures/v2/nopay/target
ARGS=(serve $T --host 127.0.0.1 --port $PORT --served-model-name $NAME --max-model-len 1024 --dtype float32 --seed 0)
[ "$SPEC" != none ] && ARGS+=(--speculative-config "$SPEC")
VLLM_PLUGINS=$PLUG setsid .venv/bin/vllm "${ARGS[@]}" > /tmp/s7/wave/$NAME.log 2>&1 &
SP=$!
until curl -sf http://127.0.0.1:$PORT/health >/dev/null; do sleep 2; done
for ds in a b; do
VLLM_PLUGINS= .venv/bin/vllm bench serve --backend openai --endpoint /v1/completions --base-url http://127.0.0.1:$PORT --model $NAME --tokenizer $T --dataset-name custom --dataset-path /tmp/s7/wave/$ds.jsonl --skip-chat-template --custom-output-len 64 --num-prompts 64 --temperature 0 --ignore-eos --seed 0 --max-concurrency 16 --save-result --save-detailed --result-dir /tmp/s7/wave --result-filename $NAME-$ds.json > /tmp/s7/wave/$NAME-$ds.txt 2>&1
done
kill -INT -- -$SP; sleep 10; kill -9 -- -$SP 2>/dev/null
