#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (issue 20): GPT-2 (pre-LN, GELU-tanh, learned positions,
tied head) in bf16 autocast with fp32 master weights and AdamW, on one CUDA device.

  cuda_torch_peer.py gemm                       bf16 GEMM peak (8192^3, random data)
  cuda_torch_peer.py train MODE B T STEPS       MODE eager | compile: tokens/s and MFU
  cuda_torch_peer.py split MODE BACKEND V L C H T STEPS [G F]   any GPT (or, with G kv heads and
      an MLP width F, a Llama) at batch 1: forward + backward and the optimizer timed apart (the
      simulator's compute and optimizer terms)
  cuda_torch_peer.py profile MODE B T STEPS     the GPU kernels of STEPS steps (torch.profiler): the
      top kernels by GPU time per step, for comparing with loom's LOOM_CUDA_PROFILE table
  cuda_torch_peer.py curve INIT BATCHES V L C H LR WARMUP MIN_RATIO WD
      writes a fresh model to INIT (HF GPT-2 safetensors, for `loom import`), then prints its loss
      per step on BATCHES (`loom data batches`) with loom's optimizer settings

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
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's 1.13, for trying the script on the CPU)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
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


class RMSNorm(nn.Module):
    def __init__(s, C):
        super().__init__()
        s.w = nn.Parameter(torch.ones(C))

    def forward(s, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * s.w


def rope(x, cos, sin):  # (B, heads, T, hd), rotating the two halves (Llama's layout in HF)
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class LlamaBlock(nn.Module):
    """RMSNorm, grouped-query attention with RoPE, SwiGLU; no biases (Llama 3)."""

    def __init__(s, C, H, G, Fh):
        super().__init__()
        s.H, s.G, s.hd = H, G, C // H
        s.n1, s.n2 = RMSNorm(C), RMSNorm(C)
        s.qkv = nn.Linear(C, (H + 2 * G) * s.hd, bias=False)
        s.o = nn.Linear(C, C, bias=False)
        s.gu, s.down = nn.Linear(C, 2 * Fh, bias=False), nn.Linear(Fh, C, bias=False)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        q, k, v = s.qkv(s.n1(x)).split([s.H * s.hd, s.G * s.hd, s.G * s.hd], dim=-1)
        q = rope(q.view(B, T, s.H, s.hd).transpose(1, 2), cos, sin)
        k = rope(k.view(B, T, s.G, s.hd).transpose(1, 2), cos, sin).repeat_interleave(s.H // s.G, dim=1)
        v = v.view(B, T, s.G, s.hd).transpose(1, 2).repeat_interleave(s.H // s.G, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0, for trying the script on the CPU
            att = (q @ k.transpose(-2, -1)) / math.sqrt(s.hd)
            y = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ v
        x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
        g, u = s.gu(s.n2(x)).chunk(2, dim=-1)
        return x + s.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(s, V, T, L, C, H, G, Fh):
        super().__init__()
        s.emb = nn.Embedding(V, C)
        s.blocks = nn.ModuleList(LlamaBlock(C, H, G, Fh) for _ in range(L))
        s.norm, s.head = RMSNorm(C), nn.Linear(C, V, bias=False)
        hd = C // H
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd // 2).float() / (hd // 2)))
        ang = torch.outer(torch.arange(T).float(), inv)  # (T, hd / 2): one angle per rotated pair
        s.register_buffer("cos", ang.cos(), persistent=False)
        s.register_buffer("sin", ang.sin(), persistent=False)

    def forward(s, idx, targets):
        x = s.emb(idx)
        cos, sin = s.cos.to(x.dtype), s.sin.to(x.dtype)
        for b in s.blocks:
            x = b(x, cos, sin)
        logits = s.head(s.norm(x))
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


def warmed_up(mode, B, T):
    """GPT-2 with its optimizer and one random batch, after 5 warm-up steps (eager or compiled)."""
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
    return model, opt, run, x, y


def train(mode, B, T, steps):
    m = GPT2
    model, opt, run, x, y = warmed_up(mode, B, T)
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


def split(mode, backend, V, L, C, H, T, steps, G=0, Fh=0):
    """One GPT of any size (batch 1, sequence T) on one GPU, its step split as the simulator
    splits it: forward + backward of a micro-batch, and the optimizer (gradient clipping and a
    fused AdamW, as Megatron's fused Adam), each timed with CUDA events, median of `steps`.
    `backend` picks scaled_dot_product_attention's kernel: cudnn | flash (FlashAttention-2)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    model = (Llama(V, T, L, C, H, G, Fh) if G else GPT(V, T, L, C, H)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    run = torch.compile(model) if mode == "compile" else model
    x = torch.randint(0, V, (1, T), device="cuda")
    y = torch.randint(0, V, (1, T), device="cuda")
    fb, op = [], []
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION if backend == "cudnn" else SDPBackend.FLASH_ATTENTION]):
        for i in range(steps + 3):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = run(x, y)
            loss.backward()
            e[1].record()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            e[2].record()
            opt.zero_grad(set_to_none=True)
            e[2].synchronize()
            if i >= 3:
                fb.append(e[0].elapsed_time(e[1]))
                op.append(e[1].elapsed_time(e[2]))
    fb.sort(), op.sort()
    n = sum(p.numel() for p in model.parameters())
    return dict(peer=f"torch-{mode}-{backend}", arch="llama" if G else "gpt", V=V, L=L, C=C, H=H, G=G, F=Fh, T=T,
                params=n, fwd_bwd_ms=fb[len(fb) // 2],
                optimizer_ms=op[len(op) // 2], peak_gib=torch.cuda.max_memory_allocated() / 2**30)


def profile(mode, B, T, steps, top=40):
    """Prints the top GPU kernels of `steps` steps by time per step (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile as prof
    _, opt, run, x, y = warmed_up(mode, B, T)
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            step(run, opt, x, y)
        torch.cuda.synchronize()

    def ms(e):  # (renamed from self_cuda_time_total in PyTorch 2.4)
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 1e3 / steps
    rows = sorted(((e.key, ms(e), e.count // steps) for e in p.key_averages()), key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"torch-{mode} profile: {total:.2f} ms of kernels per step")
    for name, t, n in rows[:top]:
        print(f"  {t:8.3f} ms {n:5d}x  {name[:110]}")


def save_hf_gpt2(model, path):
    """The model as Hugging Face GPT-2 safetensors (Conv1D weights transposed), for `loom import`;
    written by hand so no safetensors package is needed."""
    import struct
    t = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight,
         "transformer.ln_f.weight": model.lnf.weight, "transformer.ln_f.bias": model.lnf.bias}
    for i, b in enumerate(model.blocks):
        h = f"transformer.h.{i}."
        for name, mod in (("ln_1", b.ln1), ("ln_2", b.ln2)):
            t[h + name + ".weight"], t[h + name + ".bias"] = mod.weight, mod.bias
        for name, mod in (("attn.c_attn", b.qkv), ("attn.c_proj", b.proj), ("mlp.c_fc", b.fc), ("mlp.c_proj", b.out)):
            t[h + name + ".weight"], t[h + name + ".bias"] = mod.weight.t(), mod.bias
    header, blobs, at = {}, [], 0
    for k, v in t.items():
        data = v.detach().float().cpu().contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def lr_at(step, total, lr, warmup, min_ratio):
    """loom's schedule (optim/optimizer.cc): linear warmup, then cosine to lr * min_ratio."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay = total - warmup
    if decay <= 0:
        return lr
    p = min(1.0, (step - warmup) / decay)
    return lr * min_ratio + 0.5 * (lr - lr * min_ratio) * (1 + math.cos(math.pi * p))


def curve(init_path, batches, V, L, C, H, lr, warmup, min_ratio, wd):
    """Writes a fresh GPT-2's weights for `loom import`, then trains on `loom data batches`
    output with loom's optimizer settings (AdamW, betas 0.9/0.95, eps 1e-8, decay on matrices
    and embeddings, clipping at 1, loom's LR schedule); bf16 autocast on CUDA."""
    import numpy as np
    raw = np.fromfile(batches, dtype=np.int32)
    B, T = int(raw[0]), int(raw[1])
    data = torch.from_numpy(raw[2:].reshape(-1, 2, B, T).astype("int64"))
    steps = data.shape[0]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(V, T, L, C, H).to(dev)
    with torch.no_grad():  # GPT-2's init, as loom's: N(0, 0.02), residual projections / sqrt(2 L)
        for n, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02 / math.sqrt(2 * L) if n.endswith(("proj.weight", "out.weight")) else 0.02)
            elif "ln" not in n:
                p.zero_()
    save_hf_gpt2(model, init_path)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s, steps, lr, warmup, min_ratio)
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = model(data[s, 0].to(dev), data[s, 1].to(dev))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return dict(peer="torch-curve", torch=torch.__version__, losses=losses)


if __name__ == "__main__":
    what = sys.argv[1]
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if what == "gemm":
        print(json.dumps(dict(device=dev, bf16_gemm_tflops=gemm_peak())), flush=True)
    elif what == "train":
        print(json.dumps(dict(device=dev, **train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))),
              flush=True)
    elif what == "split":  # split MODE BACKEND V L C H T STEPS [G F]: G kv heads and F > 0 make it a Llama
        a = sys.argv
        print(json.dumps(dict(device=dev, **split(a[2], a[3], *(int(v) for v in a[4:])))), flush=True)
    elif what == "profile":
        profile(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif what == "curve":  # curve INIT.safetensors BATCHES V L C H LR WARMUP MIN_RATIO WD
        a = sys.argv
        r = curve(a[2], a[3], *(int(x) for x in a[4:8]), float(a[8]), int(a[9]), float(a[10]), float(a[11]))
        print(json.dumps(dict(device=dev, **r)), flush=True)
