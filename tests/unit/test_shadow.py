"""Shadow n-gram proposals: decided by the committed tokens, rows take turns."""

import pytest

from vllm_specdec_plugin.shadow import Shadow, take_turns

pytestmark = pytest.mark.unit


def test_a_shadow_is_pending_until_a_mismatch_or_every_draft_is_committed():
    s = Shadow(start=3, drafts=[7, 8, 9], match=("own", 2))
    row = [1, 2, 3, 7, 8, 9, 5]
    assert s.outcome(row, 3) is None              # nothing committed yet
    assert s.outcome(row, 5) is None              # 7, 8 matched, 9 not yet known
    assert s.outcome(row, 6) == (3, 3)            # all three matched
    assert s.outcome([1, 2, 3, 7, 0], 5) == (3, 1)  # second draft rejected
    assert s.outcome([1, 2, 3, 0], 4) == (3, 0)     # decided by the first token
    assert s.outcome([1, 2, 3, 7, 8, 9, 5, 6], 8) == (3, 3)  # a verify step committed more


def test_rows_take_turns_for_new_shadows():
    rows, last = list(range(10)), {r: -1 for r in range(10)}
    picked = []
    for turn in range(3):
        picked.append(take_turns(rows, last.get, 4))
        last.update({r: turn for r in picked[-1]})
    assert [len(p) for p in picked] == [4, 4, 4]
    assert set().union(*map(set, picked)) == set(rows)  # every row within three steps
    assert take_turns([1, 2], last.get, 4) == [1, 2]


def test_who_takes_a_turn_depends_on_the_rows_present_not_on_past_steps():
    # another tenant's earlier traffic advanced the step count: the same rows with the
    # same relative history pick the same turns
    rows = [0, 1, 2, 3, 4, 5]
    fresh = {r: -1 for r in rows}
    assert take_turns(rows, fresh.get, 4) == [0, 1, 2, 3]
    after = {0: 500, 1: 500, 2: 500, 3: 500, 4: -1, 5: -1}
    assert take_turns(rows, after.get, 4) == [4, 5, 0, 1]


def test_a_decided_shadow_is_booked_as_the_ngram_round_it_would_have_been():
    """ShadowBook.book: the outcome teaches the request's n-gram α and its match bucket
    (in its scope), as a verified round would; pending shadows book nothing."""
    from types import SimpleNamespace

    from vllm_specdec_plugin.control.acceptance import Acceptance, ScopeRecord
    from vllm_specdec_plugin.request_state import RequestState
    from vllm_specdec_plugin.shadow import ShadowBook
    from vllm_specdec_plugin.stats import ProposerStats

    booked = []
    book = ShadowBook(None, ProposerStats(), SimpleNamespace(shadow=lambda d, a: booked.append((d, a))))
    scope = ScopeRecord()
    req, twin = RequestState(learned=Acceptance(scope)), Acceptance(ScopeRecord())
    req.shadow = Shadow(start=3, drafts=[7, 8, 9], match=("own", 2))
    book.book(req, [1, 2, 3, 7, 8], 5)  # still pending
    assert req.shadow is not None and booked == []
    book.book(req, [1, 2, 3, 7, 0], 5)  # second draft rejected
    twin.observe("ngram", 3, 1, ("own", 2))
    assert req.shadow is None and booked == [(3, 1)]
    assert req.learned.alpha("ngram") == pytest.approx(twin.alpha("ngram"))
    assert scope.matches[("own", 2)].num == 1 and scope.matches[("own", 2)].den == 2
    assert (book.stats.shadow_drafted, book.stats.shadow_accepted) == (3, 1)
    book.book(req, [1, 2, 3, 7, 0], 5)  # nothing pending: nothing more
    assert booked == [(3, 1)]


def test_shadow_proposals_go_to_idle_rows_in_turns():
    from types import SimpleNamespace

    from vllm_specdec_plugin.request_state import RequestState
    from vllm_specdec_plugin.shadow import ShadowBook
    from vllm_specdec_plugin.tuning import SHADOW_K, SHADOW_ROWS

    asked = []

    def shadow_drafts(req, row, length, k, end):
        asked.append((length, k, end))
        return ([5, 6], ("own", 1)) if length % 2 else ([], None)

    book = ShadowBook(shadow_drafts, SimpleNamespace(), SimpleNamespace())
    ids = [f"r{i}" for i in range(SHADOW_ROWS + 4)]
    requests = {rid: RequestState() for rid in ids}
    lengths = [11 + i for i in range(len(ids))]  # odd lengths find a match
    book.propose(list(range(len(ids))), ids, requests, [[0] * 32] * len(ids), lengths,
                 lambda row, rid: 100 + row)
    assert len(asked) == SHADOW_ROWS and all(k == SHADOW_K for _, k, _ in asked)
    assert [asked[0][2], asked[1][2]] == [100, 101]
    with_shadow = [rid for rid in ids if requests[rid].shadow is not None]
    assert with_shadow == [ids[i] for i in range(0, SHADOW_ROWS, 2)]
    assert requests[ids[0]].shadow.start == 11 and requests[ids[0]].shadow.match == ("own", 1)
    # next step: rows with a pending shadow are skipped, the rows that had no turn go first
    asked.clear()
    book.propose(list(range(len(ids))), ids, requests, [[0] * 32] * len(ids), lengths,
                 lambda row, rid: None)
    assert [length for length, _, _ in asked] == lengths[SHADOW_ROWS:]
