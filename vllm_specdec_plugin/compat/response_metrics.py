"""Per-request acceptance in every response, including n > 1 and multi-prompt requests.

Why: vLLM 0.32 already tracks acceptance per output sequence in the scheduler
  (``RequestSpecDecodeMetrics``: histogram of accepted drafts per verify step, drafts)
  and hands it to each finished ``CompletionOutput.spec_decode_metrics``. Two gaps:
  1. it is off unless ``--per-request-spec-decode-metrics`` is given;
  2. the OpenAI server attaches it only to single-sequence responses (``metrics.
     speculative_decoding``), so n > 1 and multi-prompt completions lose it.
How: (1) ``compat/engine_config.py`` turns the level from ``none`` to ``summary``
  when the config selects our proposer (the plugin option ``response_metrics: none``
  opts out) and then calls ``install_response_wrappers``. (2) The non-streaming completion and
  chat response builders are wrapped to add ``speculative_decoding`` (the same fields
  as vLLM's ``SpeculativeDecodingMetrics``) to every choice, from that choice's own
  sequence. Both wrappers are pass-throughs unless our proposer is configured.
Upstream: per-choice spec-decode metrics in the OpenAI protocol for n > 1.
Remove when: vLLM reports per-choice acceptance itself; keep (1) only while the flag
  defaults to ``none``.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

_responses_installed = False
CHOICE_FIELD = "speculative_decoding"


def install_response_wrappers() -> None:
    """Wrap the completion and chat response builders (idempotent). Called only when
    a config selects our proposer, in processes that build configs (API server,
    offline LLM), never in EngineCore or workers."""
    global _responses_installed
    if _responses_installed:
        return
    _responses_installed = True
    _wrap_completion_response()
    _wrap_chat_response()


def _vllm_config(serving: Any) -> Any:
    return getattr(getattr(serving, "engine_client", None), "vllm_config", None)


def _ours(config: Any) -> bool:
    from vllm_specdec_plugin.compat.rejection_adapter import is_ours

    return is_ours(getattr(config, "speculative_config", None))


def choice_metrics(output: Any) -> dict | None:
    """vLLM's per-sequence metrics of one CompletionOutput as a response dict, or None."""
    m = getattr(output, "spec_decode_metrics", None)
    return m.to_dict() if m is not None else None


def _attach(choices: list[Any], outputs: list[Any]) -> None:
    for choice, output in zip(choices, outputs):
        metrics = choice_metrics(output)
        if metrics is not None:
            setattr(choice, CHOICE_FIELD, metrics)  # response models allow extra fields


def _wrap_completion_response() -> None:
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion as S

    original = S.request_output_to_completion_response

    def request_output_to_completion_response(self, final_res_batch, *args, **kwargs):  # noqa: ANN001
        response = original(self, final_res_batch, *args, **kwargs)
        if _ours(_vllm_config(self)):
            # Choices are built in this order: every prompt, then each of its n outputs.
            _attach(response.choices, [o for res in final_res_batch for o in res.outputs])
        return response

    request_output_to_completion_response.__wrapped__ = original  # type: ignore[attr-defined]
    S.request_output_to_completion_response = request_output_to_completion_response


def _wrap_chat_response() -> None:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat as S

    original = S.chat_completion_full_generator

    async def chat_completion_full_generator(self, request, result_generator, *args, **kwargs):  # noqa: ANN001
        if not _ours(_vllm_config(self)):
            return await original(self, request, result_generator, *args, **kwargs)
        last: list[Any] = []

        async def tap(gen: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for res in gen:
                last[:] = [res]
                yield res

        response = await original(self, request, tap(result_generator), *args, **kwargs)
        choices = getattr(response, "choices", None)
        if choices and last:
            by_index = {o.index: o for o in last[0].outputs}
            _attach(choices, [by_index.get(c.index) for c in choices])
        return response

    chat_completion_full_generator.__wrapped__ = original  # type: ignore[attr-defined]
    S.chat_completion_full_generator = chat_completion_full_generator
