#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json from GPT-2's vocab.json + merges.txt.

  make_tokenizer_json.py VOCAB MERGES OUT [--llama3]

Default: GPT-2's own tokenizer.json layout (ByteLevel pre-tokenizer with its regex).
--llama3: Llama 3's layout over the same vocabulary (Split on Llama 3's pattern, then
ByteLevel without regex, ignore_merges, merges as pairs), to test that pre-tokenizer.
tests/data/tokenizer_test.cc builds the same files in C++; keep the two in step.
"""
import json, sys

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

def main():
    vocab_path, merges_path, out = sys.argv[1:4]
    llama3 = "--llama3" in sys.argv
    vocab = json.load(open(vocab_path, encoding="utf-8"))
    lines = open(merges_path, encoding="utf-8").read().split("\n")
    merges = [l for i, l in enumerate(lines) if l and not (i == 0 and l.startswith("#version"))]
    eot = vocab["<|endoftext|>"]
    added = [{"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    if llama3:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        merges = [m.split(" ") for m in merges]
    else:
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": pre, "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                     "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": llama3, "vocab": vocab, "merges": merges}}
    json.dump(tok, open(out, "w", encoding="utf-8"), ensure_ascii=False)

main()
