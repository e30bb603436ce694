#!/usr/bin/python3
"""PyTorch peers of the parallel-training benchmark (bench/parallel_vs_torch.sh): the GPT of
torch_peer.py trained with DDP, DDP + ZeroRedundancyOptimizer (ZeRO-1) on 2 gloo processes
x 1 thread, or GPipe's Pipe (2 stages x 4 micro-batches, 2 threads, one process).
Usage: torch_parallel_peer.py {ddp,zero1,pipe} CONFIG STEPS. Prints one JSON line."""
import json, os, sys, tempfile, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peer import CONFIGS, GPT, Block  # noqa: E402

WARMUP = 2


def data_parallel(rank, world, mode, name, steps, init_file, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    V, T, L, C, H, B = CONFIGS[name]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(GPT(V, T, L, C, H))
    kw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    if mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kw)
    x = torch.randint(0, V, (B // world, T))
    y = torch.randint(0, V, (B // world, T))
    for s in range(WARMUP + steps):
        if s == WARMUP:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        # PRECISION=bf16: autocast's bf16 GEMMs, fp32 masters and optimizer (as loom's bf16).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=os.environ.get("PRECISION") == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # local norm: DDP grads are identical
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"side": "torch", "mode": mode, "config": name, "tokens_per_s": round(steps * B * T / dt, 1)}, f)
    dist.destroy_process_group()


class Embed(nn.Module):
    def __init__(s, V, T, C):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)

    def forward(s, idx):
        return s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))


class Blocks(nn.Module):
    def __init__(s, n, C, H, T):
        super().__init__()
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(n))
        s.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def forward(s, x):
        for b in s.blocks:
            x = b(x, s.mask)
        return x


class Head(nn.Module):  # untied: Pipe cannot share wte across partitions
    def __init__(s, V, C):
        super().__init__()
        s.lnf, s.out = nn.LayerNorm(C), nn.Linear(C, V, bias=False)

    def forward(s, x):
        return s.out(s.lnf(x))


def pipe(name, steps):
    from torch.distributed import rpc
    from torch.distributed.pipeline.sync import Pipe
    torch.set_num_threads(2)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    rpc.init_rpc("worker", rank=0, world_size=1)
    V, T, L, C, H, B = CONFIGS[name]
    torch.manual_seed(0)
    stage0 = nn.Sequential(Embed(V, T, C), Blocks(L // 2, C, H, T))
    stage1 = nn.Sequential(Blocks(L - L // 2, C, H, T), Head(V, C))
    model = Pipe(nn.Sequential(stage0, stage1), chunks=4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    for s in range(WARMUP + steps):
        if s == WARMUP:
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x).local_value()
        F.cross_entropy(logits.view(-1, V), y.view(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"side": "torch", "mode": "pipe", "config": name, "tokens_per_s": round(steps * B * T / dt, 1)}))
    rpc.shutdown()


def main():
    mode, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "pipe":
        return pipe(name, steps)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json")
        mp.spawn(data_parallel, args=(2, mode, name, steps, os.path.join(d, "init"), out), nprocs=2)
        print(open(out).read())


if __name__ == "__main__":
    main()
