"""What limits the smol draft (0.347 teacher-forced agreement): distillation compute or
draft capacity?  One GPU run, time-boxed; results JSON rewritten after every evaluation.

Variants (in this order; each initialised like real_pair.py: target embedding (frozen),
first L target layers, final norm, untied head = embedding copy, trained):
  r  replica of the CPU recipe: 300 AdamW steps x 8 windows x 256 tokens, KL on 64
     random positions per window, float32, lr 2e-3, warm-up 20, cosine to 0.1 (same
     windows, same seeded order and positions as distill.py); should land near 0.347
  a  L=4, batch B x T (default 64 x 512) from the train stream, KL(target||draft) on all
     positions 1..T-1, bf16 autocast, lr 2e-3, warm-up 20 steps, cosine to 0.1 over the
     steps that fit the variant's time share
  b  L=8, same recipe, smaller time share
  c  L=4 with a reduced-vocabulary head (16,384 most frequent training-stream tokens,
     FR-Spec style): KL(target renormalised over the subset || draft); agreement counts a
     miss whenever the target's argmax is outside the subset

Evaluation = manifest agreement.value: 32 held-out windows x 256, positions 32.., 7,168
tokens; target and draft in float32 (draft weights rounded to bf16, like the saved draft),
no TF32; target argmax compared with the CPU reference computed by prepare.py.

  python experiments/distill_ceiling/distill_ceiling.py --weights1 W1 --part2 DIR --out results.json [--budget 420]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

T_START = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T_START:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- weights
def unpack(path) -> dict:
    z = np.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())))
    return {k: z[k] for k in z.files}


def dequant(packed: dict) -> dict:
    """packed arrays (prepare.gguf_to_packed) -> {HF name: bfloat16 tensor}. Exactly
    gguf-py's float32 arithmetic (separate multiply and add), then a bf16 cast, as the
    builder did (transformers' GGUF load in float32 -> .to(bfloat16))."""
    import torch
    out = {}
    names = sorted({k.split("|")[0] for k in packed})
    for name in names:
        if name + "|f32" in packed:
            w = torch.from_numpy(np.array(packed[name + "|f32"], dtype=np.float32))
        elif name + "|q4qs" in packed:
            qs = torch.from_numpy(np.array(packed[name + "|q4qs"]))        # [R, nb, 16] u8
            d = torch.from_numpy(np.array(packed[name + "|q4d"])).float()[..., None]
            m = torch.from_numpy(np.array(packed[name + "|q4m"])).float()[..., None]
            q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()             # [R, nb, 32]
            w = (d * q) + m
            w = w.reshape(w.shape[0], -1)
        elif name + "|q8x" in packed:
            x = torch.from_numpy(np.array(packed[name + "|q8x"]))         # [R, nb*32] i8
            d = torch.from_numpy(np.array(packed[name + "|q8d"])).float()  # [R, nb]
            r = x.shape[0]
            w = (x.float().reshape(r, -1, 32) * d[..., None]).reshape(r, -1)
        else:
            raise KeyError(name)
        out[name] = w.to(torch.bfloat16).contiguous()
    return out


def sha_bf16(t) -> str:
    import torch
    return hashlib.sha256(t.detach().cpu().to(torch.bfloat16).contiguous().view(torch.int16)
                          .numpy().tobytes()).hexdigest()


def make_model(cfg: dict, n_layers: int | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    c = {k: v for k, v in cfg.items() if k not in ("torch_dtype", "dtype", "architectures")}
    if n_layers is not None:
        c["num_hidden_layers"] = n_layers
        c["tie_word_embeddings"] = False
    hf = LlamaConfig(**c)
    hf._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        return LlamaForCausalLM(hf).to(torch.float32)


# ---------------------------------------------------------------- loss
def kl_fn():
    import torch

    class KLFromLogits(torch.autograd.Function):
        """sum over rows of KL(p_t || softmax(s)); s: [N, V] logits (any dtype), t_logp:
        [N, V] float32 teacher log-probs. Saves only the gradient (softmax(s) - p_t)."""

        @staticmethod
        def forward(ctx, s, t_logp):
            s_logp = torch.log_softmax(s.float(), dim=-1)
            p_t = t_logp.exp()
            loss = (p_t * (t_logp - s_logp)).sum()
            ctx.save_for_backward((s_logp.exp_() - p_t).to(s.dtype))
            return loss

        @staticmethod
        def backward(ctx, go):
            (g,) = ctx.saved_tensors
            return g * go.to(g.dtype), None

    return KLFromLogits.apply


# ---------------------------------------------------------------- experiment
class Run:
    def __init__(self, a):
        import torch
        self.a = a
        self.dev = torch.device(a.device)
        self.results = {"args": vars(a), "variants": {}, "notes": []}
        self.kl = kl_fn()

    def save(self):
        p = Path(self.a.out)
        tmp = p.with_suffix(".tmp")
        self.results["elapsed_s"] = round(time.time() - T_START, 1)
        tmp.write_text(json.dumps(self.results, indent=1))
        os.replace(tmp, p)

    # -------------------------------------------------------- setup
    def setup(self):
        import torch
        a = self.a
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        r = self.results
        r["torch"] = torch.__version__
        import transformers
        r["transformers"] = transformers.__version__
        if self.dev.type == "cuda":
            r["gpu"] = torch.cuda.get_device_name(0)
        log(f"torch {torch.__version__}, transformers {transformers.__version__}, device "
            f"{r.get('gpu', 'cpu')}")
        meta = json.loads((Path(a.part2) / "meta.json").read_text())
        self.meta = meta
        r["data"] = meta.get("data")
        cfg = meta["target_config"]
        self.cfg = cfg
        packed = unpack(a.weights1) | unpack(Path(a.part2) / "weights2.bin")
        sd = dequant(packed)
        del packed
        want = meta["target_sha256_bf16"]
        bad = [k for k in want if k not in sd or sha_bf16(sd[k]) != want[k]]
        r["target_check"] = {"tensors": len(want), "sha256_mismatches": bad,
                             "ok": not bad and set(sd) == set(want)}
        log(f"target weights: {len(sd)} tensors, sha256 vs our bf16 target: "
            f"{'ALL EQUAL' if not bad else f'{len(bad)} MISMATCH'}")
        if bad:
            self.save()
            raise SystemExit("target weights differ from our bf16 target")
        self.target_sd = sd
        d = unpack(Path(a.part2) / "data.bin")
        self.stream = d["stream"].astype(np.int64)
        self.replica = torch.from_numpy(d["replica"].astype(np.int64))
        ev = d["eval"].astype(np.int64)
        ref = d["ref_argmax"]
        if a.eval_windows:
            ev, ref = ev[:a.eval_windows], ref[:a.eval_windows]
        self.eval_x = torch.from_numpy(ev).to(self.dev)
        self.top = torch.from_numpy(d["top16k"].astype(np.int64)).to(self.dev)
        log(f"data: stream {self.stream.size} tokens, replica {tuple(self.replica.shape)}, "
            f"eval {tuple(self.eval_x.shape)}")

        # target, float32 (from the bf16 weights) for the evaluation reference
        tgt = make_model(cfg)
        tgt.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        tgt.tie_weights()
        tgt.to(self.dev).eval()
        t0 = time.time()
        with torch.inference_mode():
            lps = []
            for i in range(0, self.eval_x.shape[0], 8):
                lg = tgt(input_ids=self.eval_x[i:i + 8]).logits[:, a.from_pos:].float()
                lps.append(torch.log_softmax(lg, -1).reshape(-1, lg.shape[-1]))
            self.eval_tlogp = torch.cat(lps)                            # [N, V] fp32
        self.eval_targmax = self.eval_tlogp.argmax(-1)
        same = (self.eval_targmax.cpu().numpy() == ref.reshape(-1)).mean()
        in_top = torch.isin(self.eval_targmax, self.top).float().mean().item()
        r["eval"] = {"tokens": int(self.eval_targmax.numel()),
                     "target_argmax_equal_to_cpu_reference": float(same),
                     "target_argmax_in_top16k": in_top,
                     "seconds": round(time.time() - t0, 2)}
        log(f"eval reference: {self.eval_targmax.numel()} tokens; GPU fp32 target argmax "
            f"equals CPU reference on {same:.5f}; share in top-16k {in_top:.4f}")
        # training teacher: the same weights, bf16 (exact) for speed
        self.teacher_fp32 = tgt
        self.save()

    # -------------------------------------------------------- draft
    def new_draft(self, n_layers: int, vocab_subset: bool):
        import torch
        sd = {}
        for k, v in self.target_sd.items():
            if k.startswith("model.layers."):
                i = int(k.split(".")[2])
                if i < n_layers:
                    sd[k] = v.float().clone()
            else:
                sd[k] = v.float().clone()
        m = make_model(self.cfg, n_layers)
        missing, unexpected = m.load_state_dict(sd, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        base = m.model.to(self.dev)
        for p in base.embed_tokens.parameters():
            p.requires_grad_(False)
        emb = base.embed_tokens.weight.detach()
        head = emb[self.top].clone() if vocab_subset else emb.clone()
        head = torch.nn.Parameter(head)
        return base, head

    def evaluate(self, base, head, vocab_subset: bool) -> dict:
        """Agreement as the manifest's metric (float32, draft weights rounded to bf16)."""
        import torch
        params = [p for p in base.parameters()] + [head]
        saved = [p.detach().clone() for p in params]
        was_training = base.training
        base.eval()
        hit = tot = 0
        kl_sum = 0.0
        with torch.no_grad():
            for p in params:
                p.copy_(p.to(torch.bfloat16).float())
            for i in range(0, self.eval_x.shape[0], 8):
                x = self.eval_x[i:i + 8]
                h = base(input_ids=x).last_hidden_state[:, self.a.from_pos:].float()
                lg = (h @ head.T).reshape(-1, head.shape[0])
                j0 = i * (x.shape[1] - self.a.from_pos)
                t_lp = self.eval_tlogp[j0:j0 + lg.shape[0]]
                t_am = self.eval_targmax[j0:j0 + lg.shape[0]]
                if vocab_subset:
                    pred = self.top[lg.argmax(-1)]
                    t_lp = torch.log_softmax(t_lp[:, self.top], -1)
                else:
                    pred = lg.argmax(-1)
                s_lp = torch.log_softmax(lg, -1)
                kl_sum += float((t_lp.exp() * (t_lp - s_lp)).sum())
                hit += int((pred == t_am).sum())
                tot += t_am.numel()
            for p, s in zip(params, saved):
                p.copy_(s)
        base.train(was_training)
        out = {"agreement": hit / tot, "heldout_kl": kl_sum / tot, "eval_tokens": tot}
        if vocab_subset:
            cov = float(torch.isin(self.eval_targmax, self.top).float().mean())
            out["target_argmax_in_subset"] = cov
            out["agreement_when_target_argmax_in_subset"] = (hit / tot) / max(cov, 1e-9)
            out["heldout_kl_note"] = "KL(target renormalised over the subset || draft)"
        return out

    # -------------------------------------------------------- replica of the CPU recipe
    def replica_run(self, name: str):
        import torch
        a = self.a
        steps, bs, positions, lr, warm, min_ratio, seed = a.replica_steps, 8, 64, 2e-3, 20, 0.1, 1234
        res = {"what": "CPU recipe replica: 300 steps x 8 x 256, KL on 64 random positions/"
                       "window, float32, same windows/order/positions as distill.py",
               "layers": 4, "curve": []}
        self.results["variants"][name] = res
        base, head = self.new_draft(4, False)
        t_base = self.teacher_fp32.model
        t_head = self.teacher_fp32.lm_head.weight
        params = [p for p in base.parameters() if p.requires_grad] + [head]
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        g = torch.Generator().manual_seed(seed)
        windows = self.replica
        n, t_len = windows.shape
        order = torch.randperm(n, generator=g)
        cursor, losses = 0, []
        base.train()
        self._sync()
        t0 = time.time()
        for step in range(steps):
            frac = step / max(1, steps - 1)
            lr_now = lr * (step + 1) / warm if step < warm else \
                lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
            for gr in opt.param_groups:
                gr["lr"] = lr_now
            idx = order[torch.arange(cursor, cursor + bs) % n]
            cursor += bs
            x = windows[idx].to(self.dev)
            pos = torch.stack([1 + torch.randperm(t_len - 1, generator=g)[:positions]
                               for _ in range(bs)]).to(self.dev)
            rows = torch.arange(bs, device=self.dev)[:, None]
            with torch.no_grad():
                th = t_base(input_ids=x).last_hidden_state[rows, pos]
                t_logp = torch.log_softmax(th.float() @ t_head.T, dim=-1)
            sh = base(input_ids=x).last_hidden_state[rows, pos]
            s_logp = torch.log_softmax(sh @ head.T, dim=-1)
            loss = torch.nn.functional.kl_div(s_logp, t_logp, log_target=True,
                                              reduction="sum") / (bs * positions)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(loss.item())
            if step % 50 == 0 or step == steps - 1:
                log(f"  {name} step {step + 1}/{steps} KL {losses[-1]:.3f}")
        self._sync()
        res["seconds"] = round(time.time() - t0, 2)
        res["tokens"] = steps * bs * t_len
        res["first_kl"], res["last_kl"] = losses[0], sum(losses[-10:]) / len(losses[-10:])
        ev = self.evaluate(base, head, False)
        res["curve"].append({"tokens": res["tokens"], "step": steps, **ev})
        res["final"] = ev
        log(f"  {name}: agreement {ev['agreement']:.4f} (CPU build: 0.34654), held-out KL "
            f"{ev['heldout_kl']:.3f}, train KL {res['last_kl']:.3f}, {res['seconds']}s")
        self.save()
        del base, head, opt

    # -------------------------------------------------------- big-batch runs
    def _sync(self):
        import torch
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def big_run(self, name: str, n_layers: int, vocab_subset: bool, budget_s: float):
        import torch
        a = self.a
        B, T, micro = a.batch, a.seq, a.micro
        assert B % micro == 0
        lr, warm, min_ratio = a.lr, a.warmup, 0.1
        res = {"layers": n_layers, "vocab": int(self.top.numel()) if vocab_subset else
               self.cfg["vocab_size"], "batch": B, "seq": T, "positions": "1..T-1 (all but 0)",
               "lr": lr, "warmup_steps": warm, "schedule": "linear warm-up, cosine to 0.1 of lr "
               "over the planned steps", "budget_s": round(budget_s, 1), "curve": [],
               "train_loss": []}
        self.results["variants"][name] = res
        base, head = self.new_draft(n_layers, vocab_subset)
        params = [p for p in base.parameters() if p.requires_grad] + [head]
        res["trained_params"] = int(sum(p.numel() for p in params))
        fused = self.dev.type == "cuda"
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0,
                                fused=fused)
        tb = self.teacher_bf16
        t_emb = tb.model.embed_tokens.weight                       # tied head, bf16
        chunks = self.stream[: self.stream.size // T * T].reshape(-1, T)
        n_chunks = chunks.shape[0]
        rng = np.random.default_rng(1234)
        perm, cursor, epoch = rng.permutation(n_chunks), 0, 0
        evals = [int(x * 1e6) for x in a.eval_at_m] 
        next_eval = 0
        planned = a.max_steps or 10 ** 9
        tokens, step, train_s = 0, 0, 0.0
        t_var = time.time()
        deadline = t_var + budget_s
        ac = torch.autocast(self.dev.type, dtype=torch.bfloat16)
        base.train()
        ema = None
        step_times = []
        while step < planned:
            self._sync()
            ts = time.time()
            if step < warm:
                lr_now = lr * (step + 1) / warm
            else:
                frac = (step - warm) / max(1, planned - warm - 1)
                lr_now = lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))
            for gr in opt.param_groups:
                gr["lr"] = lr_now
            if cursor + B > n_chunks:
                perm, cursor, epoch = rng.permutation(n_chunks), 0, epoch + 1
            xb = torch.from_numpy(chunks[perm[cursor:cursor + B]]).to(self.dev, non_blocking=True)
            cursor += B
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            n_pos = B * (T - 1)
            for j in range(0, B, micro):
                x = xb[j:j + micro]
                with torch.no_grad(), ac:
                    th = tb.model(input_ids=x).last_hidden_state[:, 1:]
                    tl = (th @ t_emb.T).float().reshape(-1, t_emb.shape[0])
                    if vocab_subset:
                        tl = tl[:, self.top]
                    t_logp = torch.log_softmax(tl, -1)
                    del th, tl
                with ac:
                    sh = base(input_ids=x).last_hidden_state[:, 1:]
                    sl = (sh @ head.T).reshape(-1, head.shape[0])
                loss = self.kl(sl, t_logp) / n_pos
                loss.backward()
                loss_sum += float(loss.detach())
                del t_logp, sl, sh, loss
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()
            step += 1
            tokens += B * T
            self._sync()
            dt = time.time() - ts
            train_s += dt
            step_times.append(dt)
            ema = loss_sum if ema is None else 0.9 * ema + 0.1 * loss_sum
            if step % a.log_every == 0 or step <= 3:
                res["train_loss"].append({"step": step, "tokens": tokens, "kl": round(loss_sum, 4),
                                          "kl_ema": round(ema, 4), "lr": lr_now})
                log(f"  {name} step {step}/{planned if planned < 10**9 else '?'} "
                    f"tok {tokens/1e6:.2f}M KL {loss_sum:.3f} (ema {ema:.3f}) lr {lr_now:.2e} "
                    f"{B*T/dt:,.0f} tok/s")
            if step == a.plan_after and not a.max_steps:
                # plan the cosine from the measured step time (steps 3.. exclude warm-up)
                st = float(np.median(step_times[2:])) if len(step_times) > 3 else dt
                n_eval_left = sum(1 for e in evals if e > tokens) + 1
                left = deadline - time.time() - n_eval_left * self.eval_cost
                planned = max(step + 1, step + int(left / st))
                cap = int(a.max_tokens_m * 1e6) // (B * T)
                planned = min(planned, cap)
                res["planned_steps"] = planned
                res["step_seconds"] = st
                log(f"  {name}: {st*1000:.0f} ms/step -> {planned} steps "
                    f"({planned*B*T/1e6:.1f}M tokens) in the {budget_s:.0f}s share")
            if next_eval < len(evals) and tokens >= evals[next_eval] or step == planned:
                while next_eval < len(evals) and tokens >= evals[next_eval]:
                    next_eval += 1
                te = time.time()
                ev = self.evaluate(base, head, vocab_subset)
                self.eval_cost = max(self.eval_cost, time.time() - te)
                res["curve"].append({"tokens": tokens, "step": step, "epoch": round(tokens / (n_chunks * T), 3),
                                     "train_kl_ema": round(ema, 4), "lr": lr_now, **ev})
                res["tokens"], res["steps"], res["train_seconds"] = tokens, step, round(train_s, 2)
                res["tokens_per_s"] = round(tokens / train_s, 1)
                log(f"  {name} EVAL @ {tokens/1e6:.2f}M tok: agreement {ev['agreement']:.4f} "
                    f"held-out KL {ev['heldout_kl']:.3f} (train KL ema {ema:.3f})")
                self.save()
            if time.time() > deadline + 5 and step < planned:
                res["stopped"] = "deadline"
                ev = self.evaluate(base, head, vocab_subset)
                res["curve"].append({"tokens": tokens, "step": step, "train_kl_ema": round(ema, 4),
                                     "lr": lr_now, **ev})
                break
        res["tokens"], res["steps"], res["train_seconds"] = tokens, step, round(train_s, 2)
        res["tokens_per_s"] = round(tokens / max(train_s, 1e-9), 1)
        res["epochs"] = round(tokens / (n_chunks * T), 3)
        res["final"] = res["curve"][-1] if res["curve"] else None
        if self.dev.type == "cuda":
            res["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["wall_s"] = round(time.time() - t_var, 1)
        self.save()
        log(f"  {name} done: {tokens/1e6:.2f}M tokens, {res['tokens_per_s']:,.0f} tok/s, "
            f"final agreement {res['final']['agreement'] if res['final'] else None}")
        del base, head, opt
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()

    def main(self):
        import torch
        a = self.a
        self.setup()
        self.eval_cost = 1.0
        self.teacher_bf16 = make_model(self.cfg)
        self.teacher_bf16.load_state_dict({k: v.float() for k, v in self.target_sd.items()},
                                          strict=False)
        self.teacher_bf16.tie_weights()
        self.teacher_bf16.to(self.dev).to(torch.bfloat16).eval()
        for p in self.teacher_bf16.parameters():
            p.requires_grad_(False)
        bad = [k for k, v in self.teacher_bf16.state_dict().items()
               if k in self.target_sd and not torch.equal(v.cpu().view(torch.int16),
                                                          self.target_sd[k].view(torch.int16))]
        assert not bad, bad
        deadline = T_START + a.budget
        self.results["budget_s"] = a.budget
        shares = {"a": a.share_a, "b": a.share_b, "c": a.share_c}
        order = [v for v in a.variants.split(",") if v]
        for i, v in enumerate(order):
            left = deadline - time.time()
            if left < 10 and v != "r":
                self.results["notes"].append(f"variant {v} skipped: no time left")
                log(f"skip {v}: {left:.0f}s left")
                continue
            if v == "r":
                log("variant r (CPU recipe replica)")
                try:
                    self.replica_run("r_replica_L4")
                except Exception as e:  # noqa: BLE001
                    import traceback
                    traceback.print_exc()
                    self.results["notes"].append(f"replica failed: {type(e).__name__}: {e}"[:500])
                continue
            rest = [w for w in order[i:] if w != "r"]
            share = shares[v] / sum(shares[w] for w in rest)
            budget = max(5.0, left * share)
            spec = {"a": ("a_L4", 4, False), "b": ("b_L8", 8, False), "c": ("c_L4_vocab16k", 4, True)}[v]
            log(f"variant {spec[0]}: {budget:.0f}s of {left:.0f}s left")
            t_v = time.time()
            try:
                self.big_run(spec[0], spec[1], spec[2], budget)
            except torch.OutOfMemoryError as e:   # retry once with half the micro-batch
                import gc
                gc.collect()
                torch.cuda.empty_cache()
                self.results["notes"].append(f"{spec[0]}: OOM at micro {a.micro}: {str(e)[:200]}")
                log(f"{spec[0]}: OOM at micro {a.micro}; retrying with micro {a.micro // 2}")
                a.micro //= 2
                budget = max(5.0, budget - (time.time() - t_v))
                try:
                    self.big_run(spec[0], spec[1], spec[2], budget)
                except Exception as e2:  # noqa: BLE001
                    self.results["notes"].append(f"{spec[0]} failed: {type(e2).__name__}: {e2}"[:500])
                    log(f"{spec[0]} FAILED: {e2!r}")
            except Exception as e:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                self.results["notes"].append(f"{spec[0]} failed: {type(e).__name__}: {e}"[:500])
                log(f"{spec[0]} FAILED: {e!r}")
            self.save()
        self.results["done"] = True
        self.save()
        log("all done")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights1", required=True)
    ap.add_argument("--part2", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="wall seconds from start to the end of the last variant's training")
    ap.add_argument("--variants", default="r,a,b,c")
    ap.add_argument("--share-a", type=float, default=0.45)
    ap.add_argument("--share-b", type=float, default=0.30)
    ap.add_argument("--share-c", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--micro", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--plan-after", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=0, help="fixed step count (dry runs)")
    ap.add_argument("--max-tokens-m", type=float, default=80.0)
    ap.add_argument("--eval-at-m", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.3, 0.6, 1.2, 2.5, 5, 10, 20, 40, 60])
    ap.add_argument("--replica-steps", type=int, default=300)
    ap.add_argument("--eval-windows", type=int, default=0, help="0 = all 32")
    ap.add_argument("--from-pos", type=int, default=32)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
    Run(a).main()


if __name__ == "__main__":
    main()
