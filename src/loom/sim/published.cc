#include "loom/sim/published.h"

#include <algorithm>
#include <functional>
#include <cctype>

#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/parallel/schedule.h"

namespace loom::sim {

namespace {

// One CSV record starting at `pos`; handles quoted fields with commas, quotes, newlines.
bool next_record(const std::string& text, size_t& pos, std::vector<std::string>& out) {
  out.clear();
  if (pos >= text.size()) return false;
  std::string field;
  bool quoted = false;
  for (; pos < text.size(); ++pos) {
    const char c = text[pos];
    if (quoted) {
      if (c == '"' && pos + 1 < text.size() && text[pos + 1] == '"') field += '"', ++pos;
      else if (c == '"') quoted = false;
      else field += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(field), field.clear();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n') ++pos;
      ++pos;
      break;
    } else {
      field += c;
    }
  }
  out.push_back(field);
  return true;
}

double num(const PublishedRun& r, const std::string& key, double fallback = -1) {
  auto it = r.fields.find(key);
  if (it == r.fields.end() || it->second.empty()) {
    if (fallback >= 0) return fallback;
    throw Error("published run " + r.id() + ": column '" + key + "' is empty");
  }
  try {
    return std::stod(it->second);
  } catch (...) {
    throw Error("published run " + r.id() + ": column '" + key + "' = '" + it->second + "' is not a number");
  }
}

std::string text(const PublishedRun& r, const std::string& key) {
  auto it = r.fields.find(key);
  return it == r.fields.end() ? std::string() : it->second;
}

int64_t interleave(const PublishedRun& r) {
  if (double v = num(r, "virtual_pipeline_chunks", 0); v > 1) return int64_t(v);
  // Korthikanti et al.'s 175B and 530B: the interleave factor calculon assumes (3) is the
  // one under which the paper's Figure 1 activation figures come out exactly.
  const std::string notes = text(r, "notes");
  if (notes.find("pipeline_interleaving=3") != std::string::npos) return 3;
  return 1;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Note [Published model shapes]
// A row's model is read by name (in any case) where its architecture is not GPT-2's: Llama rows run as
// loom's Llama (RoPE, SwiGLU with ffn_hidden the gate/up width, grouped-query attention);
// Nemotron-4 (grouped-query attention, a two-matrix squared-ReLU MLP) runs as Llama with
// ffn = 2/3 ffn_hidden, the SwiGLU MLP of the same parameters and FLOPs. Everything else is
// GPT. Returns the model's config keys.
// The row's model name in lower case (sources write "Llama 3.1 70B", "LLAMA3_70B").
std::string model_name(const PublishedRun& row) {
  std::string name = text(row, "model");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
  return name;
}
bool is_nemotron(const PublishedRun& row) { return contains(model_name(row), "nemotron"); }
// Vocabulary unstated: Nemotron's tokenizer, 256,000 tokens (Nemotron-4 15B technical report,
// Parmar et al. 2024, Sec. 2; every Nemotron row of the reference that states one), else the
// Megatron papers' padded GPT-2 vocabulary, 51,200.
int64_t row_vocab(const PublishedRun& row) { return int64_t(num(row, "vocab_size", is_nemotron(row) ? 256000 : 51200)); }

std::vector<std::string> model_keys(const PublishedRun& row, int64_t heads) {
  const bool llama = contains(model_name(row), "llama"), nemotron = is_nemotron(row);
  // Unstated on a GPT row: Megatron-LM's default 4 h (Note [Unstated Megatron flags]).
  int64_t ffn = int64_t(num(row, "ffn_hidden", llama || nemotron ? -1 : 4 * num(row, "hidden_size")));
  if (nemotron) ffn = ffn * 2 / 3;
  return {"model.preset=custom", std::string("model.arch=") + (llama || nemotron ? "llama" : "gpt"),
          "model.layers=" + text(row, "num_layers"), "model.d_model=" + text(row, "hidden_size"),
          "model.heads=" + std::to_string(heads),
          "model.kv_heads=" + std::to_string(int64_t(num(row, "num_query_groups", double(heads)))),
          "model.ffn=" + std::to_string(ffn), "model.vocab=" + std::to_string(row_vocab(row)),
          "model.ctx=" + text(row, "seq_length")};
}

bool nemo_launcher(const PublishedRun& row) { return contains(text(row, "framework"), "NeMo Launcher"); }
// NVIDIA's own performance tables: NeMo (its launcher, NeMo 1.x and 2.x) and Megatron-Bridge.
bool nvidia_recipe(const PublishedRun& row) {
  const std::string fw = text(row, "framework");
  return contains(fw, "NeMo") || contains(fw, "Megatron-Bridge");
}
// Megatron-core with Transformer Engine: NeMo's engine, and Megatron-LM's own core releases.
bool megatron_core(const PublishedRun& row) {
  const std::string fw = text(row, "framework");
  return contains(fw, "NeMo") || contains(fw, "Megatron-Core");
}

// PyTorch FSDP, Megatron-FSDP and MaxText shard parameters, gradients and optimizer state
// (ZeRO-3; SHARD_GRAD_OP keeps parameters whole, ZeRO-2); Megatron's DDP shards nothing; the
// distributed optimizer (ZeRO-1) where Megatron's flags or NVIDIA's recipes imply it.
int64_t zero_stage(const PublishedRun& row) {
  const std::string z = text(row, "zero_or_sharding");
  if (contains(z, "FULL_SHARD") || contains(z, "ZeRO-3") || contains(z, "Megatron-FSDP")) return 3;
  if (contains(z, "SHARD_GRAD_OP") || contains(z, "ZeRO-2")) return 2;
  if (z.empty() && contains(text(row, "notes"), "--overlap-param-gather")) return 1;  // Note [Unstated Megatron flags]
  if ((z.empty() || contains(z, "not stated")) && nvidia_recipe(row)) return 1;  // Note [NVIDIA recipes]
  return 0;
}

// Note [NeMo launcher configs]
// The S09 rows (NVIDIA's dgxc-benchmarking, NeMo container 24.12 through the NeMo Framework
// Launcher) state the model, the parallel sizes and the micro-batch; the rest is the launcher's
// training config for the model, which every row's README names ("the default configuration
// for Nemotron 15b": NeMo-Framework-Launcher, launcher_scripts/conf/training/nemotron/
// nemotron_15b.yaml; gpt3/175b; llama/llama3_1_70b and 405b; dgxc-benchmarking's own copies
// nemotron4-15b-synth, nemotron4-340b-synth and nemo_megatron/gpt3_175b_hydra). Every one sets
// sequence_parallel: true and optim distributed_fused_adam with overlap_grad_sync and
// overlap_param_sync: sp wherever tp > 1 and ZeRO-1 with the gradient reduce and the parameter
// gather overlapped; activations_checkpoint_granularity: null (no recompute) except Nemotron-4
// 340B's (selective). ub_tp_comm_overlap (Transformer Engine's userbuffers: tp communication
// overlapped with the GEMMs) is true in each except Nemotron-4 340B's. A row that states a value
// keeps it. (Llama 3.1 8B's config was not read; it runs tp 1, where only the optimizer's
// settings apply, taken as its siblings'.)
//
// Note [NVIDIA recipes]
// NVIDIA's other performance tables (S05-S08: NeMo 24.03 and 24.07's performance pages, run
// with the launcher's configs of those releases; NeMo 2's and Megatron-Bridge's
// scripts/performance recipes, which Megatron-LM's Llama README says its fp8 table follows)
// state the layout and leave the rest to the recipe. What every such recipe sets is taken, as
// for the launcher above: the distributed optimizer with the gradient reduce and the parameter
// gather overlapped (the launcher's distributed_fused_adam with overlap_grad_sync and
// overlap_param_sync; NeMo 2's and Megatron-Bridge's use_distributed_optimizer with
// overlap_grad_reduce and overlap_param_gather), so a row whose sharding is unstated or reads
// "distributed optimizer setting not stated" runs ZeRO-1; sequence parallelism with Transformer
// Engine's userbuffer tp overlap wherever tp > 1, except NVFP4, for which Megatron-Bridge's
// Llama recipes turn the tp overlap off. Megatron-FSDP (its "optim_grads_params" sharding) is
// ZeRO-3. Recompute is stated by the launcher's S09 configs; elsewhere it is the least that
// fits (Note [Unstated recompute]). On Grace-Blackwell without pipeline parallelism the recipes
// offload activations to the Grace host instead (Megatron-Bridge's Llama 3 presets set
// cpu_offloading_num_layers, 20-30 layers for Llama 3 70B on GB300 under Megatron-FSDP), so
// such a row that fits only with help offloads the least layers that fit (Note [Activation
// offload]) before it recomputes.
//
// NeMo 1.x's pages (24.03, 24.07) ran the launcher's training config of the model. Llama 2
// 7B's (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/llama/llama2_7b.yaml,
// the same in the fork of Transformer Engine's context-parallel author, whose run names carry
// the cp, tp and sequence sizes) sets sequence_parallel: false and ub_tp_comm_overlap: False.
// So such a row at tp > 1 (the 24.03 long-sequence table's Llama 2 7B with cp) runs plain tp:
// its all-reduces on the critical path, the norms over the whole sequence. On those rows (84,
// 87) the prediction was 38% and 12% too fast in TFLOP/s, 22% and 8% with the config read.
bool grace_offload(const PublishedRun& row, const PublishedCase& c) {
  return nvidia_recipe(row) && c.cluster.device.host_bw > 0 && c.plan.cfg.parallel.pp == 1;
}
// Where a model's own config departs from what every recipe sets (sp and the userbuffer tp
// overlap at tp > 1, no recompute): Nemotron-4 340B's launcher config (no tp overlap,
// selective recompute) and NeMo 1.x's Llama 2 7B config (neither sp nor tp overlap).
struct ModelConfigFlags {
  const char* config = nullptr;  // the config that says so; nullptr: the recipe's settings
  bool sp = true, tp_overlap = true;
  const char* recompute = "";  // when the row states none
};
ModelConfigFlags model_config_flags(const PublishedRun& row) {
  if (nemo_launcher(row) && contains(text(row, "model"), "Nemotron-4 340B"))
    return {"the NeMo launcher's Nemotron-4 340B config", true, false, "selective"};
  std::string m = model_name(row);
  std::erase_if(m, [](char ch) { return ch == ' ' || ch == '-' || ch == '_'; });
  if (contains(text(row, "framework"), "NeMo 24.0") && contains(m, "llama27b"))
    return {"NeMo launcher's llama2_7b config", false, false, ""};
  return {};
}
bool recipe_tp_overlap(const PublishedRun& row) {
  if (!model_config_flags(row).tp_overlap) return false;
  return nemo_launcher(row) || (nvidia_recipe(row) && !contains(text(row, "precision"), "nvfp4"));
}

// Note [Unstated Megatron flags]
// Megatron-LM's README rows (2024-07, Megatron-Core r0.8.0) give the model, the parallel sizes
// and the overlap flags and leave the rest unstated ("state your assumptions", the reference's
// README). What Megatron-LM itself implies or defaults is taken, and each row says so:
//  - --overlap-param-gather runs only with the distributed optimizer (megatron/training/
//    arguments.py asserts use_distributed_optimizer for it): ZeRO-1.
//  - --tp-comm-overlap runs only with sequence parallelism (arguments.py asserts
//    sequence_parallel for it): sp wherever tp > 1.
//  - ffn_hidden unstated: Megatron's default, 4 x hidden_size (arguments.py).
//  - micro_batch_size unstated: 1, the --micro-batch-size of Megatron-LM's own GPT examples
//    (examples/gpt3/train_gpt3_175b_distributed.sh); gradient accumulation makes up the batch.
//  - interleaving unstated: none (it takes a flag the row does not list).
//  - recompute unstated: the least that fits (Note [Unstated recompute]; the optimizer state is
//    sharded).
bool implied_sp(const PublishedRun& row) {
  const std::string sp = text(row, "sequence_parallel");
  if (!sp.empty()) return sp == "yes";
  if (!model_config_flags(row).sp) return false;  // Note [NVIDIA recipes]
  return num(row, "tensor_parallel") > 1 && (contains(text(row, "notes"), "--tp-comm-overlap") || nvidia_recipe(row));
}

// Note [Published checkpoint]
// llm-foundry's MPT configs use the non-reentrant checkpoint (activation_checkpointing_reentrant:
// false at the rows' commit 4952183768), which stops recomputing once the backward's saved
// tensors are rebuilt from torch 2.1 on (pytorch/pytorch#96866): Note [Recompute]. The README's
// H100 BF16 and 80 GB A100 tables ran mosaicml/pytorch:2.1.0_cu121-nightly20230827 (the runs' own
// table with an image column, benchmarking/h100new.md on a branch, has their tokens/s); the 40 GB
// A100 table predates it (torch 1.13.1 reran the whole block); the 512-GPU "Large Scale" table
// names no image and is assumed the H100 table's (said in the row's assumptions).
bool published_recompute_stops_early(const PublishedRun& row) {
  const std::string src = text(row, "source_detail");
  return text(row, "framework").rfind("llm-foundry", 0) == 0 &&
         (contains(src, "'H100 80GB BF16") || contains(src, "'A100 80GB"));
}

// What the row left unstated and was read from Megatron's flags and defaults, for the report.
std::string unstated_flags(const PublishedRun& row) {
  std::string out;
  auto add = [&](const std::string& what) { out += (out.empty() ? "" : "; ") + what; };
  if (text(row, "micro_batch_size").empty()) add("micro-batch unstated: 1");
  if (text(row, "ffn_hidden").empty()) add("ffn unstated: 4 h");
  if (text(row, "vocab_size").empty() && is_nemotron(row)) add("vocabulary unstated: Nemotron's 256,000");
  if (nvidia_recipe(row)) {
    if (zero_stage(row) == 1)
      add(std::string(nemo_launcher(row) ? "NeMo launcher config" : "NVIDIA recipe") +
          ": distributed optimizer (ZeRO-1), overlapped");
    if (text(row, "sequence_parallel").empty() && implied_sp(row)) add("sequence parallel");
    if (recipe_tp_overlap(row) && num(row, "tensor_parallel") > 1) add("tp communication overlapped");
    const ModelConfigFlags f = model_config_flags(row);
    if (!f.sp && num(row, "tensor_parallel") > 1)
      add(std::string(f.config) + ": no sequence parallelism, no tp overlap");
    if (text(row, "recompute").empty() && *f.recompute) add(std::string("recompute ") + f.recompute);
    return out;
  }
  if (published_recompute_stops_early(row) && text(row, "recompute").rfind("full", 0) == 0)
    add(contains(text(row, "source_detail"), "Large Scale") ? "torch unstated: 2.1's early-stopped recompute, as the H100 table's"
                                                           : "torch 2.1 nightly: recompute stops early");
  if (text(row, "zero_or_sharding").empty() && zero_stage(row) == 1)
    add("--overlap-param-gather: distributed optimizer (ZeRO-1)");
  if (text(row, "sequence_parallel").empty() && implied_sp(row)) add("--tp-comm-overlap: sequence parallel");
  return out;
}

// Note [Published frameworks]
// The attention kernel a row's stack ran (Note [Fused attention kernels]), read from its
// framework column: Megatron-LM 2021-22 computed QK^T, softmax, dropout and PV as separate
// kernels (Narayanan et al. 2021; Korthikanti et al. 2022); llm-foundry names FlashAttention,
// and its 2023 tables predate FlashAttention-2 (released July 2023; the README notes its
// numbers were taken before its torch 2.0 update), so its MPT configs ran FlashAttention-1-class
// kernels (flash-attn 1.x or MPT's Triton port);
// Megatron-core under NeMo runs Transformer Engine's fused attention, cuDNN's Hopper kernel
// on H100; MaxText on GPUs is taken to run cuDNN's flash attention through Transformer
// Engine too (its cudnn_flash_te attention; the rows do not say). A stack the row does not
// name keeps the unfused kernels.
Attention published_attention(const PublishedRun& row) {
  const std::string fw = text(row, "framework");
  if (fw.rfind("Megatron-LM", 0) == 0) return Attention::kUnfused;
  if (megatron_core(row) || contains(fw, "MaxText")) return Attention::kFlash3;
  if (contains(fw, "FlashAttention")) return Attention::kFlash1;
  return Attention::kUnfused;
}

// Note [Stack efficiency]
// The device presets' GEMM and attention curves are what current kernels reach (the H100's
// measured through PyTorch 2.11 / cuBLAS / cuDNN 9.19 in 2026, sustained under its power
// cap: configs/clusters/dgx-h100.toml). A stack of another era can reach less on the same
// device; where a source shows it, its rows run at that fraction of the preset's compute
// rate (the cluster's peak: GEMMs and attention alike; memory-bound kernels and links
// unchanged). `loom simulate --compute-efficiency` states it for a user's stack.
//   llm-foundry / Composer on H100 (the README's 2023 H100 BF16 tables: PyTorch FSDP with
//   FlashAttention-1-class kernels): 0.904, the factor that prices the table's four
//   compute-bound rows - full recompute, >= 40k tokens a micro-batch, so FSDP's collectives are
//   a few percent of the compute - with zero mean error (rows 232, 238, 241, 244, with their
//   stack's backward prefetch, Note [Backward prefetch], and their torch's early-stopped
//   recompute, Note [Published checkpoint]); their sequences run from 1,024 to 16,384, so it
//   is a rate, not an attention curve. It was 0.962 while those rows were priced rerunning the
//   whole block (then every row without recompute came out 7-12% too fast), 0.957 before
//   BACKWARD_POST's gather was priced sharing the links with the reduce-scatter, and 0.873
//   over the preset's earlier, partly assumed curves (GEMMs at 0.76 of peak from a single
//   burst, 4 us a kernel). The source's other 17 H100 rows are its check. Its A100 rows take 1 (at 1 the stack's 27 A100 rows are priced with
//   a median signed error of +3.3%, too fast if anything).
//   Megatron-core with Transformer Engine on H100: NeMo 24.12 through its launcher (S09, read
//   with its configs' flags, Note [NeMo launcher configs]) gives 0.864 by the same rule over
//   its compute-bound rows, those whose predicted step is at least 95% compute at 1
//   (Nemotron-4 15B, rows 136-142, and Llama 3.1 8B, rows 161-165: -8.6% to -14.8% at 1). Its other 11 rows (GPT-3 175B, Nemotron-4
//   340B, Llama 3.1 70B and 405B) are its check. On one lent H100 the simulator prices a GPT's
//   and a Llama's layers within 3-6% of a compiled PyTorch step (docs/log/benchmarks.md), so the
//   factor is what these runs lose beyond the kernels (the overlapped collectives' SMs,
//   context parallelism's ring steps, the launch stream), not kernel rates. It is taken as
//   Megatron-core's on H100 (NeMo's engine), so Megatron-LM's README rows of Megatron-Core
//   r0.8.0 (S04) take it too; they were seen before that choice (+13% to +37% at 1), so they
//   do not check it.
//   Megatron-core on Blackwell (B200, GB200, GB300): the same 0.864. Those presets' kernel
//   curves are the H100's measured ones by assumption (no Blackwell kernel was timed), so what
//   the stack loses beyond them is taken as it is on the H100; its rows (S07, S08) were seen
//   before this choice and do not check it. Pre-Hopper rows (A100, V100) take 1.
constexpr double kFoundryH100Efficiency = 0.904;
constexpr double kMegatronCoreEfficiency = 0.864;

double stack_efficiency(const PublishedRun& row) {
  const std::string gpu = text(row, "gpu_type");
  if (gpu.rfind("A100", 0) == 0 || gpu.rfind("V100", 0) == 0) return 1.0;
  if (gpu.rfind("H100", 0) == 0 && text(row, "framework").rfind("llm-foundry", 0) == 0) return kFoundryH100Efficiency;
  return megatron_core(row) ? kMegatronCoreEfficiency : 1.0;
}

// Whose ZeRO ran the row (Note [Sharding implementations]): rows that shard gradients or
// parameters ran PyTorch FSDP (llm-foundry), an FSDP-like stack (MaxText), or DeepSpeed; a
// DeepSpeed row of 2020-21 ran the per-tensor, synchronizing ZeRO-3 of those releases, a
// later one gathers through _all_gather_base without the per-rank copies or the device
// synchronize and is priced as coalesced. The rest ran Megatron (ZeRO 0-1).
Framework published_framework(const PublishedRun& row) {
  if (zero_stage(row) < 2) return Framework::kMegatron;
  const std::string fw = text(row, "framework"), source = text(row, "source_detail");
  const bool early = contains(fw, "2020") || contains(fw, "2021") || contains(source, "2021") || contains(source, "SC21") ||
                     contains(source, "SC'21");
  return contains(fw, "DeepSpeed") && early ? Framework::kDeepSpeed2021 : Framework::kFsdp;
}

// Note [Published metrics]
// A row is compared in what its source measured: a GPT row by its TFLOP/s where it gives them
// (Megatron's count, Narayanan et al. 2021, is its sources' own formula); otherwise the step
// time, then tokens/s, and TFLOP/s in Megatron's count only as the last resort. A Llama's
// TFLOP/s were counted by its source's own formula (GQA, the three-matrix MLP, its
// vocabulary): NVIDIA's Llama rows that give both imply 0.95-1.06 x Megatron's count per token,
// a bias of up to 6% that the rows' tokens/s do not carry.
std::string published_metric(const PublishedRun& row, bool gpt) {
  if (gpt && !text(row, "tflops_per_gpu").empty()) return "tflops_per_gpu";
  if (!text(row, "iteration_time_s").empty()) return "iteration_time_s";
  if (!text(row, "tokens_per_sec_per_gpu").empty()) return "tokens_per_sec_per_gpu";
  return "tflops_per_gpu";
}

// Whether the row's TFLOP/s count the recomputed forward (Narayanan et al. 2021's 96-form
// count, `metric_counts_recompute` = "yes ..."); the rest (llm-foundry's "model TFLOP/s",
// MFU-based rows) count 3 x the forward.
bool counts_recompute(const PublishedRun& row) { return text(row, "metric_counts_recompute").rfind("yes", 0) == 0; }

}  // namespace

std::string PublishedRun::id() const {
  auto it = fields.find("row_id");
  return it == fields.end() ? "?" : it->second;
}

std::string PublishedRun::label() const {
  auto f = [&](const char* k) {
    auto it = fields.find(k);
    return it == fields.end() ? std::string() : it->second;
  };
  const std::string mb = f("micro_batch_size").empty() ? "?" : f("micro_batch_size");  // Note [Unstated Megatron flags]
  return f("model") + " tp" + f("tensor_parallel") + " pp" + f("pipeline_parallel") + " dp" + f("data_parallel") +
         " mb" + mb + " gb" + f("global_batch_size") + (f("sequence_parallel") == "yes" ? " sp" : "") + " " +
         f("recompute").substr(0, f("recompute").find(' '));
}

std::string PublishedRun::gpu_family() const {
  const auto it = fields.find("gpu_type");
  const std::string gpu = it == fields.end() ? std::string() : it->second;
  return gpu.substr(0, gpu.find_first_of("- "));
}

std::vector<PublishedRun> read_published_runs(const std::string& path) {
  std::ifstream f(path);
  LOOM_CHECK(f, "cannot read published runs file ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_published_runs(ss.str(), path);
}

std::vector<PublishedRun> parse_published_runs(const std::string& all, const std::string& origin) {
  size_t pos = 0;
  std::vector<std::string> header, rec;
  LOOM_CHECK(next_record(all, pos, header) && header.size() > 1, origin, ": no CSV header");
  std::vector<PublishedRun> rows;
  for (int line = 2; next_record(all, pos, rec); ++line) {
    if (rec.size() == 1 && rec[0].empty()) continue;
    LOOM_CHECK(rec.size() == header.size(), origin, ": record ", line, " has ", rec.size(), " fields, the header ",
               header.size());
    PublishedRun r;
    for (size_t i = 0; i < header.size(); ++i) r.fields[header[i]] = rec[i];
    rows.push_back(std::move(r));
  }
  return rows;
}

double megatron_flops_per_iteration(double B, double s, double l, double h, double V, bool recompute_forward) {
  // 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) is 3 x the forward (the MFU count); the
  // recomputed forward adds one more forward of the layers (not the head): 96 and V/(16 l h).
  if (!recompute_forward) return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

namespace {

// Note [A layout short of its GPUs]
// S07's Llama 3 8B table on B200 (NeMo 25.04's long-sequence page) lists a tp x pp x dp x cp
// that is a quarter of its GPU count in every row (the reference README grades it C). Its
// figure is per GPU, which the per-rank layout fixes whichever number is wrong; dp filling the
// GPUs cannot be it (the 1M-token row's global batch of 4 would not cover dp 16). So a row
// scored per GPU whose layout covers a whole fraction of its GPUs runs on the GPUs the layout
// covers, and says so; any other mismatch is refused as before (simulate names it).
// `layout`: the plan's GPUs (SimPlan::gpus(), the row's tp x pp x dp x cp).
int64_t covered_gpus(const PublishedRun& row, int64_t layout, const std::string& metric, std::string& assumed) {
  const int64_t listed = int64_t(num(row, "num_gpus"));
  const bool per_gpu = metric == "tflops_per_gpu" || metric == "tokens_per_sec_per_gpu";
  if (!per_gpu || layout >= listed || listed % layout != 0) return listed;
  assumed += detail::cat(assumed.empty() ? "" : "; ", "tp x pp x dp x cp covers ", layout, " of the ", listed,
                         " GPUs listed: simulated on ", layout, " (the figure is per GPU)");
  return layout;
}

// Note [fp8 GEMMs], Note [NVFP4 GEMMs]: fp8 rows by their scaling, NVFP4; a precision the
// simulator cannot price (another 4- or 6-bit format) is refused by name, never priced as bf16.
GemmFormat row_gemm_format(const PublishedRun& row) {
  const std::string precision = text(row, "precision");
  LOOM_CHECK((!contains(precision, "fp4") || contains(precision, "nvfp4")) && !contains(precision, "fp6"),
             "published run ", row.id(), ": precision '", precision,
             "' is not priced (the simulator prices bf16 / fp16, fp8, MXFP8 and NVFP4 GEMMs)");
  return contains(precision, "nvfp4")     ? GemmFormat::kNvfp4
         : contains(precision, "mxfp8")   ? GemmFormat::kMxfp8
         : contains(precision, "current") ? GemmFormat::kFp8Current
         : contains(precision, "fp8")     ? GemmFormat::kFp8
                                          : GemmFormat::kBf16;
}

}  // namespace

// The cluster preset of a row's gpu_type ("" when none): the GB200 / GB300 rows run in NVL72
// racks, a B200 row in DGX B200 nodes.
std::string gpu_preset(const std::string& gpu) {
  for (const auto& [prefix, preset] : std::vector<std::pair<std::string, std::string>>{
           {"A100", "dgx-a100"}, {"H100", "dgx-h100"}, {"B200", "dgx-b200"}, {"GB200", "gb200-nvl72"},
           {"GB300", "gb300-nvl72"}, {"V100", "dgx-v100"}})
    if (gpu.rfind(prefix, 0) == 0) return preset;
  return "";
}

PublishedCase published_case(const PublishedRun& row) {
  PublishedCase c;
  const std::string gpu = text(row, "gpu_type");
  const std::string preset = gpu_preset(gpu);
  LOOM_CHECK(!preset.empty(), "published run ", row.id(), ": gpu_type '", gpu,
             "' has no cluster preset (dgx-a100, dgx-h100, dgx-b200, gb200-nvl72, gb300-nvl72, dgx-v100)");
  const GemmFormat format = row_gemm_format(row);
  // The 40 GB A100 (SXM4) has HBM2 at 1,555 GB/s against the 80 GB part's 2,039 (NVIDIA A100
  // datasheet); the rest of the dgx-a100 preset holds for both.
  const std::vector<std::string> a100_40 = {"cluster.device.name=A100-SXM4-40GB", "cluster.device.memory_gib=40",
                                            "cluster.device.memory_gbps=1555"};
  const bool forty = gpu.rfind("A100", 0) == 0 && (contains(gpu, "40GB") || contains(gpu, "40 GB"));
  const int64_t heads = int64_t(num(row, "num_attention_heads"));
  const int64_t vpp = interleave(row);
  const int64_t dp = int64_t(num(row, "data_parallel")), mb = int64_t(num(row, "micro_batch_size", 1));
  const int64_t gb = int64_t(num(row, "global_batch_size"));
  const std::string rec = text(row, "recompute").empty() ? model_config_flags(row).recompute : text(row, "recompute");
  std::vector<std::string> sets = model_keys(row, heads);
  sets.insert(sets.end(), {
      "train.batch=" + std::to_string(gb), "train.grad_accum=" + std::to_string(gb / (mb * dp)),
      "parallel.dp=" + std::to_string(dp), "parallel.tp=" + text(row, "tensor_parallel"),
      "parallel.pp=" + text(row, "pipeline_parallel"), "parallel.vpp=" + std::to_string(vpp),
      "parallel.schedule=" + std::string(vpp > 1 ? "interleaved" : "1f1b"),
      "parallel.sp=" + std::string(implied_sp(row) ? "true" : "false"),
      "parallel.recompute=" + std::string(rec.rfind("full", 0) == 0 ? "full" : rec.rfind("selective", 0) == 0 ? "selective" : "none"),
      "parallel.micro_batch=" + std::to_string(mb), "parallel.zero=" + std::to_string(zero_stage(row))});
  // Megatron builds an interleaved pipeline only when each virtual stage gets the same
  // number of layers; Llama 3.1 405B's 126 over pp 8 x vpp 8 (or 16 x 8) runs with the
  // embedding and the loss counted as layers (NVIDIA's Llama 3 recipes set
  // account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split):
  // Note [Stage split].
  const int64_t L = int64_t(num(row, "num_layers")), V = int64_t(num(row, "pipeline_parallel", 1)) * vpp;
  if (vpp > 1 && L % V != 0 && (L + 2) % V == 0)
    sets.insert(sets.end(), {"parallel.pp_account_embedding=true", "parallel.pp_account_loss=true"});
  c.plan.cfg = load_config("", sets);
  c.plan.framework = published_framework(row);
  c.plan.gemm_format = format;
  c.plan.cp = int64_t(num(row, "context_parallel", 1));
  // Megatron's DDP overlapped nothing until 2023; torch DDP (impl=torch) overlaps; a row whose
  // notes name Megatron-core's overlap flags ran with them (Note [Parameter-gather overlap],
  // Note [Tensor-parallel overlap]).
  const std::string notes = text(row, "notes");
  auto flag = [&](const char* f) { return notes.find(f) != std::string::npos; };
  const bool nemo = nvidia_recipe(row) && zero_stage(row) == 1;  // Note [NVIDIA recipes]
  c.plan.dp_overlap = text(row, "zero_or_sharding").find("impl=torch") != std::string::npos || flag("--overlap-grad-reduce") || nemo;
  c.plan.param_gather_overlap = flag("--overlap-param-gather") || nemo;
  c.plan.tp_overlap = flag("--tp-comm-overlap") || recipe_tp_overlap(row);
  // Composer (llm-foundry) gathers backward's next unit after the current one's gradients
  // (Note [Backward prefetch]); its rows leave backward_prefetch at Composer's default.
  c.plan.backward_prefetch_post = text(row, "framework").rfind("llm-foundry", 0) == 0 && zero_stage(row) >= 3;
  // Megatron-LM (2021, 2022) waits for each pipeline send/receive pair before computing on;
  // Megatron-core overlaps its pipeline communication by default.
  c.plan.blocking_p2p = text(row, "framework").rfind("Megatron-LM", 0) == 0;
  c.plan.recompute_early_stop = c.plan.framework == Framework::kFsdp && published_recompute_stops_early(row);
  c.plan.attention = published_attention(row);
  c.metric = published_metric(row, c.plan.cfg.model.arch == Arch::kGpt);
  c.published = num(row, c.metric.c_str());
  c.assumed = unstated_flags(row);
  c.cluster = load_cluster(preset, forty ? a100_40 : std::vector<std::string>{}, covered_gpus(row, c.plan.gpus(), c.metric, c.assumed), "");
  scale_compute_rate(c.cluster, stack_efficiency(row));
  if (rec.empty() && zero_stage(row) >= 1 && !nemo_launcher(row))  // NeMo's configs state theirs
    if (const std::string r = fit_unstated_recompute(c, megatron_core(row), grace_offload(row, c)); !r.empty())
      c.assumed += (c.assumed.empty() ? "" : "; ") + r;
  return c;
}

PublishedCheck check_published(const PublishedRun& row) {
  const PublishedCase c = published_case(row);
  PublishedCheck out{row.id(), row.label(), c.metric, c.published, 0, simulate(c.plan, c.cluster), c.plan, c.assumed};
  if (c.metric == "tflops_per_gpu") {
    const ModelConfig& m = c.plan.cfg.model;
    const double F = megatron_flops_per_iteration(double(c.plan.cfg.train.batch), double(m.ctx), double(m.layers),
                                                  double(m.d_model), double(m.vocab), counts_recompute(row));
    out.predicted = F / out.result.step_time_s / double(c.plan.gpus()) / 1e12;
  } else if (c.metric == "tokens_per_sec_per_gpu") {
    out.predicted = out.result.tokens_per_s / double(c.plan.gpus());
  } else {
    out.predicted = out.result.step_time_s;
  }
  return out;
}

}  // namespace loom::sim
