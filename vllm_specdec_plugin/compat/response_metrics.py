"""Per-request acceptance in every response choice, including n > 1 and multi-prompt.

Why and how: the ``responses`` rows of ``compat.patches``.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

CHOICE_FIELD = "speculative_decoding"


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


def wrap_completion_response(original: Any) -> Any:
    def request_output_to_completion_response(self, final_res_batch, *args, **kwargs):  # noqa: ANN001
        response = original(self, final_res_batch, *args, **kwargs)
        if _ours(_vllm_config(self)):
            # Choices are built in this order: every prompt, then each of its n outputs.
            _attach(response.choices, [o for res in final_res_batch for o in res.outputs])
        return response

    return request_output_to_completion_response


def wrap_chat_response(original: Any) -> Any:
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

    return chat_completion_full_generator
