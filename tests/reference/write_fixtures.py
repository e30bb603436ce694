#!/usr/bin/python3
"""Writes the PyTorch reference fixtures that loom's model tests compare against.

Builds GPT-2 and Llama with loom's parameterisation (fused qkv weight ((H+2KV)*hd, C),
fused Llama gate|up (2F, C), linear weights (out, in)) directly from torch ops, runs
forward/backward in float64 from float32 initial weights, then 10 AdamW steps with
global grad-norm clipping, and writes one safetensors file per model:

  param.<name>       initial weights (F32)       grad.<name>   gradients at step 0
  final.<name>       weights after 10 steps       tokens, targets (I32, (B,T))
  logits (B,T,V)     loss (1)                     traj (10): loss before each step

Run:  /usr/bin/python3 tests/reference/write_fixtures.py   (needs Debian's python3-torch)
"""
import json, math, os, struct
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OPT = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, grad_clip=1.0, steps=10)


def layout(cfg):
    C, V, Fh, H, KV = cfg["d_model"], cfg["vocab"], cfg["ffn"], cfg["heads"], cfg["kv_heads"]
    hd = C // H
    gpt = cfg["arch"] == "gpt"
    out = [("wte", (V, C))]
    if gpt:
        out.append(("wpe", (cfg["ctx"], C)))
    for l in range(cfg["layers"]):
        p = f"h.{l}."
        out.append((p + "norm1.w", (C,)))
        if gpt: out.append((p + "norm1.b", (C,)))
        out.append((p + "attn.qkv.w", ((H + 2 * KV) * hd, C)))
        if gpt: out.append((p + "attn.qkv.b", ((H + 2 * KV) * hd,)))
        out.append((p + "attn.proj.w", (C, H * hd)))
        if gpt: out.append((p + "attn.proj.b", (C,)))
        out.append((p + "norm2.w", (C,)))
        if gpt: out.append((p + "norm2.b", (C,)))
        out.append((p + "mlp.fc.w", (Fh if gpt else 2 * Fh, C)))
        if gpt: out.append((p + "mlp.fc.b", (Fh,)))
        out.append((p + "mlp.proj.w", (C, Fh)))
        if gpt: out.append((p + "mlp.proj.b", (C,)))
    out.append(("normf.w", (C,)))
    if gpt: out.append(("normf.b", (C,)))
    if not gpt: out.append(("head.w", (V, C)))
    return out


def init_params(cfg, gen):
    ps = {}
    for name, shape in layout(cfg):
        if len(shape) == 1:
            # random norms/biases so their gradients are exercised
            base = 1.0 if name.endswith("norm1.w") or name.endswith("norm2.w") or name == "normf.w" else 0.0
            ps[name] = (base + 0.1 * torch.randn(shape, generator=gen)).float()
        else:
            ps[name] = (0.1 * torch.randn(shape, generator=gen)).float()
    return ps


def rope_tables(T, hd, theta):
    i = torch.arange(hd // 2, dtype=torch.float64)
    t = torch.arange(T, dtype=torch.float64)
    ang = t[:, None] * theta ** (-2.0 * i / hd)[None, :]
    return ang.cos().float().double(), ang.sin().float().double()  # rounded like loom's table


def forward(cfg, P, tokens, linear=F.linear, act=lambda z: z, softmax=lambda a: a.softmax(-1)):
    """linear(x, w, b=None): every linear layer and the head; act(z): applied to q, k, v after
    RoPE and to the MLP pre-activation; softmax(a): the attention probabilities from the
    masked scores (write_bf16_fixtures.py swaps all three)."""
    B, T = tokens.shape
    C, H, KV, Fh = cfg["d_model"], cfg["heads"], cfg["kv_heads"], cfg["ffn"]
    hd, eps, gpt = C // H, cfg["norm_eps"], cfg["arch"] == "gpt"

    def norm(x, w, b):
        if gpt:
            return F.layer_norm(x, (C,), w, b, eps)
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w

    x = P["wte"][tokens]
    if gpt:
        x = x + P["wpe"][:T][None]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if not gpt:
        cos, sin = rope_tables(T, hd, cfg["rope_theta"])
    for l in range(cfg["layers"]):
        p = f"h.{l}."
        h = norm(x, P[p + "norm1.w"], P.get(p + "norm1.b"))
        qkv = linear(h, P[p + "attn.qkv.w"], P.get(p + "attn.qkv.b"))
        q = qkv[..., : H * hd].view(B, T, H, hd).transpose(1, 2)
        k = qkv[..., H * hd : (H + KV) * hd].view(B, T, KV, hd).transpose(1, 2)
        v = qkv[..., (H + KV) * hd :].view(B, T, KV, hd).transpose(1, 2)
        if not gpt:
            def rot(z):
                # fp64 tables for the fp64 model; fp32 ones (a model's buffers) under autocast
                c, s = (cos, sin) if z.dtype == torch.float64 else (cos.float(), sin.float())
                z1, z2 = z[..., : hd // 2], z[..., hd // 2 :]
                return torch.cat([z1 * c - z2 * s, z2 * c + z1 * s], -1)
            q, k = rot(q), rot(k)
        q, k, v = act(q), act(k), act(v)
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = softmax(att.masked_fill(~mask, float("-inf")))
        y = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + linear(y, P[p + "attn.proj.w"], P.get(p + "attn.proj.b"))
        h = norm(x, P[p + "norm2.w"], P.get(p + "norm2.b"))
        f = act(linear(h, P[p + "mlp.fc.w"], P.get(p + "mlp.fc.b")))
        if gpt:
            f = F.gelu(f, approximate="tanh")
        else:
            f = F.silu(f[..., :Fh]) * f[..., Fh:]
        x = x + linear(f, P[p + "mlp.proj.w"], P.get(p + "mlp.proj.b"))
    x = norm(x, P["normf.w"], P.get("normf.b"))
    return linear(x, P["wte"] if gpt else P["head.w"])


def write_safetensors(path, tensors, metadata):
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        dt = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def make_fixture(name, cfg, B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    P32 = init_params(cfg, gen)
    tokens = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int64)
    P = {k: v.double().requires_grad_(True) for k, v in P32.items()}
    logits = forward(cfg, P, tokens)
    loss = F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1))
    loss.backward()
    out = {"param." + k: v for k, v in P32.items()}
    out.update({"grad." + k: v.grad.float() for k, v in P.items()})
    out["logits"] = logits.detach().float()
    out["loss"] = loss.detach().float().view(1)
    out["tokens"] = tokens.int()
    out["targets"] = targets.int()

    # 10 AdamW steps on the same batch: decay on matrices only, clip the global norm.
    names = list(P.keys())
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPT["lr"], betas=OPT["betas"], eps=OPT["eps"])
    traj = []
    for _ in range(OPT["steps"]):
        opt.zero_grad()
        l = F.cross_entropy(forward(cfg, P, tokens).view(-1, cfg["vocab"]), targets.view(-1))
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), OPT["grad_clip"])
        opt.step()
        traj.append(l.item())
    out["traj"] = torch.tensor(traj, dtype=torch.float32)
    out.update({"final." + k: v.detach().float() for k, v in P.items()})
    meta = {"model": json.dumps(cfg), "optim": json.dumps(OPT), "batch": str(B), "seq": str(T)}
    path = os.path.join(HERE, "fixtures", name + ".safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss {loss.item():.6f}, traj {traj[0]:.5f} -> {traj[-1]:.5f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    base = dict(norm_eps=1e-5, rope_theta=10000.0, ctx=16, vocab=256)
    # d_model 36 is not a multiple of 16; T = 13 is odd.
    make_fixture("gpt2", dict(base, arch="gpt", layers=2, d_model=36, heads=4, kv_heads=4, ffn=144), 2, 13, 1)
    make_fixture("llama", dict(base, arch="llama", layers=2, d_model=48, heads=4, kv_heads=2, ffn=72), 2, 13, 2)
