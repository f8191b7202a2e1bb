"""The draft's copy of each structured-output request's grammar.

Why: vLLM's scheduler cuts a request's drafts at the first token its grammar rejects
  (``StructuredOutputManager.validate_tokens``) and verifies only the rest. When the
  drafts were *sampled* from q, whether the cut happens depends on the sampled value,
  so the rejection sampler's output is no longer the target's distribution (p =
  (.5, .5, 0), q = (0, .5, .5), token 3 invalid: the output becomes (.25, .75)).
  Drafting only grammar-valid tokens (q masked exactly where the target's p is
  masked) means the scheduler never cuts on the grammar; the only cuts left are its
  token-budget cuts, which do not depend on the drafts' values. Exact again, and the
  masked drafts are accepted more often.
How: the worker keeps its own vLLM ``StructuredOutputManager`` (the frontend's backend
  per request, the same tokenizer and compilation) and a stand-in ``Request`` per
  structured request, fed committed tokens as the scheduler feeds them
  (``accept_tokens``); in a round the grammar advances over the drafts, one bitmask row
  per position, and rolls back after. The copy compiles synchronously on a request's
  first draft (compiled grammars are cached), so the first round already drafts. A mask
  may only be *stricter* than the scheduler's (q's support inside p's keeps rejection
  sampling exact), so anything uncertain drafts nothing:
  - the grammar failed to compile (the scheduler fails that request itself);
  - a reasoning parser gates the grammar (``--reasoning-parser`` without
    ``enable_in_reasoning``): where reasoning ends is request-scoped parser state;
  - the copy ever disagrees with a committed token.
Upstream: a proposer API that hands the proposer the request's grammar (or a
  scheduler that never cuts sampled drafts without a correction).
Remove when: vLLM masks custom proposers' drafts itself, or passes the grammar.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger("vllm.specdec_plugin")

# Why a structured request drafts nothing this round (counted as no-draft reasons).
REASONING = "grammar_reasoning"
DIVERGED = "grammar_diverged"


def is_structured(sampling_params: Any) -> bool:
    """True when a request has a grammar (json, regex, choice, grammar, structural tag)."""
    so = getattr(sampling_params, "structured_outputs", None)
    return so is not None and not so.all_constraints_none()


@dataclass(slots=True)
class _Request:
    """The fields of vLLM's ``Request`` that ``StructuredOutputManager`` reads."""

    request_id: str
    sampling_params: Any
    prompt_token_ids: list[int]
    structured_output_request: Any
    all_token_ids: list[int] = field(default_factory=list)
    use_structured_output: bool = True
    fed: int = 0             # output tokens fed to the grammar so far
    diverged: bool = False


class DraftGrammars:
    """Per-request grammar copies for one worker. Built lazily: a server that never
    sees a structured request never loads the grammar backend."""

    def __init__(self, vllm_config: Any):
        self.vllm_config = vllm_config
        soc = vllm_config.structured_outputs_config
        self.gated_by_reasoning = bool(soc.reasoning_parser) and not soc.enable_in_reasoning
        self._manager: Any = None
        self._requests: dict[str, _Request] = {}

    def _mgr(self) -> Any:
        if self._manager is None:
            from vllm.v1.structured_output import StructuredOutputManager

            self._manager = StructuredOutputManager(self.vllm_config)
            # Compile in the caller's thread: the round that needs the grammar waits
            # for it instead of drafting nothing (private attribute of vLLM 0.32).
            self._manager._use_async_grammar_compilation = False
        return self._manager

    def round_masks(self, grammars: list[Any]) -> "RoundMasks | None":
        """Masks for a round whose rows have these grammars (None: unstructured row)."""
        if all(g is None for g in grammars):
            return None
        return RoundMasks(grammars, self._mgr().backend.allocate_token_bitmask)

    def forget(self, req_id: str) -> None:
        self._requests.pop(req_id, None)

    def ready(self, req_id: str, sampling_params: Any, committed: Any, length: int,
              num_prompt: int) -> tuple[Any, str]:
        """(the request's grammar advanced over its committed output, "") when drafts can
        be masked, else (None, reason); committed: the runner's token row ([:length])."""
        if self.gated_by_reasoning:
            return None, REASONING
        req = self._requests.get(req_id)
        if req is None:
            from vllm.v1.structured_output.request import StructuredOutputRequest

            req = _Request(req_id, sampling_params, committed[:num_prompt].tolist(),
                           StructuredOutputRequest.from_sampling_params(sampling_params))
            req.all_token_ids = list(req.prompt_token_ids)
            self._mgr().grammar_init(req)
            self._requests[req_id] = req
        if req.diverged:
            return None, DIVERGED
        grammar = req.structured_output_request.grammar
        if grammar is None or isinstance(grammar, Exception):  # the scheduler fails the request itself
            req.diverged = True
            return None, DIVERGED
        new = committed[num_prompt + req.fed:length].tolist()
        if new:
            req.all_token_ids.extend(new)
            if not self._mgr().accept_tokens(req, new):
                logger.warning("specdec: draft grammar copy rejected committed tokens of "
                               "%s; that request drafts nothing from now on", req_id)
                req.diverged = True
                return None, DIVERGED
            req.fed += len(new)
        return grammar, ""


class RoundMasks:
    """Masks one round's draft logits with each structured row's grammar (``grammars``:
    per row, from ``DraftGrammars.ready``, or None; ``allocate``: the backend's
    ``allocate_token_bitmask``). ``apply`` runs once per pass before its drafts are
    chosen; ``finish`` rolls every grammar back and returns per row how many drafts are
    valid (a row stops at its grammar's end, where the scheduler would cut)."""

    def __init__(self, grammars: list[Any], allocate: Any):
        self.rows = [i for i, g in enumerate(grammars) if g is not None]
        self.grammars = grammars
        self.advanced = [0] * len(grammars)
        self.limit: list[int | None] = [None] * len(grammars)  # drafts kept (None: all)
        self._bitmask = allocate(len(self.rows))   # int32 [rows, ceil(V_tok / 32)]

    def apply(self, logits: torch.Tensor, pos: int, drafts: torch.Tensor) -> None:
        """logits [n, V] float32 of pass ``pos`` (rows 0..n-1), masked in place.
        drafts [B, k] holds the earlier passes' drafts (read for structured rows)."""
        n = logits.shape[0]
        rows = [r for r in self.rows if r < n and self.limit[r] is None]
        if not rows:
            return
        if pos == 0:
            for r in rows:
                if self.grammars[r].is_terminated():
                    self.limit[r] = 0
        else:  # one small host read per pass, only when structured rows draft
            prev = drafts[rows, pos - 1].tolist()
            for r, tok in zip(rows, prev):
                g = self.grammars[r]
                if not g.accept_tokens("specdec-draft", [tok]):
                    self.limit[r] = pos - 1      # cannot happen for a masked draft
                    continue
                self.advanced[r] += 1
                if g.is_terminated():
                    self.limit[r] = pos          # the stop token ends the drafts
        live = [r for r in rows if self.limit[r] is None]
        if not live:
            return
        bm = self._bitmask
        bm.fill_(-1)
        for m, r in enumerate(live):
            self.grammars[r].fill_bitmask(bm, m)
        allowed = _unpack(bm[: len(live)], logits.shape[1])
        for m, r in enumerate(live):
            if not bool(allowed[m].any()):
                self.limit[r] = pos              # nothing valid: stop this row here
        allowed = allowed.to(logits.device)
        idx = torch.tensor(live, device=logits.device)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))

    def finish(self) -> list[int | None]:
        for r in self.rows:
            if self.advanced[r]:
                self.grammars[r].rollback(self.advanced[r])
        return self.limit


def _unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar bitmask [R, ceil(V/32)] int32 -> allowed [R, vocab_size] bool (bit b of
    word w allows token 32 w + b; tokens past its width are never drafted: stricter is exact)."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)   # [R, 32 W]
    out = torch.zeros((bitmask.shape[0], vocab_size), dtype=torch.bool)
    w = min(vocab_size, bits.shape[1])
    out[:, :w] = bits[:, :w]
    return out
