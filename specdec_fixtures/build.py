"""Orchestration: build a pair into a temp folder, write the manifest, rename.

Cache layout: ``<root>/v<BUILDER_VERSION>/<pair>/`` holding ``draft/``,
``target/`` and ``manifest.json``.  A build happens in a sibling
``.<pair>.tmp-<pid>-<rand>`` folder which is renamed into place only once
everything (the manifest last) is written, so a killed build never leaves a
folder that looks complete.  A per-pair ``flock`` serialises concurrent builders.

Only the standard library is imported at module level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

from .layout import (BUILDER_VERSION, FixturePair, _pair_from, file_hashes, fixtures_root,
                     load_pair, pair_dir, write_manifest)
from .specs import (BUILD_NUM_THREADS, RMS_NORM_EPS, SPECIAL_TOKENS, VOCAB_SIZE, PairSpec,
                    RealPairSpec, get_pair_spec)

# Manifest keys whose values are measured wall-clock times: they differ between
# otherwise identical builds and are excluded from determinism comparisons.
VOLATILE_MANIFEST_KEYS = ("timings",)
# The free-running agreement probe (see evaluate.free_running_agreement).
FREE_RUN_PROMPTS = 4
FREE_RUN_PROMPT_LEN = 32
FREE_RUN_TOKENS = 48

_log = logging.getLogger("specdec_fixtures")
Log = Callable[[str], None]


class _Stages:
    def __init__(self, log: Log):
        self.log = log
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.log(f"  [{name}] ...")
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        self.seconds[name] = round(self.seconds.get(name, 0.0) + dt, 3)
        self.log(f"  [{name}] done in {dt:.1f}s")


# Corpus, tokenizer and token streams are the same for every pair: build them once
# per process.
_SHARED: dict = {}


def _shared(log: Log) -> dict:
    from .corpus import load_corpus
    from .tokenizer import special_token_ids, token_stream, train_tokenizer

    corpus = load_corpus()
    if corpus.digest not in _SHARED:
        tok = train_tokenizer(corpus.train_docs)
        _SHARED.clear()
        _SHARED[corpus.digest] = {
            "corpus": corpus,
            "tokenizer": tok,
            "special_ids": special_token_ids(tok),
            "train_stream": token_stream(tok, corpus.train_docs),
            "heldout_stream": token_stream(tok, corpus.heldout_docs),
        }
    sh = _SHARED[corpus.digest]
    log(f"    corpus: {len(corpus.files)} files, {corpus.num_chars} chars, sha256 "
        f"{corpus.digest[:16]}...; {sh['train_stream'].numel()} train / "
        f"{sh['heldout_stream'].numel()} held-out tokens")
    return sh


def _env_versions() -> dict:
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {
        "python": sys.version.split()[0],
        "python_full": sys.version,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


# --- the build --------------------------------------------------------------------

def build_pair(spec: PairSpec | RealPairSpec | str, out: Path, log: Log = print,
               downloads: Path | None = None) -> dict:
    """Build ``spec`` into the (new or empty) folder ``out``; return the manifest
    (also written to ``out/manifest.json``, last).  No caching, no renaming: see
    ``ensure_pair`` for that.  The caller's torch RNG state and thread count are
    restored afterwards.  ``downloads``: where a real pair's registry files are cached
    (default ``<fixtures root>/downloads``)."""
    import torch

    if isinstance(spec, str):
        spec = get_pair_spec(spec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_NUM_THREADS)
    try:
        with torch.random.fork_rng(devices=[]):
            if isinstance(spec, RealPairSpec):
                from .real_pair import build_real_pair

                manifest = build_real_pair(spec, out, Path(downloads or fixtures_root() / "downloads"),
                                           log)
            else:
                manifest = _build_pair(spec, out, log)
    finally:
        torch.set_num_threads(prev_threads)
    manifest.update(builder_version=BUILDER_VERSION, pair=spec.name, description=spec.description,
                    environment=_env_versions(), num_threads=BUILD_NUM_THREADS)
    write_manifest(out, manifest)
    log(f"  built {spec.name} in {manifest['timings']['build_seconds']:.1f}s")
    return manifest


def _build_pair(spec: PairSpec | str, out: Path, log: Log) -> dict:
    import torch

    from .checkpoint import (count_params, llama_config_dict, make_hf_model, state_dict_of,
                             write_checkpoint)
    from .construct import construct_target
    from .evaluate import (agreement, decode_ms_per_token, free_running_agreement,
                           greedy_and_loss, greedy_tokens, heldout_loss,
                           heldout_windows, max_abs_logit_diff, search_eps, set_weights)
    from .train import init_draft_state, train_model

    stage = _Stages(log)
    t_start = time.perf_counter()
    save_dtype = getattr(torch, spec.dtype)

    def as_saved(t):  # evaluate exactly the weights that will be written
        return t.to(save_dtype).to(torch.float32)

    with stage("corpus+tokenizer"):
        sh = _shared(log)
    corpus, tok, ids = sh["corpus"], sh["tokenizer"], sh["special_ids"]
    es = spec.eps_search
    windows = heldout_windows(sh["heldout_stream"], es.window_len, es.eval_windows)
    search_w = windows[: es.search_windows]

    with stage("draft init (bigram SVD)"):
        torch.manual_seed(spec.train.seed)
        sd0 = init_draft_state(spec.draft, sh["train_stream"], spec.train.seed)
        draft_cfg = llama_config_dict(spec.draft, dtype=spec.dtype, special_ids=ids,
                                      rms_norm_eps=RMS_NORM_EPS)
        draft = make_hf_model(draft_cfg, sd0)
        init_loss = heldout_loss(draft, windows)
    with stage("draft train"):
        log(f"    AdamW {spec.train.steps} steps x {spec.train.batch_size} x "
            f"{spec.train.seq_len} tokens, {BUILD_NUM_THREADS} threads")
        train_stats = train_model(draft, sh["train_stream"], spec.train, log=log)
        draft_sd = {k: as_saved(v) for k, v in state_dict_of(draft).items()}
        set_weights(draft, draft_sd)
        draft_tokens, draft_loss = greedy_and_loss(draft, windows)
        log(f"    held-out loss {init_loss:.3f} (warm start) -> {draft_loss:.3f}")

    with stage("construct target"):
        cons = construct_target(draft_sd, spec.draft, spec.target,
                                draft_rms_norm_eps=RMS_NORM_EPS, seed=es.seed)
        cons.base = {k: as_saved(v) for k, v in cons.base.items()}
        target_cfg = llama_config_dict(spec.target, dtype=spec.dtype, special_ids=ids,
                                       rms_norm_eps=cons.rms_norm_eps)
        target = make_hf_model(target_cfg, cons.base)
        # Self-check of the construction: at eps = 0 the target is the draft.
        draft_tokens_s = draft_tokens[: es.search_windows]
        eps0_agree = agreement(greedy_tokens(target, search_w), draft_tokens_s)
        eps0_diff = max_abs_logit_diff(draft, target, search_w[:2])
        log(f"    eps=0 check: agreement {eps0_agree:.4f}, max |logit diff| {eps0_diff:.2e}")
        if eps0_agree < 0.98:
            raise RuntimeError(f"constructed target at eps=0 does not match the draft "
                               f"(agreement {eps0_agree:.4f}); construction is broken")

    with stage("choose eps"):
        def delta_weights_at(e: float) -> dict:
            return {k: as_saved(cons.base[k] + e * v) for k, v in cons.delta.items()}

        eps, search_agree, trace = search_eps(target, delta_weights_at, draft_tokens_s,
                                              search_w, es, log=log)
        target_sd = cons.state_dict(eps)
        target_sd = {k: as_saved(v) for k, v in target_sd.items()}
        set_weights(target, target_sd)
        target_tokens, target_loss = greedy_and_loss(target, windows)
        final_agree = agreement(target_tokens, draft_tokens)
        free_agree = free_running_agreement(
            draft, target, windows[:FREE_RUN_PROMPTS, :FREE_RUN_PROMPT_LEN], FREE_RUN_TOKENS)
        in_range = es.low <= final_agree <= es.high
        log(f"    eps {eps:g}: agreement {final_agree:.4f} on {windows.numel()} held-out "
            f"tokens{'' if in_range else ' (OUTSIDE the target range!)'}; "
            f"free-running {free_agree:.4f}; target held-out loss {target_loss:.3f}")

    with stage("write"):
        write_checkpoint(out / "draft", config=draft_cfg, state_dict=draft_sd,
                         tokenizer=tok, special_ids=ids)
        write_checkpoint(out / "target", config=target_cfg, state_dict=target_sd,
                         tokenizer=tok, special_ids=ids)

    timings: dict = {"threads": 1, "prompt_len": 32, "what": (
        "median plain-torch (transformers) single-token decode step, batch 1, KV cache")}
    with stage("time decode step"):
        for role, model in (("draft", draft), ("target", target)):
            timings[f"{role}_decode_ms_float32"] = round(decode_ms_per_token(model), 3)
            if spec.dtype != "float32":
                timings[f"{role}_decode_ms_{spec.dtype}"] = round(
                    decode_ms_per_token(model, dtype=spec.dtype), 3)
        ratio = timings["target_decode_ms_float32"] / timings["draft_decode_ms_float32"]
        timings["target_over_draft_float32"] = round(ratio, 2)
        log("    " + ", ".join(f"{k} {v}" for k, v in timings.items()
                               if k.endswith(("float32", "bfloat16"))))

    timings["train_seconds"] = round(train_stats["seconds"], 3)
    timings["stages_seconds"] = stage.seconds
    timings["build_seconds"] = round(time.perf_counter() - t_start, 3)

    manifest = {
        "corpus": dict(corpus.summary(),
                       digest_of="relative path and text of each file, in order"),
        "tokenizer": {
            "type": "byte-level BPE (tokenizers), saved via PreTrainedTokenizerFast",
            "vocab_size": VOCAB_SIZE,
            "special_tokens": list(SPECIAL_TOKENS),
            **ids,
            "adds_bos": True,
            "trained_on": "corpus train files",
        },
        "spec": spec.to_dict(),
        "draft": {
            "params": count_params(draft_sd),
            "rms_norm_eps": RMS_NORM_EPS,
            "init": ("embed/lm_head from weighted SVD of bigram log-probs; "
                     "projections N(0, 0.02)"),
            "train": {"first_loss": round(train_stats["first_loss"], 5),
                      "last_loss": round(train_stats["last_loss"], 5)},
            "heldout_loss_warm_start": round(init_loss, 5),
            "heldout_loss": round(draft_loss, 5),
        },
        "target": {
            "params": count_params(target_sd),
            "rms_norm_eps": cons.rms_norm_eps,
            "construction": ("draft widened (zero-padded residual, RMSNorm weights x "
                             "sqrt(d_draft/d_target)) and deepened; every new write into "
                             "the residual stream and every new lm_head input x eps"),
            "heldout_loss": round(target_loss, 5),
        },
        "eps": eps,
        "agreement": {
            "value": round(final_agree, 5),
            "metric": ("teacher-forced greedy top-1 agreement draft vs target, plain "
                       "torch float32 on the saved weights, held-out corpus windows"),
            "tokens": int(windows.numel()),
            "windows": int(windows.shape[0]),
            "window_len": int(windows.shape[1]),
            "target_range": [es.low, es.high],
            "in_range": in_range,
            "search_value": round(search_agree, 5),
            "search_tokens": int(search_w.numel()),
            "search_trace": [[e, round(a, 5)] for e, a in trace],
            "free_running": round(free_agree, 5),
            "free_running_metric": (
                f"target greedy-decodes {FREE_RUN_TOKENS} tokens from each of "
                f"{FREE_RUN_PROMPTS} held-out {FREE_RUN_PROMPT_LEN}-token prompts; fraction "
                "the draft predicts greedily (teacher-forced on that output)"),
            "eps0_agreement": round(eps0_agree, 5),
            "eps0_max_abs_logit_diff": float(f"{eps0_diff:.3e}"),
        },
        "files": file_hashes(out),
        "timings": timings,
    }
    return manifest


# --- cache ------------------------------------------------------------------------

@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _remove_stale(vdir: Path, name: str) -> None:
    # Only called with the pair's lock held: any tmp/old folder is a leftover.
    for p in vdir.glob(f".{name}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)
    for p in vdir.glob(f".{name}.old-*"):
        shutil.rmtree(p, ignore_errors=True)


def _ensure(name: str, root: Path | None, force: bool, log: Log) -> tuple[FixturePair, bool]:
    spec = get_pair_spec(name)
    final = pair_dir(name, root)
    vdir = final.parent
    if not force and (pair := load_pair(final)) is not None:
        return pair, False
    vdir.mkdir(parents=True, exist_ok=True)
    with _locked(vdir / f".{name}.lock"):
        if not force and (pair := load_pair(final)) is not None:
            return pair, False  # someone else built it while we waited
        _remove_stale(vdir, name)
        tmp = vdir / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        old = None
        try:
            log(f"building fixture pair {name!r} into {final}")
            manifest = build_pair(spec, tmp, log=log,
                                  downloads=(Path(root) if root else fixtures_root()) / "downloads")
            if final.exists():
                old = vdir / f".{name}.old-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return _pair_from(final, manifest), True


def ensure_pair(name: str, root: Path | None = None, *, force: bool = False,
                log: Log | None = None) -> FixturePair:
    """The fixture pair ``name`` ("ci" or "bench") under ``root`` (default
    ``fixtures_root()``), built first if missing or incomplete (or if ``force``)."""
    return _ensure(name, root, force, log or _log.info)[0]
