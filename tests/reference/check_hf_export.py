#!/usr/bin/python3
"""Loads a `loom export` safetensors file the way the Python ecosystem names it (Hugging
Face GPT-2 / Llama tensor names and layouts), runs a forward pass written from those
conventions alone (not from loom's layout), and checks that its greedy continuation of a
prompt equals `loom sample --temperature 0` from the same checkpoint.

usage: check_hf_export.py LOOM_BINARY CHECKPOINT_DIR [PROMPT] [TOKENS] [fp32|bf16]
With bf16 the export is `--dtype bf16` (BF16 tensors, torch_dtype bfloat16), and loom's side
samples from that file imported back (`loom import`: BF16 widened exactly), so both sides
run on the same bf16-rounded weights.
Exit 0 on a match, 1 on a mismatch, 77 when PyTorch is missing (ctest skip).
Needs Debian's python3-torch (scripts/setup.sh --oracle); the safetensors file is parsed
here directly (Debian 12 has no python3-safetensors).
"""
import json
import math
import struct
import subprocess
import sys
import tempfile
import tomllib

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: python3-torch is not installed (scripts/setup.sh --oracle)")
    sys.exit(77)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        assert h["dtype"] in ("F32", "BF16"), f"{name}: dtype {h['dtype']}"
        lo, hi = h["data_offsets"]
        dtype = torch.float32 if h["dtype"] == "F32" else torch.bfloat16
        out[name] = torch.frombuffer(bytearray(data[lo:hi]), dtype=dtype).reshape(h["shape"]).float()
    return out, meta


def gpt2_logits(W, cfg, ids):
    C, H, eps = cfg["d_model"], cfg["heads"], cfg["norm_eps"]
    T, hd = len(ids), C // H
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["layers"]):
        p = f"transformer.h.{l}."
        conv = lambda t, name: t @ W[p + name + ".weight"] + W[p + name + ".bias"]  # HF Conv1D: (in, out)
        h = F.layer_norm(x, (C,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        q, k, v = conv(h, "attn.c_attn").split(C, -1)
        q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + conv((att @ v).transpose(0, 1).reshape(T, C), "attn.c_proj")
        h = F.layer_norm(x, (C,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        x = x + conv(F.gelu(conv(h, "mlp.c_fc"), approximate="tanh"), "mlp.c_proj")
    x = F.layer_norm(x, (C,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    return x[-1] @ W["transformer.wte.weight"].T


def llama_logits(W, cfg, ids):
    C, H, KV, eps = cfg["d_model"], cfg["heads"], cfg["kv_heads"], cfg["norm_eps"]
    T, hd = len(ids), C // H
    rms = lambda t, w: t * torch.rsqrt((t * t).mean(-1, keepdim=True) + eps) * w
    inv = cfg["rope_theta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
    rot = lambda t: torch.cat([-t[..., hd // 2:], t[..., : hd // 2]], -1)  # HF rotate_half
    x = W["model.embed_tokens.weight"][ids]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["layers"]):
        p = f"model.layers.{l}."
        lin = lambda t, name: t @ W[p + name + ".weight"].T  # nn.Linear: (out, in)
        h = rms(x, W[p + "input_layernorm.weight"])
        q = lin(h, "self_attn.q_proj").view(T, H, hd).transpose(0, 1)
        k = lin(h, "self_attn.k_proj").view(T, KV, hd).transpose(0, 1)
        v = lin(h, "self_attn.v_proj").view(T, KV, hd).transpose(0, 1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        k, v = k.repeat_interleave(H // KV, 0), v.repeat_interleave(H // KV, 0)
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + lin((att @ v).transpose(0, 1).reshape(T, C), "self_attn.o_proj")
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        x = x + lin(F.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj"), "mlp.down_proj")
    x = rms(x, W["model.norm.weight"])
    return x[-1] @ W["lm_head.weight"].T


def main():
    loom, ckpt = sys.argv[1], sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) > 3 else "The "
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 24
    dtype = sys.argv[5] if len(sys.argv) > 5 else "fp32"
    tmp_dir = tempfile.TemporaryDirectory()
    tmp = tmp_dir.name
    path = tmp + "/model.safetensors"
    subprocess.run([loom, "export", "--checkpoint", ckpt, "--format", "safetensors", "--out", path, "--dtype", dtype],
                   check=True, capture_output=True)
    W, meta = read_safetensors(path)
    want = "bfloat16" if dtype == "bf16" else "float32"
    if meta.get("torch_dtype") != want:
        print(f"export --dtype {dtype}: metadata torch_dtype {meta.get('torch_dtype')!r}, expected {want!r}")
        return 1
    if dtype == "bf16":  # loom samples from the bf16 file imported back
        ckpt = tmp + "/imported"
        subprocess.run([loom, "import", "--format", "safetensors", "--in", path, "--checkpoint", ckpt], check=True,
                       capture_output=True)
    cfg = tomllib.loads(meta["loom_config"])["model"]
    logits_fn = llama_logits if "model.embed_tokens.weight" in W else gpt2_logits
    ids = list(prompt.encode())
    gaps = []
    with torch.no_grad():
        for _ in range(tokens):
            logits = logits_fn(W, cfg, ids[-cfg["ctx"]:])[:256]  # the byte tokenizer's range
            top2 = logits.topk(2).values
            gaps.append(float(top2[0] - top2[1]))
            ids.append(int(logits.argmax()))
    ours = bytes(ids[len(prompt.encode()):]).decode("utf-8", errors="replace")  # loom prints the continuation
    run = subprocess.run([loom, "sample", "--checkpoint", ckpt, "--prompt", prompt, "--tokens", str(tokens),
                          "--temperature", "0"], check=True, capture_output=True)
    theirs = run.stdout.decode("utf-8", errors="replace").rstrip("\n")
    arch = "llama" if logits_fn is llama_logits else "gpt2"
    if ours.rstrip("\n") == theirs:
        print(f"{arch} ({dtype}): the HF-named export reproduces loom's greedy continuation ({tokens} tokens; "
              f"smallest top-2 logit gap {min(gaps):.4f})")
        return 0
    print(f"{arch}: MISMATCH\n python: {ours!r}\n loom:   {theirs!r}\n smallest top-2 gap {min(gaps):.5f}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
