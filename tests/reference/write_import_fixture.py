#!/usr/bin/env python3
"""Writes the fixture for `loom import --tokenizer` (issue 15): a small, randomly initialised
Llama in Hugging Face layout (no loom metadata) whose vocabulary is the 1k SentencePiece
model in fixtures/tokenizers/, and its greedy continuation of a prompt computed by PyTorch
with HF conventions (check_hf_export.llama_logits), tokenized and detokenized by
spm_encode / spm_decode. tests/cli/tokenizer_cli_test.cc imports the file with that
tokenizer and must sample the same text.

  scripts/setup.sh --oracle && /usr/bin/python3 tests/reference/write_import_fixture.py
"""
import json, os, struct, subprocess, sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from check_hf_export import llama_logits, torch  # noqa: E402 (exits 77 without torch)

FX = os.path.join(here, "fixtures", "tokenizers")
CFG = dict(layers=2, d_model=32, heads=4, kv_heads=2, ffn=64, vocab=1000, ctx=64, rope_theta=10000.0, norm_eps=1e-5)
PROMPT, TOKENS = "The cat ", 16


def weights():
    g = torch.Generator().manual_seed(15)
    C, H, KV, F, V = CFG["d_model"], CFG["heads"], CFG["kv_heads"], CFG["ffn"], CFG["vocab"]
    hd = C // H
    n = lambda *shape: torch.randn(*shape, generator=g) * 0.3  # large enough for clear top-2 gaps
    W = {"model.embed_tokens.weight": n(V, C), "lm_head.weight": n(V, C),
         "model.norm.weight": 1 + 0.1 * torch.randn(C, generator=g)}
    for l in range(CFG["layers"]):
        p = f"model.layers.{l}."
        W.update({p + "self_attn.q_proj.weight": n(H * hd, C), p + "self_attn.k_proj.weight": n(KV * hd, C),
                  p + "self_attn.v_proj.weight": n(KV * hd, C), p + "self_attn.o_proj.weight": n(C, H * hd),
                  p + "mlp.gate_proj.weight": n(F, C), p + "mlp.up_proj.weight": n(F, C),
                  p + "mlp.down_proj.weight": n(C, F),
                  p + "input_layernorm.weight": 1 + 0.1 * torch.randn(C, generator=g),
                  p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(C, generator=g)})
    return {k: v.float().contiguous() for k, v in W.items()}


def write_safetensors(path, W):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(W):
        b = W[name].numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(W[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def spm(tool, text, *flags):
    r = subprocess.run([tool, "--model", os.path.join(FX, "fortunes-1k.model"), *flags], input=text.encode(),
                       capture_output=True, check=True)
    return r.stdout.decode()


def main():
    W = weights()
    ids = [int(t) for t in spm("spm_encode", PROMPT, "--output_format=id").split()]
    out, gaps = [], []
    with torch.no_grad():
        for _ in range(TOKENS):
            logits = llama_logits(W, CFG, ids + out)
            top2 = logits.topk(2).values
            gaps.append(float(top2[0] - top2[1]))
            out.append(int(logits.argmax()))
    text = spm("spm_decode", " ".join(map(str, out)) + "\n", "--input_format=id").rstrip("\n")
    assert min(gaps) > 1e-3, f"a top-2 logit gap of {min(gaps)} is too small for a robust greedy fixture"
    write_safetensors(os.path.join(FX, "hf-llama-tiny.safetensors"), W)
    json.dump({"source": "tests/reference/write_import_fixture.py", "config": CFG, "prompt": PROMPT,
               "prompt_ids": ids, "continuation_ids": out, "text": text, "min_top2_gap": min(gaps)},
              open(os.path.join(FX, "hf-llama-tiny.json"), "w"), indent=1)
    print(f"greedy continuation {out!r} = {text!r} (smallest top-2 gap {min(gaps):.4f})")


if __name__ == "__main__":
    main()
