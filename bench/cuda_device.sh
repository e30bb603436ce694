#!/usr/bin/env bash
# Runs on a lent GPU machine (issue 20) from the repository root, with .device/ carried
# (scripts/cuda_bundle.sh): the CUDA tests, compute-sanitizer on them, GPU-vs-CPU parity
# of short training runs (GPT and Llama, bf16), CPU <-> GPU checkpoint resumes, and the
# GPT-2 124M benchmark against PyTorch eager and torch.compile on the same GPU.
#   bench/cuda_device.sh [tests] [sanitize] [parity] [curve] [bench] [llama] [profile]   (default: tests sanitize parity bench;
#   curve: GPT-2 loss curves of loom and PyTorch on the GPU from the same weights and batches;
#   llama: a 1.1B Llama of head size 128, T 2048, LLAMA_BATCH=8 sequences, MFU and torch.compile at batch 1
#   (LLAMA_TORCH=0: without it);
#   fp8: bf16 against fp8 GEMMs at that Llama's shapes (bench/cuda_gemm.cc), and llama runs fp8 too;
#   fp8loss: that Llama FP8_STEPS=1000 steps (batch 2) in bf16 and with fp8 linear layers, validation losses
#   (FP8_RUNS format:seed pairs; FP8_CORPUS: pysrc, the bundle's 11 MB corpus, or fortunes, the default 2.3 MB one);
#   BENCH_BATCH=16 sequences of 1024 tokens per step; profile: Note [CUDA profile], of the Llama too with llama)
set -uo pipefail
B=${BENCH_BATCH:-16}
what=${*:-tests sanitize parity bench}
has() { [[ " $what " == *" $1 "* ]]; }  # whole words: fp8 is not fp8loss
out=${OUT:-/tmp/cuda-device}/logs; rm -rf $out; mkdir -p "$out"  # logs under $OUT as they are written (a run cut
                                                                  # short by the device's time limit keeps them)
stamp() { echo "-- $(date +%T) $*"; }
root=/tmp/loom-bundle
rm -rf $root && mkdir -p $root && tar -C $root -xJf .device/bundle.tar.xz
# NCCL (opened by loom only for dp > 1 and the NCCL tests): the machine's own, e.g. PyTorch's.
nccl=$(find /opt /usr/local /usr/lib -name libnccl.so.2 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$root/lib${nccl:+:$(dirname "$nccl")}
echo "NCCL: ${nccl:-none found}"
loom=$root/loom
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ldd $loom $root/cuda_test | grep "not found" && echo "missing libraries"
corpus="--set data.path=$root/fortunes"
cpu_threads=$(nproc)

if has tests; then
  stamp "== cuda_test"; $root/cuda_test 2>&1 | tee $out/cuda_test.log | tail -25
fi
if has sanitize; then
  stamp "== compute-sanitizer memcheck"
  # (NCCL's own kernels and threads stay out of it: the CudaNccl tests run above)
  compute-sanitizer --tool memcheck --error-exitcode 9 $root/cuda_test --gtest_filter=-CudaNccl.* 2>&1 | tee $out/memcheck.log | tail -6
  echo "memcheck exit ${PIPESTATUS[0]}"
  echo "== compute-sanitizer racecheck (shared-memory races) on flash attention"
  compute-sanitizer --tool racecheck --error-exitcode 9 $root/cuda_test --gtest_filter='*Flash*' 2>&1 | tail -3
fi

# Loss per step of a --json run: one "step loss" per line.
losses() { grep '"loss"' | python3 -c 'import sys,json
for l in sys.stdin:
    j=json.loads(l); print(j["step"], j["loss"])'; }
compare() {  # compare NAME FILE_A FILE_B: max relative difference of the losses
  python3 - "$@" <<'PY'
import sys
name, a, b = sys.argv[1:4]
la = [float(l.split()[1]) for l in open(a)]; lb = [float(l.split()[1]) for l in open(b)]
n = min(len(la), len(lb)); d = max(abs(x - y) / abs(y) for x, y in zip(la[:n], lb[:n]))
print(f"{name}: {n} steps, first {la[0]:.4f} vs {lb[0]:.4f}, last {la[n-1]:.4f} vs {lb[n-1]:.4f}, max rel diff {d:.2e}")
PY
}
if has parity; then
  stamp "== parity: 20 steps, GPU vs CPU, both bf16"
  for m in tiny llama; do
    common="--set model.preset=$m --set train.steps=20 --json --precision bf16 $corpus --set train.val_every=0 --set train.log_every=1"
    $loom train $common --set checkpoint.dir=/tmp/ck-$m-gpu --device cuda > $out/$m-gpu.json 2>$out/$m-gpu.err || tail -5 $out/$m-gpu.err
    $loom train $common --set checkpoint.dir=/tmp/ck-$m-cpu --set train.threads=$cpu_threads > $out/$m-cpu.json 2>$out/$m-cpu.err || tail -5 $out/$m-cpu.err
    losses < $out/$m-gpu.json > $out/$m-gpu.txt; losses < $out/$m-cpu.json > $out/$m-cpu.txt
    compare "$m gpu vs cpu" $out/$m-gpu.txt $out/$m-cpu.txt
  done
  echo "== parity with full recompute (GPU and CPU), GPT and Llama, 20 steps"
  for m in tiny llama; do
    common="--set model.preset=$m --set train.steps=20 --json --precision bf16 $corpus --set train.val_every=0 --set train.log_every=1 --set parallel.recompute=full"
    $loom train $common --set checkpoint.dir=/tmp/ck-rc-$m-gpu --device cuda > $out/rc-$m-gpu.json 2>$out/rc-$m-gpu.err || tail -5 $out/rc-$m-gpu.err
    $loom train $common --set checkpoint.dir=/tmp/ck-rc-$m-cpu --set train.threads=$cpu_threads > $out/rc-$m-cpu.json 2>$out/rc-$m-cpu.err || tail -5 $out/rc-$m-cpu.err
    losses < $out/rc-$m-gpu.json > $out/rc-$m-gpu.txt; losses < $out/rc-$m-cpu.json > $out/rc-$m-cpu.txt
    compare "$m recompute=full gpu vs cpu" $out/rc-$m-gpu.txt $out/rc-$m-cpu.txt
    compare "$m recompute=full gpu vs none gpu" $out/rc-$m-gpu.txt $out/$m-gpu.txt
  done
  echo "== checkpoints: 10 steps on one device, resumed to 20 on the other"
  common="--set model.preset=tiny --set train.steps=20 --json --precision bf16 $corpus --set train.val_every=0 --set train.log_every=1"
  for first in cuda cpu; do
    other=$([[ $first == cuda ]] && echo cpu || echo cuda)
    d=/tmp/ck-$first; rm -rf $d
    $loom train $common --set train.steps=10 --set checkpoint.dir=$d --device $first > /dev/null 2>$out/ck1.err || tail -5 $out/ck1.err
    $loom train $common --set checkpoint.dir=$d --resume auto --device $other --set train.threads=$cpu_threads \
      > $out/resume-$first.json 2>$out/ck2.err || tail -5 $out/ck2.err
    losses < $out/resume-$first.json > $out/resume-$first.txt
    straight=$([[ $other == cuda ]] && echo gpu || echo cpu)
    tail -10 $out/tiny-$straight.txt > $out/straight-$other.txt
    compare "saved on $first, resumed on $other (steps 11-20) vs $other straight" $out/resume-$first.txt $out/straight-$other.txt
  done
fi

if has bench; then
  stamp "== GPT-2 124M, T 1024, batch $B: loom vs PyTorch 2.x on this GPU"
  export PYTHONUNBUFFERED=1
  python3 bench/cuda_torch_peer.py gemm | tee $out/gemm.json
  # loom runs before PyTorch and again after it (the GPU's clocks drift as it warms); the
  # ratios use their mean.
  loom_bench() {
    $loom train --set model.preset=gpt2 --set train.steps=30 --json --precision bf16 $corpus --device cuda --set train.batch=$B \
      --set train.val_every=0 --set train.log_every=10 --set train.seq=1024 --set checkpoint.dir=/tmp/ck-bench-$1 > $out/loom-$1.json 2>$out/loom-$1.err
    tail -3 $out/loom-$1.err; grep '"step":30' $out/loom-$1.json
  }
  loom_bench first
  stamp "torch eager"
  python3 bench/cuda_torch_peer.py train eager $B 1024 20 | tee $out/torch-eager.json
  stamp "torch.compile"
  timeout 300 python3 bench/cuda_torch_peer.py train compile $B 1024 20 2>$out/compile.err | tee $out/torch-compile.json
  stamp "loom again"
  loom_bench again
  python3 - $out <<'PY'
import json, sys
o = sys.argv[1]
peak = json.load(open(f"{o}/gemm.json"))["bf16_gemm_tflops"]
runs = [[json.loads(l) for l in open(f"{o}/loom-{r}.json") if '"tokens_per_s"' in l][-1]["tokens_per_s"] for r in ("first", "again")]
eager, comp = (json.load(open(f"{o}/torch-{m}.json")) for m in ("eager", "compile"))
flops = eager["model_tflops"] * 1e12 / eager["tokens_per_s"]  # 6N + 12 L C T per token
loom = sum(runs) / 2
print(f"loom runs: {runs[0]:.0f} and {runs[1]:.0f} tokens/s")
for name, tok in (("loom (mean)", loom), ("torch eager", eager["tokens_per_s"]), ("torch.compile", comp["tokens_per_s"])):
    print(f"{name:14s} {tok:10.0f} tokens/s  MFU {tok * flops / 1e12 / peak:.3f} (of measured bf16 GEMM peak {peak:.0f} TFLOP/s)")
print(f"loom / eager {loom / eager['tokens_per_s']:.2f}x, loom / compile {loom / comp['tokens_per_s']:.2f}x")
PY
fi
if has fp8; then
  stamp "== bf16 against fp8 GEMMs, the 1.1B Llama's linear layers over 16384 tokens (Note [CUDA fp8])"
  $root/cuda_gemm 16384 2048 8192 1024 32000 2>&1 | tee $out/fp8-gemm.txt
fi
# Llama of 1.14B parameters: 16 layers, d 2048, 16 heads of 128 (8 key/value heads), SwiGLU
# 8192, vocabulary 32000 (untied). Model FLOPs a token as the simulator counts them:
# 6 (N - V d) + 12 L d T (the input embedding is a lookup; attention counted unmasked).
llama="--set model.preset=llama --set model.layers=16 --set model.d_model=2048 --set model.heads=16 --set model.kv_heads=8
  --set model.ffn=8192 --set model.vocab=32000 --set model.ctx=2048"
if has llama; then
  LB=${LLAMA_BATCH:-8}
  stamp "== Llama 1.1B, head size 128, T 2048, batch $LB (and 1): loom (bf16; fp8 too with fp8), then torch.compile at batch 1"
  export PYTHONUNBUFFERED=1
  [[ -s $out/gemm.json ]] || python3 bench/cuda_torch_peer.py gemm > $out/gemm.json
  runs="b$LB:$LB:bf16 b1:1:bf16"
  has fp8 && runs="$runs fp8-b$LB:$LB:fp8"
  for r in $runs; do
    IFS=: read -r name b fmt <<< "$r"
    $loom train $llama --set train.steps=20 --json --precision bf16 $corpus --device cuda --set train.batch=$b \
      --set train.seq=2048 --set train.val_every=0 --set train.log_every=5 --set checkpoint.dir= \
      --set train.gemm_format=$fmt > $out/llama-$name.json 2>$out/llama-$name.err || tail -5 $out/llama-$name.err
  done
  [[ ${LLAMA_TORCH:-1} == 1 ]] && timeout 300 python3 bench/cuda_torch_peer.py split compile flash 32000 16 2048 16 \
    2048 10 8 8192 2>$out/llama-torch.err | tee $out/llama-torch.json
  python3 - $out $LB <<'PY'
import json, sys
o, B = sys.argv[1], int(sys.argv[2])
peak = json.load(open(f"{o}/gemm.json"))["bf16_gemm_tflops"]
L, d, V, T, F, kv = 16, 2048, 32000, 2048, 8192, 8
N = V * d * 2 + L * (d * d * 2 + 2 * d * (d // 16) * kv + 3 * d * F + 2 * d) + d
flops = 6 * (N - V * d) + 12 * L * d * T
def tok(name):
    try:
        return [json.loads(l) for l in open(f"{o}/llama-{name}.json") if '"tokens_per_s"' in l][-1]["tokens_per_s"]
    except (OSError, IndexError):
        return float("nan")
print(f"Llama {N / 1e9:.3f}B parameters, {flops / 1e9:.2f} GFLOP a token; bf16 GEMM peak measured {peak:.0f} TFLOP/s")
for name, what in ((f"b{B}", f"loom batch {B}"), ("b1", "loom batch 1"), (f"fp8-b{B}", f"loom fp8 batch {B}")):
    t = tok(name)
    if t == t:
        print(f"{what:18s}: {t:9.0f} tokens/s  {t * flops / 1e12:6.1f} TFLOP/s  MFU {t * flops / 1e12 / peak:.3f} "
              f"of the measured bf16 peak, {t * flops / 1e12 / 989:.3f} of 989 (H100/H200 dense bf16)")
if tok(f"fp8-b{B}") == tok(f"fp8-b{B}"):
    print(f"fp8 / bf16 at batch {B}: {tok(f'fp8-b{B}') / tok(f'b{B}'):.2f}x tokens/s")
try:
    j = json.load(open(f"{o}/llama-torch.json"))
    t = T / ((j["fwd_bwd_ms"] + j["optimizer_ms"]) / 1e3)
    print(f"torch.compile batch 1 ({j['params'] / 1e9:.3f}B): {t:9.0f} tokens/s  MFU {t * flops / 1e12 / peak:.3f}; "
          f"loom batch 1 / torch.compile {tok('b1') / t:.2f}x")
except (OSError, ValueError, KeyError) as e:
    print("torch.compile peer: no result", e)
PY
fi
if has fp8loss; then
  # FP8_RUNS: format:seed pairs; FP8_CONCURRENT=1 runs them at once on the one GPU (the
  # tokens/s of such runs share it and are not a speed figure).
  S=${FP8_STEPS:-1000} runs=${FP8_RUNS:-fp8:1 bf16:1} text=$root/${FP8_CORPUS:-pysrc}
  stamp "== Llama 1.1B, $S steps of 2 x 2048 tokens of $text, bf16 against fp8 linear layers: validation loss ($runs)"
  one() {  # format seed
    $loom train $llama --set train.steps=$S --json --precision bf16 --set data.path=$text --device cuda \
      --set train.batch=2 --set train.seq=2048 --set train.val_every=0 --set train.val_batches=64 --set train.log_every=50 \
      --set checkpoint.dir= --set train.gemm_format=$1 --set train.seed=$2 > $out/loss-$1-s$2.json \
      2>$out/loss-$1-s$2.err || { tail -5 $out/loss-$1-s$2.err; return 1; }
    stamp "$1 seed $2 done"
  }
  for r in $runs; do
    if [[ ${FP8_CONCURRENT:-0} == 1 ]]; then one ${r%:*} ${r#*:} & else one ${r%:*} ${r#*:} || break; fi
  done  # (sequential: the first failure ends it; put fp8 first, as the default does)
  wait
  python3 - $out <<'PY'
import glob, json, re, sys
o = sys.argv[1]
runs = {}
for path in sorted(glob.glob(f"{o}/loss-*-s*.json")):
    fmt, seed = re.match(r".*/loss-(\w+)-s(\d+)\.json", path).groups()
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    if val:
        runs[(fmt, int(seed))] = (val[-1], tps[-1], {r["step"]: r["loss"] for r in rows if "loss" in r})
for (fmt, seed), (val, tps, _) in sorted(runs.items()):
    print(f"{fmt:5s} seed {seed}: validation loss {val:.4f}, {tps:.0f} tokens/s")
for seed in sorted({s for _, s in runs}):
    if ("bf16", seed) in runs and ("fp8", seed) in runs:
        b, f = runs[("bf16", seed)], runs[("fp8", seed)]
        steps = sorted(set(b[2]) & set(f[2]))
        for s in sorted(set(steps[:: max(1, len(steps) // 5)] + steps[-1:])):
            print(f"  seed {seed} step {s:5d}: train loss bf16 {b[2][s]:.4f}  fp8 {f[2][s]:.4f}")
        print(f"seed {seed}: fp8 / bf16 - 1 = {100 * (f[0] / b[0] - 1):+.2f}% validation loss, "
              f"{f[1] / b[1]:.2f}x tokens/s")
PY
fi
if has curve; then
  echo "== loss curves: loom on the GPU vs PyTorch on the same GPU, same initial weights and batches"
  d=/tmp/cuda-curve; rm -rf $d; mkdir -p $d  # (the safetensors and checkpoint stay off $OUT)
  S="--set model.preset=gpt2 --set train.steps=20 --set train.batch=8 --set train.seq=1024 --set optim.lr=6e-4 --set optim.warmup_steps=10 $corpus"
  $loom data batches $S --out $d/b.bin
  python3 bench/cuda_torch_peer.py curve $d/init.safetensors $d/b.bin 50257 12 768 12 6e-4 10 0.1 0.1 > $d/torch.json
  $loom import --in $d/init.safetensors --checkpoint $d/ck --set model.preset=gpt2 >/dev/null
  $loom train --config $d/ck/config.toml $S --set model.preset=custom --precision bf16 --device cuda --set checkpoint.dir=$d/ck \
    --resume auto --json --set train.log_every=1 --set train.val_every=0 2>$d/loom.err | losses > $d/loom.txt
  python3 -c 'import json,sys; [print(i+1, l) for i, l in enumerate(json.load(open(sys.argv[1]))["losses"])]' $d/torch.json > $d/torch.txt
  compare "gpt2 loom-gpu vs torch-gpu" $d/loom.txt $d/torch.txt
  paste $d/loom.txt $d/torch.txt | awk 'NR==1||NR%5==0'
  cp $d/*.txt $d/*.json $d/loom.err $out/ 2>/dev/null
fi
if has profile; then
  stamp "== where a GPT-2 step's GPU time goes (Note [CUDA profile])"
  LOOM_CUDA_PROFILE=1 $loom train --set model.preset=gpt2 --set train.steps=12 --precision bf16 $corpus --device cuda \
    --set train.batch=$B --set train.val_every=0 --set train.val_batches=1 --set train.seq=1024 \
    --set checkpoint.dir=/tmp/ck-profile --json 2>&1 | grep -A30 "cuda profile"
  if has llama; then  # the 1.1B Llama at LLAMA_BATCH, bf16 and fp8 linear layers
    for fmt in bf16 fp8; do
      stamp "== where a step of the 1.1B Llama goes, $fmt linear layers (batch ${LLAMA_BATCH:-8})"
      LOOM_CUDA_PROFILE=1 $loom train $llama --set train.steps=8 --precision bf16 $corpus --device cuda \
        --set train.batch=${LLAMA_BATCH:-8} --set train.seq=2048 --set train.val_every=0 --set train.val_batches=1 \
        --set checkpoint.dir= --set train.gemm_format=$fmt --json 2>&1 | grep -A30 "cuda profile"
    done
  fi
fi
rm -rf /tmp/ck-*
stamp "done"
true
