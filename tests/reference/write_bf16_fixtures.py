#!/usr/bin/python3
"""Writes the bf16 PyTorch fixtures for train.precision = bf16 (issue 14).

For the GPT-2 and Llama models of write_fixtures.py (same configs, seeds, weights and
batch), two references of one forward/backward:

  sem.*   loom's bf16 semantics (Note [bf16 rounding points], src/loom/core/bf16.h; Note
          [bf16 activation storage], src/loom/model/model.cc) in float64: every linear
          layer and the head computes round(x) round(W)^T in fp64 and rounds the upstream
          gradient entering its GEMMs to bf16 (the bias gradient keeps the unrounded one);
          q, k, v (after RoPE) and the MLP pre-activation are rounded to bf16 (their
          gradients pass unchanged); the softmax probabilities are rounded to bf16 and the
          softmax backward uses the rounded ones (Note [bf16 attention probabilities],
          src/loom/kernels/ops_bf16.inc); norms, scores, sums and the loss in fp64. loom
          differs from this only by fp32 arithmetic, so the test bound is tight.
  ac.*    real PyTorch mixed precision: the fp32 model under
          torch.autocast("cpu", dtype=torch.bfloat16), the logits cast to fp32 for the loss.
          Autocast rounds in more places than loom (each linear's output is stored in
          bf16, and ops fed bf16 tensors run in bf16), so the test bound is a bf16 one.

Keys: param.<name> (F32), tokens, targets (I32), {sem,ac}.logits (B,T,V), {sem,ac}.loss (1),
{sem,ac}.grad.<name>.

Run:  /usr/bin/python3 tests/reference/write_bf16_fixtures.py   (needs Debian's python3-torch)
"""
import json, os, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_fixtures import HERE, init_params, forward, write_safetensors  # noqa: E402


class RoundBf16(torch.autograd.Function):
    """Value rounded to bf16 (nearest-even), gradient passed through unchanged."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


class RoundGradBf16(torch.autograd.Function):
    """Value passed through, gradient rounded to bf16: the upstream gradient a GEMM reads."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


class SoftmaxRoundedBf16(torch.autograd.Function):
    """Softmax over the last axis, each probability rounded to bf16; backward with the
    rounded probabilities p: dx = p (g - sum(p g)), as loom's bf16 attention kernels."""

    @staticmethod
    def forward(ctx, x):
        p = x.softmax(-1).to(torch.bfloat16).to(x.dtype)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return p * (g - (p * g).sum(-1, keepdim=True))


def loom_bf16_linear(x, w, b=None):
    y = RoundGradBf16.apply(F.linear(RoundBf16.apply(x), RoundBf16.apply(w)))
    return y if b is None else y + b


def make_fixture(name, cfg, B, T, seed):
    gen = torch.Generator().manual_seed(seed)  # the draws of write_fixtures.make_fixture
    P32 = init_params(cfg, gen)
    tokens = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, cfg["vocab"], (B, T), generator=gen, dtype=torch.int64)
    out = {"param." + k: v for k, v in P32.items()}
    out["tokens"], out["targets"] = tokens.int(), targets.int()

    P = {k: v.double().requires_grad_(True) for k, v in P32.items()}
    logits = forward(cfg, P, tokens, loom_bf16_linear, RoundBf16.apply, SoftmaxRoundedBf16.apply)
    loss = F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1))
    loss.backward()
    out["sem.logits"], out["sem.loss"] = logits.detach().float(), loss.detach().float().view(1)
    out.update({"sem.grad." + k: v.grad.float() for k, v in P.items()})

    P = {k: v.clone().requires_grad_(True) for k, v in P32.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forward(cfg, P, tokens)
    logits = logits.float()
    loss = F.cross_entropy(logits.view(-1, cfg["vocab"]), targets.view(-1))
    loss.backward()
    out["ac.logits"], out["ac.loss"] = logits.detach(), loss.detach().view(1)
    out.update({"ac.grad." + k: v.grad.float() for k, v in P.items()})

    meta = {"model": json.dumps(cfg), "batch": str(B), "seq": str(T), "torch": torch.__version__}
    path = os.path.join(HERE, "fixtures", name + "_bf16.safetensors")
    write_safetensors(path, out, meta)
    print(f"wrote {path}: loss loom-semantics {out['sem.loss'].item():.6f}, autocast {out['ac.loss'].item():.6f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    base = dict(norm_eps=1e-5, rope_theta=10000.0, ctx=16, vocab=256)
    make_fixture("gpt2", dict(base, arch="gpt", layers=2, d_model=36, heads=4, kv_heads=4, ffn=144), 2, 13, 1)
    make_fixture("llama", dict(base, arch="llama", layers=2, d_model=48, heads=4, kv_heads=2, ffn=72), 2, 13, 2)
