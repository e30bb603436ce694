#!/usr/bin/python3
"""Exports a loom checkpoint as a Hugging Face model directory (`loom export --out DIR`,
sharded), builds the model in PyTorch from config.json alone (transformers' key names, no
loom metadata read), loads the weights through model.safetensors.index.json, and checks
that its greedy continuation equals `loom sample --temperature 0` - from the checkpoint,
and from the directory imported back with loom's metadata stripped (config.json alone) -
and that every step's next-token logits (`loom sample --logits`) match within TOL; the
imported checkpoint then trains a step and exports again.

usage: check_hf_dir.py LOOM_BINARY CHECKPOINT_DIR [PROMPT] [TOKENS] [TOL]
Exit 0 on a match, 1 on a mismatch, 77 when PyTorch is missing (ctest skip).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_export import gpt2_logits, llama_logits, read_safetensors, torch  # noqa: E402  (exits 77 without torch)


def model_from_config(path):
    """The forward pass's shape keys from config.json, as transformers names them."""
    c = json.load(open(path))
    if c["model_type"] == "gpt2":
        return gpt2_logits, {"d_model": c["n_embd"], "heads": c["n_head"], "layers": c["n_layer"],
                             "norm_eps": c["layer_norm_epsilon"], "ctx": c["n_positions"]}
    assert c["model_type"] == "llama", c["model_type"]
    return llama_logits, {"d_model": c["hidden_size"], "heads": c["num_attention_heads"],
                          "kv_heads": c.get("num_key_value_heads", c["num_attention_heads"]),
                          "layers": c["num_hidden_layers"], "norm_eps": c["rms_norm_eps"],
                          "rope_theta": c.get("rope_theta", 10000.0), "ctx": c["max_position_embeddings"]}


def read_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    W = {}
    for f in files:
        W.update(read_safetensors(os.path.join(d, f))[0])
    return W, len(files)


def strip_metadata(d):
    """Rewrites every shard's header without __metadata__ (a directory another tool wrote)."""
    for f in os.listdir(d):
        if not f.endswith(".safetensors"):
            continue
        p = os.path.join(d, f)
        raw = open(p, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        open(p, "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])


def greedy(loom, ckpt, prompt, tokens):
    run = subprocess.run([loom, "sample", "--checkpoint", ckpt, "--prompt", prompt, "--tokens", str(tokens),
                          "--temperature", "0"], check=True, capture_output=True)
    return run.stdout.decode("utf-8", errors="replace").rstrip("\n")


def main():
    loom, ckpt = sys.argv[1], sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) > 3 else "The "
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 24
    tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-5
    tmp_dir = tempfile.TemporaryDirectory()
    hf = os.path.join(tmp_dir.name, "hf")
    subprocess.run([loom, "export", "--checkpoint", ckpt, "--out", hf, "--max-shard-mb", "0.1"], check=True,
                   capture_output=True)
    W, shards = read_dir(hf)
    logits_fn, cfg = model_from_config(os.path.join(hf, "config.json"))
    ids = list(prompt.encode())
    gaps, steps = [], []
    with torch.no_grad():
        for _ in range(tokens):
            logits = logits_fn(W, cfg, ids[-cfg["ctx"]:])[:256]  # the byte tokenizer's range
            steps.append(logits)
            top2 = logits.topk(2).values
            gaps.append(float(top2[0] - top2[1]))
            ids.append(int(logits.argmax()))
    ours = bytes(ids[len(prompt.encode()):]).decode("utf-8", errors="replace").rstrip("\n")
    strip_metadata(hf)
    back = os.path.join(tmp_dir.name, "back")
    subprocess.run([loom, "import", "--in", hf, "--checkpoint", back], check=True, capture_output=True)
    arch = "llama" if logits_fn is llama_logits else "gpt2"
    run = subprocess.run([loom, "sample", "--checkpoint", back, "--prompt", prompt, "--tokens", str(tokens),
                          "--temperature", "0", "--logits"], check=True, capture_output=True)
    lines = [json.loads(l) for l in run.stdout.decode().splitlines()]
    worst = max(float((torch.tensor(l["logits"]) - steps[l["step"]]).abs().max()) for l in lines)
    scale = max(float(s.abs().max()) for s in steps)
    if len(lines) != tokens or worst > tol * max(1.0, scale):
        print(f"{arch}: logits differ by up to {worst:.3g} (largest |logit| {scale:.3g}, tolerance {tol} relative)")
        return 1
    for what, ck in (("the checkpoint", ckpt), ("the directory imported from config.json", back)):
        theirs = greedy(loom, ck, prompt, tokens)
        if ours != theirs:
            print(f"{arch}: MISMATCH against {what}\n python: {ours!r}\n loom:   {theirs!r}")
            return 1
    # The imported model trains on (its moments start at zero) and exports again.
    subprocess.run([loom, "train", "--config", os.path.join(back, "config.toml"), "--resume", "auto", "--set",
                    "checkpoint.dir=" + back, "--set", "train.steps=1", "--set", "train.val_every=0", "--set",
                    "train.val_batches=1"], check=True, capture_output=True)
    again = os.path.join(tmp_dir.name, "again")
    subprocess.run([loom, "export", "--checkpoint", back, "--out", again, "--max-shard-mb", "0.1"], check=True,
                   capture_output=True)
    W2, _ = read_dir(again)
    if sorted(W2) != sorted(W) or all(torch.equal(W2[k], W[k]) for k in W):
        print(f"{arch}: the step trained after the import did not change the exported weights")
        return 1
    print(f"{arch}: PyTorch built from config.json alone ({shards} shards) reproduces loom's greedy continuation "
          f"({tokens} tokens; smallest top-2 logit gap {min(gaps):.4f}), and so does the directory imported back; "
          f"its logits differ from loom's by at most {worst:.2e} (largest |logit| {scale:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
