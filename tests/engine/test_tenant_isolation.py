"""Tenants stay apart: cross-request drafting is scoped by ``cache_salt`` as vLLM's
prefix cache is, and aborted requests feed no corpus.

Hybrid mode, greedy, float32, CI pair. Tenant A (salt "a") sends held-out code;
tenant B (salt "b") then sends the same texts' first halves. B's outputs, per-request
acceptance and drafted counts must equal those of a run in which A sent nothing
(both runs start with the same warm-up from a third tenant; the step-cost model is
fed modelled timings, ``tenant_job._model_clock``, since hybrid's source choice
reads the fitted costs and wall-clock noise alone would move the counts). The
negative control, ``ngram_corpus_scope: global``, shows the leak: there B drafts
from A's text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import ENGINE_ENV, EngineFailed, engine_kwargs, plugin_spec
from prompts import PROSE

GREEDY = {"temperature": 0, "max_tokens": 48}
JOB = Path(__file__).with_name("tenant_job.py")


def _texts(n: int = 6, chars: int = 480) -> list[str]:
    """Held-out code (files the fixture pair never trained on), cut at a line end."""
    from specdec_fixtures.corpus import load_corpus

    docs = [d for d in load_corpus().heldout_docs if len(d) > 2 * chars][:n]
    return [d[:d.rfind("\n", 0, chars) + 1] for d in docs]


def _run(pair, scope: str, phases: list[dict]) -> dict:
    spec = plugin_spec(pair.draft, 4, method="hybrid", ngram_corpus_scope=scope)
    with tempfile.TemporaryDirectory() as d:
        job, out = Path(d, "job.json"), Path(d, "out.json")
        job.write_text(json.dumps({"engine": engine_kwargs(pair.target, spec), "phases": phases}))
        env = {**os.environ, **ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        env["PYTHONPATH"] = os.pathsep.join(  # specdec_testing lives at the repo root
            filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
        p = subprocess.run([sys.executable, str(JOB), str(job), str(out)], env=env,
                           capture_output=True, text=True, timeout=900)
        if p.returncode != 0 or not out.exists():
            raise EngineFailed(p.returncode, p.stdout + p.stderr)
        return json.loads(out.read_text())


def _phase(name, salt, prompts, **kw) -> dict:
    return {"name": name, "salt": salt, "prompts": prompts, "params": GREEDY, **kw}


def _acceptance(outs: list[dict]) -> float:
    drafted = sum(o["spec_decode"]["num_draft_tokens"] for o in outs)
    return sum(o["spec_decode"]["num_accepted_draft_tokens"] for o in outs) / max(drafted, 1)


def test_other_salts_text_changes_nothing_and_aborts_feed_no_corpus(ci_pair):
    texts = _texts()
    halves = [t[: len(t) // 2] for t in texts]
    warm = _phase("warm", "w", PROSE[:4])
    with_a = _run(ci_pair, "salt", [
        warm, _phase("a", "a", texts), _phase("b", "b", halves),
        _phase("replay", "a", texts),
        # a request aborted mid-stream adds nothing; the same one finished does
        _phase("aborted", "x", PROSE[4:6], abort_after=6),
        _phase("finished", "y", PROSE[4:6])])
    without_a = _run(ci_pair, "salt", [warm, _phase("b", "b", halves)])
    leaky = _run(ci_pair, "global", [warm, _phase("a", "a", texts), _phase("b", "b", halves)])

    b, b_alone, b_leaky = (r["phases"]["b"] for r in (with_a, without_a, leaky))
    summary = {"b_with_a": [o["spec_decode"] for o in b],
               "b_alone": [o["spec_decode"] for o in b_alone],
               "b_global": [o["spec_decode"] for o in b_leaky],
               "replay_acceptance": _acceptance(with_a["phases"]["replay"]),
               "corpus": with_a["corpus"]}
    print(json.dumps(summary))
    # greedy output is the target's in every run (exactness), so the counts are the test
    assert [o["token_ids"] for o in b] == [o["token_ids"] for o in b_alone]
    assert [o["spec_decode"] for o in b] == [o["spec_decode"] for o in b_alone], summary
    # negative control: one corpus for everyone, and B drafts from A's text
    assert [o["token_ids"] for o in b_leaky] == [o["token_ids"] for o in b_alone]
    assert [o["spec_decode"] for o in b_leaky] != [o["spec_decode"] for o in b_alone], summary
    # within a salt the replay is still drafted from the corpus
    assert _acceptance(with_a["phases"]["replay"]) > 0.9, summary
    corpus = with_a["corpus"]
    assert corpus["aborted"].get("salt:x", 0) == 0, corpus
    assert all(o is None or o["finish_reason"] == "abort" for o in with_a["phases"]["aborted"])
    assert corpus["finished"].get("salt:y", 0) > 0, corpus
    assert set(corpus["b"]) == {"salt:w", "salt:a", "salt:b"}, corpus
