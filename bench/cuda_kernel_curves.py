#!/usr/bin/env python3
"""Kernel rates of one CUDA device through PyTorch, for a GPU preset's curves (issue 21:
configs/clusters/dgx-h100.toml; Note [Cost model], Note [GEMM width], Note [Fused attention
kernels] in src/loom/sim/costs.cc).

  cuda_kernel_curves.py            measure on cuda:0, one JSON line per measurement
  cuda_kernel_curves.py --smoke    tiny sizes on the CPU (checks the script, times nothing useful)

What it times, bf16 throughout, random normal operands:
  gemm    a linear layer's three GEMMs (forward x W^T, dgrad dY W, wgrad dY^T X) for tokens n
          and widths w in the shapes qkv (w -> 3w), fc1 (w -> 4w), fc2 (4w -> w);
  mem     copy, add, layer norm and tanh-GELU forward and backward, by bytes moved;
  attn    causal scaled_dot_product_attention forward and backward per backend (flash: PyTorch's
          FlashAttention-2; cudnn: cuDNN's fused attention, Transformer Engine's kernel on
          Hopper), by sequence length and head dim, FLOPs counted as the papers count them
          (forward 4 b h s^2 d / 2 causal, backward 2.5 x forward);
  launch  the time per kernel of a one-element add, eager (Python launch-bound) and graphed;
  sustain (only when named) a GEMM as a burst between idle gaps and replayed for 8 s;
  power   (only when named) one GEMM sustained for 5 s per operand distribution.
Each GEMM and memory kernel is replayed in a CUDA graph over enough copies of its operands
that they do not stay in L2 (50 MB on H100): a step's GEMMs read weights and activations last
touched a layer ago. Times are the median of 5 replays, each divided by its kernel count."""
import json, sys, time
import torch
import torch.nn.functional as F

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
BF16 = torch.bfloat16
L2_BYTES = 2e8  # operand sets rotate until they span 4x H100's L2


def emit(**kw):
    print(json.dumps(kw), flush=True)


def sync():
    if not SMOKE:
        torch.cuda.synchronize()


def per_call_s(calls, target_s=0.02):
    """Median seconds per call of a list of zero-argument callables run round-robin."""
    if SMOKE:
        t0 = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t0) / len(calls)
    for c in calls:  # warm up (cuBLAS heuristics, workspace)
        c()
    sync()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for c in calls:
        c()
    e1.record()
    e1.synchronize()
    one = max(e0.elapsed_time(e1) / 1e3 / len(calls), 1e-7)
    rounds = max(1, min(200, int(target_s / (one * len(calls)))))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for c in calls:
            c()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(rounds):
                for c in calls:
                    c()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    sync()
    times = []
    for _ in range(5):
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / (rounds * len(calls)))
    times.sort()
    del graph
    return times[2]


def copies(nbytes):
    return 1 if SMOKE else max(1, min(16, int(L2_BYTES / max(nbytes, 1)) + 1))


def gemm_grid():
    ns = [64, 128] if SMOKE else [512, 1024, 2048, 4096, 8192, 16384]
    ws = [32, 64] if SMOKE else [512, 1024, 2048, 3072, 4096, 6144, 8192]
    for n in ns:
        for w in ws:
            for name, K, N in (("qkv", w, 3 * w), ("fc1", w, 4 * w), ("fc2", 4 * w, w)):
                nb = (n * K + N * K + n * N) * 2
                sets = [(torch.randn(n, K, device=DEV, dtype=BF16), torch.randn(N, K, device=DEV, dtype=BF16),
                         torch.randn(n, N, device=DEV, dtype=BF16)) for _ in range(copies(nb))]
                passes = {
                    "fwd": [lambda x=x, W=W: torch.matmul(x, W.t()) for x, W, _ in sets],
                    "dgrad": [lambda W=W, g=g: torch.matmul(g, W) for _, W, g in sets],
                    "wgrad": [lambda x=x, g=g: torch.matmul(g.t(), x) for x, _, g in sets],
                }
                flops = 2.0 * n * K * N
                for p, calls in passes.items():
                    t = per_call_s(calls)
                    emit(kind="gemm", shape=name, n=n, w=w, K=K, N=N, op=p, flops=flops, s=t, tflops=flops / t / 1e12)
                del sets, passes
                if not SMOKE:
                    torch.cuda.empty_cache()


def mem_grid():
    sizes = [1 << 12, 1 << 14] if SMOKE else [1 << k for k in range(14, 30, 2)]  # elements
    h = 64 if SMOKE else 4096
    for el in sizes:
        rows = max(1, el // h)
        nb = el * 2
        sets = [(torch.randn(rows, h, device=DEV, dtype=BF16), torch.randn(rows, h, device=DEV, dtype=BF16))
                for _ in range(copies(3 * nb))]
        w = torch.ones(h, device=DEV, dtype=BF16)
        b = torch.zeros(h, device=DEV, dtype=BF16)
        stats = [torch.ops.aten.native_layer_norm(x, [h], w, b, 1e-5) for x, _ in sets]
        kernels = {
            "copy": ([lambda x=x, y=y: x.copy_(y) for x, y in sets], 2 * nb),
            "add": ([lambda x=x, y=y: torch.add(x, y) for x, y in sets], 3 * nb),
            "layernorm_fwd": ([lambda x=x: torch.ops.aten.native_layer_norm(x, [h], w, b, 1e-5) for x, _ in sets], 2 * nb),
            "layernorm_bwd": ([lambda x=x, g=g, s=s: torch.ops.aten.native_layer_norm_backward(
                g, x, [h], s[1], s[2], w, b, [True, True, True]) for (x, g), s in zip(sets, stats)], 3 * nb),
            "gelu_fwd": ([lambda x=x: F.gelu(x, approximate="tanh") for x, _ in sets], 2 * nb),
            "gelu_bwd": ([lambda x=x, g=g: torch.ops.aten.gelu_backward(g, x, approximate="tanh") for x, g in sets], 3 * nb),
        }
        for name, (calls, moved) in kernels.items():
            t = per_call_s(calls)
            emit(kind="mem", op=name, elements=el, bytes=moved, s=t, gbps=moved / t / 1e9)
        del sets, stats, kernels
        if not SMOKE:
            torch.cuda.empty_cache()


def attn_grid():
    if not hasattr(F, "scaled_dot_product_attention"):
        emit(kind="attn", skipped="torch without scaled_dot_product_attention")
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    tokens = 256 if SMOKE else 32768
    for bname, backend in backends.items():
        for d in (64, 128):
            heads = 2 if SMOKE else 2048 // d  # d_model 2048 per GPU
            for s in ([64, 128] if SMOKE else [512, 1024, 2048, 4096, 8192, 16384, 32768]):
                b = max(1, tokens // s)
                q, k, v = (torch.randn(b, heads, s, d, device=DEV, dtype=BF16, requires_grad=True) for _ in range(3))
                fwd_flops = 4.0 * b * heads * s * s * d / 2
                try:
                    with sdpa_kernel([backend]):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        g = torch.randn_like(out)
                        tf = eager_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                        def fb():  # autograd.grad: no accumulation into q.grad (an extra add)
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            torch.autograd.grad(o, (q, k, v), g)
                        tfb = eager_s(fb)
                except RuntimeError as e:
                    emit(kind="attn", backend=bname, d=d, s=s, error=str(e).splitlines()[0][:200])
                    continue
                tb = tfb - tf
                emit(kind="attn", backend=bname, d=d, s=s, b=b, heads=heads, fwd_flops=fwd_flops, fwd_s=tf, bwd_s=tb,
                     fwd_tflops=fwd_flops / tf / 1e12, bwd_tflops=2.5 * fwd_flops / tb / 1e12,
                     total_tflops=3.5 * fwd_flops / tfb / 1e12)
                del q, k, v, out, g


def eager_s(fn, reps=None):
    fn()
    sync()
    if SMOKE:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    e1.synchronize()
    one = e0.elapsed_time(e1) / 1e3
    reps = reps or max(3, min(50, int(0.05 / max(one, 1e-6))))
    times = []
    for _ in range(5):
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3 / reps)
    times.sort()
    return times[2]


def launch():
    x = torch.zeros(1, device=DEV)
    emit(kind="launch", mode="eager", s=eager_s(lambda: torch.add(x, 1), reps=1000))
    emit(kind="launch", mode="graph", s=per_call_s([lambda: torch.add(x, 1)] * 100))


def sustain():
    """A GEMM alone between synchronizations (a burst) against the same GEMM replayed back to
    back for 8 s (a step's steady state: clocks under the power limit), per second."""
    n = 256 if SMOKE else 8192
    shapes = {"square": (n, n, n), "fc1_16k_8192": (2 * n, n // 8 if SMOKE else 8192, 4 * (n // 8 if SMOKE else 8192))}
    for name, (M, K, N) in shapes.items():
        x = torch.randn(M, K, device=DEV, dtype=BF16)
        W = torch.randn(N, K, device=DEV, dtype=BF16)
        flops = 2.0 * M * N * K
        burst = []
        for _ in range(20):
            sync()
            t0 = time.perf_counter()
            torch.matmul(x, W.t())
            sync()
            burst.append(time.perf_counter() - t0)
            time.sleep(0.05)  # idle between, as between a benchmark's calls
        burst.sort()
        emit(kind="sustain", shape=name, mode="burst", flops=flops, s=burst[10], tflops=flops / burst[10] / 1e12)
        if SMOKE:
            continue
        t_end, second, per = time.time() + 8, 0, []
        start = time.time()
        while time.time() < t_end:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(10):
                torch.matmul(x, W.t())
            e1.record()
            e1.synchronize()
            per.append(e0.elapsed_time(e1) / 1e4)
            if time.time() - start >= second + 1:
                per.sort()
                emit(kind="sustain", shape=name, mode="steady", second=second, s=per[len(per) // 2],
                     tflops=flops / per[len(per) // 2] / 1e12)
                second, per = second + 1, []
        del x, W


def power():
    """One GEMM shape (an fc2: 16384 tokens, 8192 -> 8192) sustained for 5 s per operand
    distribution: the rate a power-capped GPU holds depends on how many bits toggle."""
    M, K, N = (128, 64, 64) if SMOKE else (16384, 8192, 8192)
    g = lambda *s: torch.randn(*s, device=DEV, dtype=torch.float32)
    dists = {
        "randn x randn": (g(M, K), g(N, K)),
        "randn x 0.02 randn": (g(M, K), 0.02 * g(N, K)),
        "gelu(randn) x 0.02 randn": (F.gelu(g(M, K), approximate="tanh"), 0.02 * g(N, K)),
        "relu(randn)^2 x 0.02 randn": (torch.relu(g(M, K)) ** 2, 0.02 * g(N, K)),
        "zeros": (torch.zeros(M, K, device=DEV), torch.zeros(N, K, device=DEV)),
    }
    flops = 2.0 * M * N * K
    for name, (x, W) in dists.items():
        x, W = x.to(BF16), W.to(BF16)
        per, start = [], time.time()
        while time.time() - start < (0.01 if SMOKE else 5):
            t0 = time.perf_counter()
            for _ in range(10):
                torch.matmul(x, W.t())
            sync()
            per.append(((time.perf_counter() - t0) / 10, time.time() - start))
        late = sorted(t for t, at in per if at >= 2) or [per[-1][0]]
        emit(kind="power", data=name, flops=flops, s=late[len(late) // 2], tflops=flops / late[len(late) // 2] / 1e12)


def main():
    if not SMOKE:
        p = torch.cuda.get_device_properties(0)
        emit(kind="device", name=p.name, sms=p.multi_processor_count, torch=torch.__version__,
             cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    which = [a for a in sys.argv[1:] if not a.startswith("--")] or ["launch", "attn", "mem", "gemm"]
    for w in which:
        t0 = time.time()
        {"gemm": gemm_grid, "mem": mem_grid, "attn": attn_grid, "launch": launch, "sustain": sustain, "power": power}[w]()
        emit(kind="section", name=w, wall_s=time.time() - t0)


if __name__ == "__main__":
    main()
