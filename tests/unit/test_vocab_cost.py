"""benchmarks.vocab_cost end to end at toy sizes: both sides, vLLM's own path beside them.

Checks the harness runs against the installed vLLM (its fake runner and metadata are
what the plugin's adapter and vLLM's RejectionSampler read) and reports the plugin's
time above vLLM's own; it asserts no speed.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from benchmarks import vocab_cost  # noqa: E402


def test_every_mix_runs_and_reports_the_time_above_vllms_own(tmp_path):
    vocab_cost.main(["--vocab", "64,256", "--batches", "1,3", "--ks", "2",
                     "--repeats", "1", "--min-time", "0", "--out", str(tmp_path)])
    out = json.loads((tmp_path / "results.json").read_text())
    assert {c["mix"] for c in out["cells"]} == set(vocab_cost.MIXES)
    for c in out["cells"]:
        for side in ("draft", "verify", "intree_draft", "intree_verify"):
            assert c[f"{side}_ms"] >= 0 and len(c[f"{side}_ms_all"]) == c["repeats"]
    for row in out["summary"]:
        assert set(row["above_ms"]) == {"64", "256"}   # JSON keys
        step = row["verify_ms"]["256"] + row["draft_ms"]["256"]
        assert row["above_ms"]["256"] == pytest.approx(step - row["intree_ms"]["256"], abs=1e-3)
    md = (tmp_path / "results.md").read_text()
    assert "## Beside vLLM's own path" in md
