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
    rows = list(range(10))
    picked = [take_turns(rows, turn, 4) for turn in range(3)]
    assert [len(p) for p in picked] == [4, 4, 4]
    assert set().union(*map(set, picked)) == set(rows)  # every row within three steps
    assert take_turns([1, 2], 5, 4) == [1, 2]
