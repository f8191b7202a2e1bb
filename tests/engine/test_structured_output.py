"""Structured output (choice, regex, JSON schema) under speculation: exact, end to end.

vLLM's scheduler cuts a request's drafts at the first token its grammar rejects. With
drafts sampled from an unconstrained q that cut depends on the sampled value and
biases the output; the plugin masks the draft with a copy of the request's grammar
(compat/draft_grammar.py), so nothing it drafts is ever cut.

The adversary is the misaligned fixture draft (fixtures/misaligned_draft.py): it
puts about a third of its mass on " " where the target rarely wants it, and real mass
on tokens the grammars reject. After the forced "x", the choice's target distribution
is {"}": .59, " ": .34, "  ": .07}; cutting unmasked drafts moves " " to about .55
(measured), far outside what the test tolerates. Outcomes: the first 4 output tokens
(shorter outputs padded), compared with vLLM without speculation by the same
two-sample test as the sampled-distribution suite.
"""

import pytest

from harness import engine_kwargs, plugin_spec, run_engine

N = 4000
ALPHA = 1e-3 / 3
PROMPT = "    return "
GRAMMARS = {
    "choice": {"choice": ["x}", "x #", "x The", "x  ok"]},
    "regex": {"regex": r"x( |\}|  )[a-z ]{0,6}"},
    "json": {"json": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6}},
                      "required": ["a"]}},
}
# Greedy parity also for the grammar kinds the sampled test does not cover.
GREEDY_ONLY = {
    "json_object": {"json_object": True},
    "grammar": {"grammar": 'root ::= "x" ("}" | " #" | " The") [a-z ]*'},
    "structural_tag": {"structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", "value": "x}"}}'},
}
KW = dict(max_num_seqs=256, max_model_len=128)
SINGLE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}   # the proposer's counters are read


def _job(name, grammar, seed0, temperature=1.0, n=N):
    params = [{"temperature": temperature, "max_tokens": 8, "structured_outputs": grammar,
               **({"seed": seed0 + i} if temperature else {})} for i in range(n)]
    return {"name": name, "prompts": [PROMPT] * n, "batch_size": 256, "params": params}


def _outcomes(res, name):
    return [tuple((o["token_ids"] + [-1] * 4)[:4]) for o in res["jobs"][name]]


@pytest.fixture(scope="module")
def misaligned(ci_pair):
    from specdec_fixtures.misaligned_draft import ensure_misaligned_draft

    return ensure_misaligned_draft(ci_pair.draft)


@pytest.fixture(scope="module")
def runs(ci_pair, misaligned):
    sampled = [_job(n, g, 0) for n, g in GRAMMARS.items()]
    greedy = [_job(f"greedy-{n}", g, 0, temperature=0.0, n=64)
              for n, g in {**GRAMMARS, **GREEDY_ONLY}.items()]
    baseline = run_engine(engine_kwargs(ci_pair.target, **KW), sampled + greedy)
    plugin = run_engine(engine_kwargs(ci_pair.target, plugin_spec(misaligned, 3), **KW),
                        [_job(n, g, 10**6) for n, g in GRAMMARS.items()] + greedy, env=SINGLE)
    aligned = run_engine(engine_kwargs(ci_pair.target, plugin_spec(
        ci_pair.draft, 4, method="hybrid", adaptive=True), **KW), greedy, env=SINGLE)
    return baseline, plugin, aligned


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_sampled_structured_output_matches_no_speculation(runs, name):
    from specdec_testing.two_sample import two_sample_chi2

    baseline, plugin, _ = runs
    a, b = _outcomes(baseline, name), _outcomes(plugin, name)
    stats = {"t1t2": two_sample_chi2([x[:2] for x in a], [x[:2] for x in b]),
             "t2t3": two_sample_chi2([x[1:3] for x in a], [x[1:3] for x in b]),
             "t1-4": two_sample_chi2(a, b)}
    print(f"{name}: (chi2, dof, p) {stats}")   # shown with -s: the note quotes these
    bad = {s: v for s, v in stats.items() if v[2] < ALPHA}
    assert not bad, f"{name}: distributions differ: {bad}"


def test_structured_requests_really_drafted(runs):
    _, plugin, _ = runs
    snap = plugin["proposer"]
    assert snap["by_source"]["draft"] > 0, snap
    assert snap["no_draft"].get("grammar_diverged", 0) == 0, snap
    assert plugin["metrics"].get("vllm:spec_decode_num_accepted_tokens", 0) > 0


@pytest.mark.parametrize("name", [*GRAMMARS, *GREEDY_ONLY])
def test_greedy_structured_output_is_token_identical(runs, name):
    baseline, plugin, aligned = runs
    want = [o["token_ids"] for o in baseline["jobs"][f"greedy-{name}"]]
    assert [o["token_ids"] for o in plugin["jobs"][f"greedy-{name}"]] == want
    assert [o["token_ids"] for o in aligned["jobs"][f"greedy-{name}"]] == want
