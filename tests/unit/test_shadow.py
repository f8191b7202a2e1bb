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
