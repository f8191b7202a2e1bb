"""A Llama-architecture causal LM in plain torch, reading a Hugging Face checkpoint and
attending over the plugin's own paged KV cache.

Why not vLLM's model class: vLLM's attention layers bind to the target's KV-cache
groups and forward context; the draft here owns its cache, block tables and
rollback, so it runs its own (small) forward. Supports GQA, untied or tied
embeddings, and Llama-3 RoPE scaling (the Llama-3.2 production drafts use it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from vllm_specdec_plugin.kv.paged_cache import BatchLayout, PagedKVCache


def _rope_inv_freq(cfg: dict, head_dim: int) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim/2], with Llama-3 scaling when configured."""
    # Checkpoints written by transformers < 5 (e.g. the published Llama-3.2 configs)
    # use rope_theta + rope_scaling; transformers >= 5 writes rope_parameters.
    rs = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(rs.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return inv.float()
    if kind != "llama3":
        raise ValueError(f"draft rope_scaling type {kind!r} is not supported (default, llama3)")
    factor = rs["factor"]
    lo, hi = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    lo_wavelen, hi_wavelen = old / lo, old / hi
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < hi_wavelen:
            out.append(f)
        elif wavelen > lo_wavelen:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


class DraftLlama:
    """Weights and forward of the draft. Not an nn.Module: inference only, no autograd."""

    def __init__(self, path: str | Path, dtype: torch.dtype, device: torch.device):
        from safetensors.torch import load_file

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        self.config = cfg
        self.hidden = cfg["hidden_size"]
        self.num_layers = cfg["num_hidden_layers"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads", self.num_heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.num_heads
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.vocab_size = cfg["vocab_size"]
        self.dtype, self.device = dtype, device

        weights: dict[str, torch.Tensor] = {}
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in draft folder {path}")
        for f in files:
            weights.update(load_file(str(f)))
        w = {k.removeprefix("model."): v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embed = w["embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)  # tied when absent
        self.norm = w["norm.weight"]
        self.layers = []
        for i in range(self.num_layers):
            p = f"layers.{i}."
            qkv = torch.cat([w[p + "self_attn.q_proj.weight"], w[p + "self_attn.k_proj.weight"],
                             w[p + "self_attn.v_proj.weight"]], 0)
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], 0)
            self.layers.append(dict(
                ln1=w[p + "input_layernorm.weight"], qkv=qkv, o=w[p + "self_attn.o_proj.weight"],
                ln2=w[p + "post_attention_layernorm.weight"], gate_up=gate_up,
                down=w[p + "mlp.down_proj.weight"]))
        self.intermediate = self.layers[0]["down"].shape[1]
        inv = _rope_inv_freq(cfg, self.head_dim).to(device)
        max_pos = int(cfg.get("max_position_embeddings", 2048))
        freqs = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], -1)
        self._cos, self._sin = emb.cos().to(dtype), emb.sin().to(dtype)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # Same as HF LlamaRMSNorm: normalise in float32, scale in the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [T, H, D]; cos/sin [T, 1, D]
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return x * cos + rot * sin

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, layout: BatchLayout,
                cache: PagedKVCache) -> torch.Tensor:
        """Run new tokens through the draft, writing their KV into ``cache``.

        tokens: [T] int64, flat over requests in layout order.
        Returns logits [B, V] float32 at each request's last new token.
        """
        positions, slots = layout.positions, layout.new_slots
        H, KV, D = self.num_heads, self.num_kv_heads, self.head_dim
        B, Q = layout.num_rows, layout.max_query
        x = self.embed[tokens]                                        # [T, hidden]
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]
        for li, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            qkv = h @ L["qkv"].T
            q = qkv[:, : H * D].view(-1, H, D)
            k = qkv[:, H * D:(H + KV) * D].view(-1, KV, D)
            v = qkv[:, (H + KV) * D:].view(-1, KV, D)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            cache.write(li, slots, k, v)
            kc, vc = cache.gather(li, layout.kv_slots)                # [B, L, KV, D]
            qp = q.new_zeros((B, Q, H, D))
            qp[layout.token_rows, layout.token_cols] = q
            attn = F.scaled_dot_product_attention(
                qp.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                attn_mask=layout.mask, enable_gqa=(KV != H))          # [B, H, Q, D]
            attn = attn.transpose(1, 2)[layout.token_rows, layout.token_cols]  # [T, H, D]
            x = x + attn.reshape(-1, H * D) @ L["o"].T
            h = self._rms(x, L["ln2"])
            gu = h @ L["gate_up"].T
            g, u = gu[:, : self.intermediate], gu[:, self.intermediate:]
            x = x + (F.silu(g) * u) @ L["down"].T
        last = self._rms(x[layout.last_token], self.norm)
        return (last @ self.lm_head.T).float()
