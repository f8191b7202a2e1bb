"""Metrics names and types, the launcher's multiprocess switch, the per-request
acceptance default and per-choice attachment (no engine)."""

from types import SimpleNamespace

import pytest

from vllm_specdec_plugin import launcher
from vllm_specdec_plugin.compat import response_metrics


def test_metrics_follow_prometheus_conventions():
    from prometheus_client import REGISTRY, generate_latest

    from vllm_specdec_plugin.metrics import ProposerMetrics

    m = ProposerMetrics("unit-model")
    m.verified({"draft": 6, "ngram": 2}, {"draft": 4, "ngram": 1})
    m.request_finished(8, 5)
    m.target_step("verify", 0.02, 9)
    m.draft_step(0.004)
    m.step_done([4], {"pool_full": 1}, {"draft": 2, "ngram": 1, "none": 1}, 2)  # k 4 and k 0
    m.kv_blocks(3, 40)
    text = generate_latest(REGISTRY).decode()
    lines = [l for l in text.splitlines() if 'model_name="unit-model"' in l]
    get = lambda prefix: [float(l.rsplit(" ", 1)[1]) for l in lines if l.startswith(prefix)]
    assert sum(get("specdec_draft_tokens_total")) == 8 and sum(get("specdec_accepted_tokens_total")) == 5
    assert get('specdec_draft_tokens_total{model_name="unit-model",source="ngram"}') == [2]
    assert get('specdec_accepted_tokens_total{model_name="unit-model",source="draft"}') == [4]
    assert get("specdec_request_acceptance_rate_sum") == [0.625]
    assert get('specdec_target_step_seconds_count{kind="verify"') == [1]
    assert get('specdec_emitted_tokens_total{kind="verify"') == [9]
    assert get('specdec_emitted_tokens_total{kind="plain"') == [0]      # exported before use
    assert get('specdec_no_draft_rounds_total{model_name="unit-model",reason="pool_full"}') == [1]
    assert get("specdec_draft_k_count") == [2]
    assert get("specdec_draft_kv_blocks_used") == [3] and get("specdec_draft_kv_blocks_total") == [40]
    assert get('specdec_draft_source_rounds_total{model_name="unit-model",source="draft"}') == [2]
    assert get('specdec_draft_source_rounds_total{model_name="unit-model",source="none"}') == [1]
    assert get("specdec_backed_off_requests") == [2]
    # A second proposer in the same process (engine restart in tests) does not re-register.
    ProposerMetrics("unit-model-2").verified({"draft": 1}, {"draft": 1})


def test_observe_many_equals_repeated_observes():
    """The batched histogram write (private prometheus_client fields) books exactly
    what n observe calls book: a prometheus_client upgrade that moves them fails here."""
    from prometheus_client import CollectorRegistry, Histogram

    from vllm_specdec_plugin.metrics import observe_many

    def samples(batched: bool) -> list[tuple]:
        reg = CollectorRegistry()
        h = Histogram("h", "doc", ("model_name",), buckets=(0, 1, 4, 8), registry=reg)
        child = h.labels(model_name="m")
        for value, n in ((0, 5), (3, 2), (8, 1), (20, 3), (4, 0)):
            if batched:
                observe_many(child, value, n)
            else:
                for _ in range(n):
                    child.observe(value)
        return [(s.name, s.labels, s.value) for metric in reg.collect() for s in metric.samples
                if not s.name.endswith("_created")]

    assert samples(True) == samples(False)
    assert ("h_count", {"model_name": "m"}, 11.0) in samples(True)


@pytest.mark.parametrize("argv,want", [
    (["serve", "m", "--speculative-config", '{"model": "vllm_specdec_plugin.DraftModelProposer"}'], True),
    (["serve", "m", "--speculative-config", '{"method": "ngram"}'], False),
    (["serve", "m"], False),
    (["bench", "vllm_specdec_plugin.x"], False),
])
def test_launcher_selects_plugin_from_argv(argv, want):
    assert launcher.serve_argv_names_plugin(argv) is want


def test_launcher_reads_a_config_file(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text('speculative-config: {"model": "vllm_specdec_plugin.DraftModelProposer"}\n')
    assert launcher.serve_argv_names_plugin(["serve", "m", "--config", str(cfg)])
    assert launcher.serve_argv_names_plugin(["serve", "m", f"--config={cfg}"])


def test_multiprocess_dir_is_private_and_respects_the_users(monkeypatch):
    # setenv first so monkeypatch records the original state and restores it: the
    # launcher writes os.environ directly, and a leaked directory would be shared by
    # every vllm serve that later tests start (their /metrics would add up).
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    path = launcher.enable_multiprocess_metrics()
    import os

    assert path and os.path.isdir(path) and os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/users/own")
    assert launcher.enable_multiprocess_metrics() is None
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == "/users/own"


def _vllm_config(method, model, level="none", extra=None):
    spec = SimpleNamespace(method=method, model=model, num_speculative_tokens=3,
                           draft_load_config=SimpleNamespace(model_loader_extra_config=extra or {}))
    return SimpleNamespace(speculative_config=spec, additional_config={},
                           observability_config=SimpleNamespace(per_request_spec_decode_metrics=level))


def test_per_request_metrics_default_only_when_ours(monkeypatch):
    from vllm_specdec_plugin import startup_checks
    from vllm_specdec_plugin.config import from_vllm_config

    monkeypatch.setattr(startup_checks, "check_vllm_config", from_vllm_config)  # no real draft here
    ours = {"specdec": {"draft_model": "/d"}}
    cases = [
        (_vllm_config("custom_class", "vllm_specdec_plugin.DraftModelProposer", extra=ours), "summary"),
        (_vllm_config("custom_class", "vllm_specdec_plugin.DraftModelProposer", "detailed", ours), "detailed"),
        (_vllm_config("custom_class", "vllm_specdec_plugin.DraftModelProposer",
                      extra={"specdec": {"draft_model": "/d", "response_metrics": "none"}}), "none"),
        (_vllm_config("draft_model", "/some/draft"), "none"),     # in-tree: untouched
        (_vllm_config("ngram", None), "none"),
    ]
    from vllm_specdec_plugin import ray_bridge
    from vllm_specdec_plugin.compat import engine_config, patches

    installed = []
    monkeypatch.setattr(patches, "install", installed.append)  # the response wrappers
    monkeypatch.setattr(ray_bridge, "maybe_start", lambda: None)
    for cfg, want in cases:
        if engine_config._selects_plugin(cfg):
            engine_config._on_plugin_config(cfg)
        assert cfg.observability_config.per_request_spec_decode_metrics == want
    assert installed == ["responses"] * 3  # once per config that selects our proposer


def test_attach_adds_each_choices_own_metrics():
    class M:
        def __init__(self, d):
            self.d = d

        def to_dict(self):
            return self.d

    choices = [SimpleNamespace(), SimpleNamespace(), SimpleNamespace()]
    outputs = [SimpleNamespace(spec_decode_metrics=M({"num_draft_tokens": 4})),
               SimpleNamespace(spec_decode_metrics=M({"num_draft_tokens": 9})),
               SimpleNamespace(spec_decode_metrics=None)]
    response_metrics._attach(choices, outputs)
    assert choices[0].speculative_decoding == {"num_draft_tokens": 4}
    assert choices[1].speculative_decoding == {"num_draft_tokens": 9}
    assert not hasattr(choices[2], "speculative_decoding")
