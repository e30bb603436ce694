// Single-process checkpoints: a directory holding
//   config.toml         the fully resolved config
//   model.safetensors   parameters under loom names (metadata: format, step)
//   optim.safetensors   AdamW moments m.<name>, v.<name> (absent for imported weights)
//   state.json          step, optimizer step count, seed
// Saving writes a sibling temporary directory, fsyncs every file, then renames it into
// place, so an interrupted save never leaves a partial checkpoint under `dir`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/config.h"
#include "loom/model/layout.h"

namespace loom {

struct CheckpointState {
  int64_t step = 0;            // optimizer steps completed
  int64_t optimizer_steps = 0;
};

struct CheckpointData {
  Config config;
  std::vector<float> params;           // flat, layout of `config.model`
  std::optional<std::vector<float>> m, v;
  CheckpointState state;
};

void save_checkpoint(const std::string& dir, const Config& config, const ParamLayout& layout,
                     const std::vector<float>& params, const std::vector<float>* m,
                     const std::vector<float>* v, const CheckpointState& state);

// Throws loom::Error naming the file and the problem (missing file, bad config, tensor
// missing or with the wrong shape).
// A directory with sharded steps (`latest` or a manifest.json) is read as the newest of
// them; otherwise as the whole-model files.
CheckpointData load_checkpoint(const std::string& dir);
// The whole-model files only (config.toml, model.safetensors, ...), steps beside them ignored.
CheckpointData load_whole_files(const std::string& dir);

// Hugging Face interop: GPT-2 names (transformer.h.N.attn.c_attn.weight, Conv1D weights
// stored (in, out)) for arch gpt, Llama names (model.layers.N.self_attn.q_proj.weight)
// for arch llama. The loom config rides in the metadata under "loom_config", the dtype under
// "torch_dtype" (float32 | bfloat16, as in HF's config.json). `dtype` "bf16" rounds the fp32
// masters to nearest-even bf16; "fp32" writes them as they are. Import reads either.
void export_safetensors(const std::string& checkpoint_dir, const std::string& out_file,
                        const std::string& dtype = "fp32");
// Builds a checkpoint (no optimizer state) from an HF-named safetensors file. The model
// config comes from the file's loom_config metadata when present; otherwise from `base`
// (preset, heads, ...) with layers/d_model/vocab/ctx/ffn read off the tensor shapes.
// A non-empty `tokenizer` is loaded (its vocabulary must fit model.vocab) and recorded as
// the checkpoint's data.tokenizer.
void import_safetensors(const std::string& in_file, const std::string& checkpoint_dir,
                        const Config& base, bool base_given, const std::string& tokenizer = "");

// Note [Hugging Face directories] (ckpt/hf_dir.cc): a model directory transformers reads -
// config.json, model.safetensors or shards of at most `max_shard_mb` MiB with their index,
// the tokenizer files - at `out_dir` (new, or an empty directory).
// Returns what it wrote (shards, the tokenizer or why not), for the user.
std::string export_hf_dir(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                          double max_shard_mb);
// A checkpoint from such a directory: the model from config.json (or, from a loom export
// and no `base_given`, its loom config), the weights from the index's shards or the one
// file, the directory's tokenizer unless `tokenizer` names one.
void import_hf_dir(const std::string& in_dir, const std::string& checkpoint_dir, const Config& base, bool base_given,
                   const std::string& tokenizer = "");
// The model of a transformers config.json (gpt2 or llama); throws ConfigError naming the key
// loom cannot run.
ModelConfig model_from_hf_config(const std::string& path);

}  // namespace loom
