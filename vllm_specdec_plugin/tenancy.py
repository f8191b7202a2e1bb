"""What requests share, scoped as vLLM scopes its prefix cache (standard library only).

vLLM shares prefix-cache blocks only between requests with the same ``cache_salt``
(unsalted with unsalted). Everything the plugin learns from one request's text and uses
for another follows the rule: the finished-request corpus n-gram drafts are looked up
in, and the acceptance learned across requests (which sets others' k and source). A
scope key (``scope_key``): ``("salt", salt)`` per salt (``None`` unsalted),
``("global",)`` for all, ``None`` for a request whose salt did not reach the worker (it
shares with no one). Per worker, shared by all: the step-cost fits (timings reveal load,
not text), the shadow lookups' per-step budget (by the rows present), and the policy's
probe schedule and host-time term.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Callable, Generic, Hashable, Iterable, Sequence, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from vllm_specdec_plugin.ngram_corpus import CorpusIndex
# Scopes whose learned statistics are kept at once; the least recently used is
# dropped (it restarts from the prior). Each holds a few floats per draft source.
MAX_SCOPES = 4096

ScopeKey = Hashable | None
UNSALTED = ("salt", None)  # the scope of unsalted requests under "salt" (and "off")
V = TypeVar("V")


def scope_key(mode: str, salt: str | None, known: bool = True) -> ScopeKey:
    """Who a request shares with (``mode``: ``ngram_corpus_scope``; ``known`` False: its
    salt never reached the worker, no one)."""
    if mode == "global":
        return ("global",)
    return (UNSALTED[0], salt) if known else None


class ScopedStore(Generic[V]):
    """Per-scope values made on first use, at most ``MAX_SCOPES`` (least recently used
    dropped); scope ``None`` gets a fresh value, never kept."""

    def __init__(self, make: Callable[[], V], max_scopes: int = MAX_SCOPES) -> None:
        self._make, self._max = make, max_scopes
        self._values: OrderedDict[Hashable, V] = OrderedDict()

    def get(self, scope: ScopeKey) -> V:
        if scope is None:
            return self._make()
        v = self._values.get(scope)
        if v is None:
            v = self._values[scope] = self._make()
            if len(self._values) > self._max:
                self._values.popitem(last=False)
        else:
            self._values.move_to_end(scope)
        return v

    def peek(self, scope: ScopeKey) -> V | None:
        """The scope's value if it has one; never creates or reorders."""
        return None if scope is None else self._values.get(scope)

    def __len__(self) -> int:
        return len(self._values)


class ScopedCorpus:
    """One corpus (``make_index()``: an empty ``CorpusIndex``) per scope, under one budget
    of ``max_tokens``: the oldest finished request is evicted first, whatever its scope."""

    def __init__(self, max_tokens: int, make_index: Callable[[], "CorpusIndex"]) -> None:
        self.max_tokens, self._make_index = max_tokens, make_index
        self._indexes: dict[Hashable, CorpusIndex] = {}
        self._order: deque[tuple[Hashable, int]] = deque()  # (scope, tokens), oldest first
        self._total = 0

    def add(self, scope: ScopeKey, tokens: Sequence[int]) -> None:
        """Store a finished request's history in its scope's corpus (none for ``None``)."""
        if scope is None:
            return
        index = self._indexes.get(scope)
        if index is None:
            index = self._indexes[scope] = self._make_index()
        stored = index.add(tokens)
        if not stored:
            if not len(index):
                del self._indexes[scope]
            return
        self._order.append((scope, stored))
        self._total += stored
        while self._total > self.max_tokens:
            old, n = self._order.popleft()
            oldest = self._indexes[old]
            oldest.evict_oldest()
            self._total -= n
            if not len(oldest):
                del self._indexes[old]

    def get(self, scope: ScopeKey) -> "CorpusIndex | None":
        """The scope's corpus, or None (empty, or scope ``None``)."""
        return None if scope is None else self._indexes.get(scope)

    def tokens_by_scope(self) -> dict[Hashable, int]:  # for tests
        return {s: len(i) for s, i in self._indexes.items()}

    def __len__(self) -> int:
        return self._total


class RequestScopes:
    """Each live request's scope and the aborted ids, as the engine process reports them
    each step (``compat.scheduler``); after a step without a report nothing is shared."""

    def __init__(self, mode: str) -> None:
        self.mode = mode  # ngram_corpus_scope
        self._scopes: dict[str, ScopeKey] = {}  # req_id -> scope, until it finishes
        self._aborted: set[str] = set()  # aborted ids not yet seen finishing
        self.reported = True  # every step so far came with a report

    def note(self, report: tuple[dict, Iterable[str]] | None) -> bool:
        """One step's report ((req_id -> new request's salt, aborted ids) or None); True
        when reports just stopped (the caller warns once)."""
        if report is None:
            stopped, self.reported = self.reported, False
            return stopped
        salts, aborted = report
        self._aborted |= set(aborted)
        if self.reported:
            for rid, salt in salts.items():
                self._scopes[rid] = scope_key(self.mode, salt)
        return False

    def get(self, req_id: str) -> ScopeKey | None:
        return self._scopes.get(req_id)

    def finish(self, req_id: str) -> tuple[ScopeKey | None, bool]:
        """A finished request's scope, and whether its tokens may join the corpus."""
        scope = self._scopes.pop(req_id, None)
        aborted = req_id in self._aborted
        self._aborted.discard(req_id)
        return scope, self.reported and not aborted
