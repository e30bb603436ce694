#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (issue 20): GPT-2 (pre-LN, GELU-tanh, learned positions,
tied head) in bf16 autocast with fp32 master weights and AdamW, on one CUDA device.

  cuda_torch_peer.py gemm                       bf16 GEMM peak (8192^3, random data)
  cuda_torch_peer.py train MODE B T STEPS       MODE eager | compile: tokens/s and MFU
  cuda_torch_peer.py curve WEIGHTS TOKENS STEPS loss per step from loom's initial weights
                                                (safetensors) on loom's token file

Model FLOPs per token (PaLM appendix B): 6 N + 12 L C T, N = all parameters; MFU divides
by the measured bf16 GEMM peak of the same device. Prints one JSON line per result."""
import json, math, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

GPT2 = dict(V=50257, L=12, C=768, H=12)


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, T, L, C, H):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        s.lnf = nn.LayerNorm(C)

    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def gemm_peak():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        a @ b
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e12


def step(model, opt, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def train(mode, B, T, steps):
    torch.manual_seed(0)
    m = GPT2
    model = GPT(m["V"], T, m["L"], m["C"], m["H"]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    run = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, m["V"], (B, T), device="cuda")
    y = torch.randint(0, m["V"], (B, T), device="cuda")
    for _ in range(5):
        step(run, opt, x, y)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(run, opt, x, y)
    loss.item()
    dt = (time.perf_counter() - t0) / steps
    n = sum(p.numel() for p in model.parameters())
    flops = 6 * n + 12 * m["L"] * m["C"] * T
    tok = B * T / dt
    return dict(peer=f"torch-{mode}", B=B, T=T, step_ms=dt * 1e3, tokens_per_s=tok, model_tflops=tok * flops / 1e12,
                params=n, peak_gib=torch.cuda.max_memory_allocated() / 2**30)


def curve(weights, tokens, steps):
    """Trains from loom's exported initial weights on loom's (steps, 2, B, T) int32 token file."""
    from safetensors.torch import load_file
    import numpy as np
    w = load_file(weights)
    data = np.fromfile(tokens, dtype=np.int32)
    B, T = int(data[0]), int(data[1])
    data = torch.from_numpy(data[2:].reshape(steps, 2, B, T).astype("int64")).cuda()
    V, C = w["wte"].shape
    L = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blocks."))
    model = GPT(V, w["wpe"].shape[0], L, C, int(sys.argv[5]) if len(sys.argv) > 5 else C // 64).cuda()
    model.load_state_dict({k: v for k, v in w.items()}, strict=True)
    opt = torch.optim.AdamW(model.parameters(), lr=float(sys.argv[6]) if len(sys.argv) > 6 else 1e-3,
                            betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    return dict(peer="torch-curve", losses=[step(model, opt, data[s, 0], data[s, 1]).item() for s in range(steps)])


if __name__ == "__main__":
    what = sys.argv[1]
    dev = torch.cuda.get_device_name()
    if what == "gemm":
        print(json.dumps(dict(device=dev, bf16_gemm_tflops=gemm_peak())), flush=True)
    elif what == "train":
        print(json.dumps(dict(device=dev, **train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))),
              flush=True)
    elif what == "curve":
        print(json.dumps(dict(device=dev, **curve(sys.argv[2], sys.argv[3], int(sys.argv[4])))), flush=True)
