"""Reads of private ``SamplingParams`` state.

Why: the exact sampler and the draft apply a request's bad words like vLLM's
  sampler does, and vLLM keeps their token ids only in the private
  ``SamplingParams._bad_words_token_ids`` (filled by the input processor from
  ``bad_words``; there is no public accessor in 0.32).
How: read the attribute, defaulting to no bad words. Imports nothing from vLLM.
Upstream: a public ``bad_words_token_ids`` property.
Remove when: vLLM exposes one (or renames the attribute: bad-words tests fail then).
"""

from __future__ import annotations

from typing import Any


def bad_words_token_ids(sp: Any) -> list[list[int]]:
    """Token-id sequences the request must never end a token with ([] if none)."""
    return list(getattr(sp, "_bad_words_token_ids", None) or ())
