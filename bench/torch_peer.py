#!/usr/bin/python3
"""PyTorch side of the training benchmark: the same GPT-2 model (pre-LN, GELU-tanh,
learned positions, tied head), fp32, AdamW + grad clipping, random tokens. Prints one JSON line.
Run through bench/train_vs_torch.sh, which sets threads, tcmalloc and OPENBLAS_CORETYPE."""
import json, math, resource, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {"A": (256, 128, 4, 128, 4, 16), "B": (50257, 256, 6, 384, 6, 8), "C": (50257, 256, 12, 768, 12, 4)}


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x, mask):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // s.H))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf")).softmax(-1)
        x = x + s.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, T, L, C, H):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        s.lnf = nn.LayerNorm(C)
        s.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def forward(s, idx, targets):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks:
            x = b(x, s.mask)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    name, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
    precision = sys.argv[3] if len(sys.argv) > 3 else "fp32"
    # bf16: torch.autocast on the CPU (GEMMs in bf16, fp32 master weights and optimizer).
    cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    V, T, L, C, H, B = CONFIGS[name]
    torch.manual_seed(0)
    model = GPT(V, T, L, C, H)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    warmup = 2
    for s in range(warmup + steps):
        if s == warmup:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with cast:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    tok_s = steps * B * T / dt
    params = sum(p.numel() for p in model.parameters())
    gflops = tok_s * (6 * params + 12 * L * T * C) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"side": "torch", "config": name, "precision": precision, "tokens_per_s": round(tok_s, 1),
                      "model_gflops": round(gflops, 1), "peak_rss_mib": round(rss, 1),
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
