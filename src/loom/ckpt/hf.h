// What the Hugging Face file and directory forms share (ckpt/interop.cc, ckpt/hf_dir.cc):
// the tensors under their HF names, and a checkpoint made from them.
#pragma once

#include <string>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/core/safetensors.h"

namespace loom {

// The HF tensor names of model `m`, in loom's export order (embedding, blocks, final norm,
// head).
std::vector<std::string> hf_names(const ModelConfig& m);
// The checkpoint's weights under HF names and layouts, as `dtype` (fp32 | bf16), with the
// loom config (its paths dropped) and torch_dtype in the metadata.
StFile hf_tensors(const CheckpointData& ck, const std::string& dtype);
// The config keys naming files of the writing machine, returned to their defaults.
Config without_paths(Config c);
// A checkpoint (no optimizer state) at `checkpoint_dir` from HF-named tensors `f` (read
// from `source`, named in errors) for the model of `cfg`; a non-empty `tokenizer` is checked
// against the vocabulary and recorded.
void import_tensors(const StFile& f, const std::string& source, Config cfg, const std::string& checkpoint_dir,
                    const std::string& tokenizer);

}  // namespace loom
