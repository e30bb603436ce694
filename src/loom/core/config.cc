#include "loom/core/config.h"

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string_view>
#include <toml++/toml.h>

#include "loom/core/config_text.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"

namespace loom {

namespace {

constexpr const char* kSections = "model, data, train, optim, checkpoint, comm, parallel, memory, offload";

// A config value as it arrives: from TOML (typed) or from --set (text).
struct RawValue {
  std::string text;           // for messages
  const toml::node* node = nullptr;
};

using Setter = std::function<void(Config&, const RawValue&, const std::string& key)>;
using Getter = std::function<std::string(const Config&)>;

struct KeyDef {
  std::string name;  // "section.key"
  std::string help;
  Setter set;
  Getter get;
};

}  // namespace

void throw_config_errors(const std::vector<std::string>& errs) {
  std::string msg = errs.size() == 1 ? "invalid config: " : "invalid config (" + std::to_string(errs.size()) + " problems):";
  for (const auto& e : errs) msg += (errs.size() == 1 ? "" : "\n  - ") + e;
  throw ConfigError(msg);
}

namespace {

[[noreturn]] void bad_value(const std::string& key, const std::string& text, const char* expected) {
  throw ConfigError("config key '" + key + "' = '" + text + "': expected " + expected);
}

int64_t parse_int(const std::string& key, const RawValue& v) {
  if (v.node) {
    // Integer nodes only: toml++ converts a float node too, and one out of int64 range is UB.
    if (v.node->is_integer()) return *v.node->value<int64_t>();
    bad_value(key, v.text, "an integer");
  }
  try {
    size_t pos = 0;
    long long x = std::stoll(v.text, &pos);
    if (pos == v.text.size()) return x;
  } catch (...) {
  }
  bad_value(key, v.text, "an integer");
}

double parse_float(const std::string& key, const RawValue& v) {
  if (v.node) {  // one rule for every source of a value: TOML's inf and nan are refused as --set's are
    if (v.node->is_floating_point() || v.node->is_integer()) {
      const double x = *v.node->value<double>();
      if (std::isfinite(x)) return x;
    }
    bad_value(key, v.text, "a finite number");
  }
  try {
    size_t pos = 0;
    double x = std::stod(v.text, &pos);
    if (pos == v.text.size() && std::isfinite(x)) return x;
  } catch (...) {
  }
  bad_value(key, v.text, "a finite number");
}

std::string parse_string(const std::string& key, const RawValue& v) {
  if (v.node) {
    if (auto s = v.node->value<std::string>(); s && v.node->is_string()) return *s;
    bad_value(key, v.text, "a string");
  }
  return v.text;
}

bool parse_bool(const std::string& key, const RawValue& v) {
  if (v.node) {
    if (auto b = v.node->value<bool>(); b && v.node->is_boolean()) return *b;
    bad_value(key, v.text, "true or false");
  }
  if (v.text == "true") return true;
  if (v.text == "false") return false;
  bad_value(key, v.text, "true or false");
}

std::string quote(const std::string& s) {
  std::ostringstream os;
  os << toml::value<std::string>(s);
  return os.str();
}

}  // namespace

std::string fmt_double(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  std::string s = os.str();
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

namespace {

#define LOOM_INT_KEY(sec, field, helptext)                                                      \
  KeyDef{#sec "." #field, helptext,                                                             \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse_int(k, v); }, \
         [](const Config& c) { return std::to_string(c.sec.field); }}
#define LOOM_FLOAT_KEY(sec, field, helptext)                                                       \
  KeyDef{#sec "." #field, helptext,                                                                \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse_float(k, v); }, \
         [](const Config& c) { return fmt_double(c.sec.field); }}
#define LOOM_BOOL_KEY(sec, field, helptext)                                                       \
  KeyDef{#sec "." #field, helptext,                                                               \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse_bool(k, v); }, \
         [](const Config& c) { return std::string(c.sec.field ? "true" : "false"); }}
#define LOOM_STRING_KEY(sec, field, helptext)                                                       \
  KeyDef{#sec "." #field, helptext,                                                                 \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse_string(k, v); }, \
         [](const Config& c) { return quote(c.sec.field); }}

// A typed key with a text form: parse(text) -> value, name(value) -> text.
#define LOOM_TEXT_KEY(sec, field, helptext, parse, name)                                                  \
  KeyDef{#sec "." #field, helptext,                                                                       \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse(parse_string(k, v)); }, \
         [](const Config& c) { return quote(name(c.sec.field)); }}

// A key of core/config_enums.h: parse(key, text) -> value, name_of(value) -> text.
#define LOOM_ENUM_KEY(sec, field, helptext, parse)                                                            \
  KeyDef{#sec "." #field, helptext,                                                                           \
         [](Config& c, const RawValue& v, const std::string& k) { c.sec.field = parse(k, parse_string(k, v)); }, \
         [](const Config& c) { return quote(name_of(c.sec.field)); }}

// [parallel]: the layout keys.
std::vector<KeyDef> parallel_keys() {
  return {
      LOOM_INT_KEY(parallel, dp, "data-parallel degree"),
      LOOM_INT_KEY(parallel, tp, "tensor-parallel degree (divides heads, kv_heads, ffn)"),
      LOOM_INT_KEY(parallel, pp, "pipeline-parallel degree (stages)"),
      LOOM_INT_KEY(parallel, vpp, "model chunks per pipeline rank (interleaved schedule)"),
      LOOM_BOOL_KEY(parallel, sp, "sequence parallel in the norm/residual regions (needs tp > 1)"),
      LOOM_BOOL_KEY(parallel, vocab_parallel, "under tp: embedding and head split by vocabulary (true) or whole on "
                                              "every tp rank (false: no vocabulary collectives, more memory)"),
      LOOM_INT_KEY(parallel, cp, "context-parallel degree: each sequence split over cp ranks (gradients reduced over dp x cp)"),
      LOOM_ENUM_KEY(parallel, cp_mode, "allgather (K/V gathered once per layer) | ring (K/V blocks passed "
                                            "around the cp ring, online softmax) | ulysses (all-to-all to heads; cp "
                                            "divides the tp rank's heads and kv heads)", parse_cp_mode),
      LOOM_ENUM_KEY(parallel, cp_split, "zigzag (load-balanced causal chunks) | plain", parse_cp_split),
      LOOM_INT_KEY(parallel, zero, "ZeRO stage over dp: 0 none, 1 optimizer, 2 + gradients, 3 + parameters"),
      LOOM_INT_KEY(parallel, micro_batch, "sequences per micro-batch per dp rank; 0 = batch / (grad_accum * dp)"),
      // The layout keys are typed in ParallelConfig; these convert their text once.
      LOOM_TEXT_KEY(parallel, schedule, "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v | 2bw (PipeDream-2BW: no flush, "
                    "one-step-delayed updates) | pipedream (weight stashing, an update per minibatch) | pipemare "
                    "(asynchronous, no stash)",
                    parse_schedule, schedule_name),
      LOOM_TEXT_KEY(parallel, recompute, "activation recompute: none | selective | full, or per layer: \"full*20,none*4\"",
                    parse_recompute, recompute_text),
      LOOM_TEXT_KEY(parallel, zero_keep, "ZeRO-3: layers whose gathered parameters stay for the whole step, per layer "
                    "keep | shard (e.g. \"keep*4,shard*20\"); empty = shard all", parse_zero_keep, zero_keep_text),
      LOOM_TEXT_KEY(parallel, pp_layers, "layers per pipeline stage, e.g. \"3,4\" (the first and last may be 0: "
                    "a stage that only embeds or only runs the head); empty = even split", parse_pp_layers,
                    pp_layers_text),
      LOOM_BOOL_KEY(parallel, pp_account_embedding, "the even split counts the embedding as a layer of the first "
                    "stage (Megatron-LM's --account-for-embedding-in-pipeline-split)"),
      LOOM_BOOL_KEY(parallel, pp_account_loss, "the even split counts the head and loss as a layer of the last "
                    "stage (Megatron-LM's --account-for-loss-in-pipeline-split)"),
      LOOM_BOOL_KEY(parallel, pp_vocab, "the head, loss and embedding split by vocabulary over the pp ranks "
                    "(Yeung et al. 2024; Note [Vocabulary passes])"),
      LOOM_FLOAT_KEY(parallel, bucket_mb, "data-parallel gradient bucket cap in MiB"),
      LOOM_TEXT_KEY(parallel, compress, "dp gradient compression: none | bf16 | int8 | topk | terngrad | powersgd | onebit_adam | zero_one_adam | topk_adam",
                    parse_compress, compress_name),
      LOOM_FLOAT_KEY(parallel, compress_ratio, "topk: fraction of each gradient bucket sent (DGC default 0.001)"),
      LOOM_FLOAT_KEY(parallel, compress_momentum, "topk: DGC momentum correction factor (0 = error feedback only)"),
      LOOM_INT_KEY(parallel, compress_rank, "powersgd: low-rank approximation rank"),
      LOOM_INT_KEY(parallel, compress_warmup_steps, "optimizer steps with exact gradients before compression; -1 = the compressor's default (onebit_adam, topk_adam: the larger of 15% of train.steps and optim.warmup_steps, else 0)"),
      LOOM_TEXT_KEY(parallel, compress_adapt, "none | accordion: switch each bucket between the light "
                    "(compress_rank/ratio) and heavy setting by the change of its gradient norm",
                    parse_compress_adapt, compress_adapt_name),
      LOOM_INT_KEY(parallel, accordion_window, "accordion: optimizer steps per detection window"),
      LOOM_FLOAT_KEY(parallel, accordion_eta, "accordion: relative change of a bucket's window gradient norm that "
                                              "marks a critical regime (light compression)"),
      LOOM_INT_KEY(parallel, accordion_heavy_rank, "accordion with powersgd: the heavy setting's rank"),
      LOOM_FLOAT_KEY(parallel, accordion_heavy_ratio, "accordion with topk: the heavy setting's ratio (0: compress_ratio / 10)"),
      LOOM_INT_KEY(parallel, zero_one_var_freeze_steps, "0/1 Adam: the last step whose variance may update "
                   "(-1 = optim.warmup_steps)"),
      LOOM_INT_KEY(parallel, zero_one_var_scaler, "0/1 Adam: variance updates per interval before it doubles (kappa)"),
      LOOM_INT_KEY(parallel, zero_one_local_scaler, "0/1 Adam: steps per local-step interval before it doubles"),
      LOOM_INT_KEY(parallel, zero_one_local_clip, "0/1 Adam: the longest local-step interval (H)"),
      LOOM_BOOL_KEY(parallel, zeropp_qwz, "ZeRO++ qwZ: ZeRO-3's parameter all-gathers as int8 blocks with a scale each "
                    "(a quarter of fp32's bytes; compute sees the rounded weights)"),
      LOOM_BOOL_KEY(parallel, zeropp_qgz, "ZeRO++ qgZ: ZeRO-2/3's gradient reduce-scatters as an all-to-all of int8 "
                    "blocks with a scale each"),
      LOOM_BOOL_KEY(parallel, zeropp_hpz, "ZeRO++ hpZ: ZeRO-3 keeps a secondary parameter piece per host so "
                    "backward's gathers stay on the host (exact; costs the unit / ranks-per-host in memory)"),
      LOOM_INT_KEY(parallel, pipemare_lr_steps, "pipemare: steps over which the per-stage learning-rate "
                   "rescheduling (lr / delay^p, p from 1 to 0) anneals away; -1 = optim.warmup_steps"),
      LOOM_FLOAT_KEY(parallel, pipemare_decay, "pipemare: decay D of the weight-velocity estimate per step of delay "
                     "(discrepancy correction; 0 = off)"),
      LOOM_INT_KEY(parallel, sync_warmup_steps, "2bw, pipedream, pipemare: steps trained synchronously (a flush "
                   "after each) before the asynchronous stream starts; 0 = none"),
      LOOM_INT_KEY(parallel, ps_servers, "parameter servers added to the dp workers (0: collective data parallel)"),
      LOOM_TEXT_KEY(parallel, reduce, "how dp gradients combine: mean | adasum (dp a power of two, any ZeRO stage)",
                    parse_grad_reduce, grad_reduce_name),
  };
}

// Where state lives (memory budget, offload) and how parameter servers apply pushes.
std::vector<KeyDef> state_keys() {
  return {
      LOOM_FLOAT_KEY(memory, limit_gib, "per-rank budget for loom's resident state (GiB); 0 = the machine's memory"),
      LOOM_ENUM_KEY(offload, optimizer, "none | disk: AdamW moments in a scratch file under offload.dir, streamed", parse_offload_tier),
      LOOM_ENUM_KEY(offload, params, "none | disk: parameters in the offload file too, each unit read just in time", parse_offload_tier),
      LOOM_ENUM_KEY(offload, grads, "none | disk: gradients in chunks too, spilled to the offload file (one process)", parse_offload_tier),
      LOOM_STRING_KEY(offload, dir, "existing writable directory for the offload scratch files"),
      LOOM_FLOAT_KEY(offload, sub_group_mb, "MiB of each moment per streamed sub-group"),
      LOOM_INT_KEY(offload, slots, "sub-group buffers (>= 2): one updated, the others reading ahead / writing behind"),
      LOOM_BOOL_KEY(offload, direct, "O_DIRECT: the offload file bypasses the page cache"),
      LOOM_FLOAT_KEY(offload, chunk_mb, "parameter offload's chunk size in MiB (0: one chunk per unit)"),
      LOOM_ENUM_KEY(ps, mode, "parameter servers (parallel.ps_servers > 0): sync | async | ssp", parse_ps_mode),
      LOOM_INT_KEY(ps, staleness, "ps.mode = ssp: steps a worker may run ahead of the slowest (>= 0)"),
      LOOM_BOOL_KEY(ps, sparse_embedding, "push / pull only the embedding rows a step reads; lazy AdamW (Llama, sync)"),
      LOOM_INT_KEY(ps, slow_worker, "benchmarks: this worker runs ps.slow_factor times slower (-1: none)"),
      LOOM_FLOAT_KEY(ps, slow_factor, "benchmarks: the slowed worker's compute time multiplier (>= 1)"),
  };
}

const std::vector<KeyDef>& schema() {
  static const std::vector<KeyDef> keys = [] {
    std::vector<KeyDef> k = {
      LOOM_STRING_KEY(model, preset, "tiny | gpt2 | gpt2-medium | llama | gpt-1.7b..gpt-1t | gpt3-175b | llama2-7b/13b/70b | llama3-8b/70b/405b | custom; sets every model key"),
      KeyDef{"model.arch", "gpt | llama",
             [](Config& c, const RawValue& v, const std::string& k) {
               const std::string s = parse_string(k, v);
               if (s != "gpt" && s != "llama") bad_value(k, s, "'gpt' or 'llama'");
               c.model.arch = s == "gpt" ? Arch::kGpt : Arch::kLlama;
             },
             [](const Config& c) { return quote(c.model.arch == Arch::kGpt ? "gpt" : "llama"); }},
      LOOM_INT_KEY(model, layers, "transformer blocks"),
      LOOM_INT_KEY(model, d_model, "residual width"),
      LOOM_INT_KEY(model, heads, "query heads; must divide d_model"),
      LOOM_INT_KEY(model, kv_heads, "key/value heads (GQA); must divide heads; GPT needs = heads"),
      LOOM_INT_KEY(model, ffn, "MLP hidden width"),
      LOOM_INT_KEY(model, vocab, "vocabulary size (>= 256 for the byte tokenizer)"),
      LOOM_INT_KEY(model, ctx, "maximum sequence length"),
      LOOM_FLOAT_KEY(model, norm_eps, "LayerNorm/RMSNorm epsilon"),
      LOOM_FLOAT_KEY(model, rope_theta, "RoPE base (Llama)"),
      LOOM_FLOAT_KEY(model, init_std, "std of the normal weight init"),
      LOOM_STRING_KEY(data, path, "UTF-8 text file or directory; empty = Debian fortunes"),
      LOOM_STRING_KEY(data, shards, "directory of token shards (loom data prepare, or llm.c .bin), or a mixture W:DIR,W:DIR,...; replaces data.path"),
      LOOM_STRING_KEY(data, tokenizer, "the tokenizer that wrote data.shards (checked; loom sample decodes with it)"),
      LOOM_BOOL_KEY(data, doc_mask, "attention stays inside each document of a packed window (needs data.shards)"),
      LOOM_BOOL_KEY(data, bucketing, "one document per row, rows of similar length padded to a bucket (needs data.shards)"),
      LOOM_INT_KEY(data, buckets, "data.bucketing: padded lengths ceil(i seq / buckets), i = 1..buckets; 0 = seq / 8"),
      LOOM_INT_KEY(data, bucket_pool, "data.bucketing: global batches per length-sorted megabatch (1: random lengths)"),
      LOOM_FLOAT_KEY(data, val_fraction, "fraction of 4 KiB blocks held out for validation"),
      LOOM_INT_KEY(train, steps, "optimizer steps"),
      LOOM_INT_KEY(train, batch, "global batch in sequences per optimizer step"),
      LOOM_INT_KEY(train, grad_accum, "micro-batches per step (must divide batch)"),
      LOOM_INT_KEY(train, seq, "sequence length; 0 = model.ctx"),
      LOOM_INT_KEY(train, seed, "seed for init and data order"),
      LOOM_INT_KEY(train, val_every, "steps between validations; 0 = only at the end"),
      LOOM_INT_KEY(train, val_batches, "batches per validation"),
      LOOM_INT_KEY(train, log_every, "steps between log lines"),
      LOOM_STRING_KEY(train, tensorboard, "directory for TensorBoard event files (every step's scalars); empty = none"),
      LOOM_INT_KEY(train, threads, "CPU threads; 0 = OpenMP default"),
      LOOM_ENUM_KEY(train, device, "cpu | cuda (one GPU, bf16; needs a build with -DLOOM_CUDA=ON)", parse_device),
      LOOM_ENUM_KEY(train, precision, "fp32 | bf16 | fp16 (GEMM inputs rounded, fp32 accumulation, fp32 master weights)", parse_precision),
      LOOM_ENUM_KEY(train, gemm_format, "bf16 | fp8: the blocks' linear layers in fp8 with delayed scaling (train.device = cuda, Llama); fp8-current | mxfp8 | nvfp4: priced by loom simulate only", parse_gemm_format),
      LOOM_STRING_KEY(train, loss_scale, "auto (dynamic for fp16, else none) | dynamic | none | a power of two (static)"),
      LOOM_FLOAT_KEY(train, loss_scale_init, "dynamic loss scaling: the first scale (a power of two)"),
      LOOM_INT_KEY(train, loss_scale_window, "dynamic loss scaling: steps without overflow before the scale doubles"),
      LOOM_FLOAT_KEY(train, loss_scale_min, "dynamic loss scaling: the floor; an overflow there stops the run"),
      LOOM_FLOAT_KEY(optim, lr, "peak learning rate"),
      LOOM_FLOAT_KEY(optim, min_lr_ratio, "final lr as a fraction of the peak (cosine)"),
      LOOM_INT_KEY(optim, warmup_steps, "linear warmup steps"),
      LOOM_FLOAT_KEY(optim, weight_decay, "AdamW decoupled weight decay (matrices only)"),
      LOOM_FLOAT_KEY(optim, beta1, "AdamW beta1"),
      LOOM_FLOAT_KEY(optim, beta2, "AdamW beta2"),
      LOOM_FLOAT_KEY(optim, eps, "AdamW epsilon"),
      LOOM_FLOAT_KEY(optim, grad_clip, "global grad-norm clip; 0 disables"),
      LOOM_ENUM_KEY(optim, name, "adamw | sgd (SGD with momentum, coupled L2 weight decay on matrices)", parse_optimizer),
      LOOM_FLOAT_KEY(optim, momentum, "optim.name = sgd: momentum in [0, 1)"),
      KeyDef{"optim.moments", "fp32 | bf16: AdamW's m and v stored in bf16, stochastically rounded (half the optimizer memory; approximate)",
             [](Config& c, const RawValue& v, const std::string& k) {
               c.optim.moments = parse_float_format(k, parse_string(k, v), "AdamW's m and v stored in bf16, stochastically rounded");
             },
             [](const Config& c) { return quote(name_of(c.optim.moments)); }},
      LOOM_STRING_KEY(checkpoint, dir, "where the final checkpoint is saved; empty = no save"),
      LOOM_INT_KEY(checkpoint, save_every, "> 0: sharded resumable checkpoint every N steps (dir/step-N)"),
      LOOM_INT_KEY(checkpoint, keep_last, "sharded checkpoints to keep, newest first; 0 = all"),
      LOOM_INT_KEY(checkpoint, memory_every, "> 0: in-memory checkpoint every N steps in each host's memory and a peer host's; a lost host costs at most N steps and no disk read"),
      LOOM_STRING_KEY(checkpoint, memory_dir, "memory file system (tmpfs) holding the in-memory checkpoints' per-host stores"),
      LOOM_FLOAT_KEY(comm, timeout_s, "seconds any collective may take before every rank reports and exits"),
      LOOM_FLOAT_KEY(comm, hang_s, "--nproc: seconds a rank may block outside any collective, using no CPU, before the supervisor ends the job (0 = off)"),
      LOOM_FLOAT_KEY(comm, rejoin_s, "--elastic: seconds after which a lost host is probed again; the job grows back onto it at its next checkpoint"),
      LOOM_BOOL_KEY(comm, check_desync, "debug: compare each collective's op/count across ranks first"),
      LOOM_ENUM_KEY(comm, grad_dtype, "fp32 | bf16: payload of the data-parallel gradient all-reduce or reduce-scatter (any ZeRO stage)", parse_float_format),
      LOOM_ENUM_KEY(comm, param_dtype, "fp32 | bf16: ZeRO-3's parameter all-gathers in bf16 (compute sees rounded weights)", parse_float_format),
      LOOM_ENUM_KEY(comm, p2p_dtype, "fp32 | bf16: pipeline activations and their gradients sent in bf16 (pp >= 2)", parse_float_format),
    };
    for (KeyDef& d : parallel_keys()) k.push_back(std::move(d));
    for (KeyDef& d : state_keys()) k.push_back(std::move(d));
    return k;
  }();
  return keys;
}

const KeyDef* find_key(const std::string& name) {
  for (const auto& k : schema())
    if (k.name == name) return &k;
  return nullptr;
}

std::string known_keys_in(const std::string& section) {
  std::string out;
  for (const auto& k : schema()) {
    if (k.name.rfind(section + ".", 0) != 0) continue;
    if (!out.empty()) out += ", ";
    out += k.name.substr(section.size() + 1);
  }
  return out;
}

const KeyDef& require_key(const std::string& name) {
  if (const KeyDef* k = find_key(name)) return *k;
  auto dot = name.find('.');
  std::string section = dot == std::string::npos ? name : name.substr(0, dot);
  std::string known = known_keys_in(section);
  if (known.empty())
    throw ConfigError("unknown config section '" + section + "' in '" + name +
                      "'; expected one of: " + std::string(kSections));
  throw ConfigError("unknown config key '" + name + "'; keys in [" + section + "]: " + known);
}

struct Assignment {
  std::string key;
  RawValue value;
};

// Flattens a parsed TOML table into (section.key, value) pairs, rejecting nesting.
std::vector<Assignment> flatten(const toml::table& tbl) {
  std::vector<Assignment> out;
  for (const auto& [sec, node] : tbl) {
    std::string section(sec.str());
    const toml::table* inner = node.as_table();
    if (!inner)
      throw ConfigError("config entry '" + section + "' must be a [section] table; sections: " +
                        std::string(kSections));
    for (const auto& [k, v] : *inner) {
      std::ostringstream text;
      v.visit([&](auto&& n) { text << n; });
      out.push_back({section + "." + std::string(k.str()), RawValue{text.str(), &v}});
    }
  }
  return out;
}

std::vector<Assignment> parse_overrides(const std::vector<std::string>& overrides) {
  std::vector<Assignment> out;
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--set '" + o + "': expected section.key=value, e.g. --set train.steps=100");
    out.push_back({o.substr(0, eq), RawValue{o.substr(eq + 1), nullptr}});
  }
  return out;
}

// Note [Model given by shape]: with no model.preset named, the default preset (tiny) fills
// the keys the user left out. A width from the user with tiny's ffn is a silent mismatch
// (issue 24), so when model.d_model is given and model.ffn is not, ffn follows the
// architecture: 4 d for GPT (Radford et al. 2019), and for Llama Meta's rule, 2/3 of 4 d
// rounded up to a multiple of 256 (llama/model.py, multiple_of = 256). Every key still taken
// from tiny is named in model.notes, which train and simulate print.
std::vector<std::string> given_model_keys(const std::vector<Assignment>& a, const std::vector<Assignment>& b) {
  std::vector<std::string> keys;
  for (const auto* list : {&a, &b})
    for (const auto& x : *list)
      if (x.key.rfind("model.", 0) == 0 && std::find(keys.begin(), keys.end(), x.key) == keys.end())
        keys.push_back(x.key);
  return keys;
}

// check: validate the values (else only the keys, types and parses are checked).
Config resolve(const std::vector<Assignment>& file_values, const std::vector<Assignment>& overrides, bool check) {
  Config c;
  // Validate every key name first so a typo is reported even if the preset is also bad.
  for (const auto* list : {&file_values, &overrides})
    for (const auto& a : *list) require_key(a.key);
  // Preset: the last assignment to model.preset wins; it sets every model key.
  std::string preset = c.model.preset;
  bool preset_named = false;
  for (const auto* list : {&file_values, &overrides})
    for (const auto& a : *list)
      if (a.key == "model.preset") preset = parse_string(a.key, a.value), preset_named = true;
  apply_model_preset(c.model, preset);
  bool kv_given = false;
  std::vector<std::string> bad;  // values that do not parse; reported with the validation's findings
  for (const auto* list : {&file_values, &overrides})
    for (const auto& a : *list) {
      try {
        if (a.key != "model.preset") require_key(a.key).set(c, a.value, a.key);
      } catch (const ConfigError& e) {
        bad.push_back(e.what());
      }
      kv_given |= a.key == "model.kv_heads";
    }
  // GPT has no GQA: unless kv_heads was given, it follows heads.
  if (c.model.arch == Arch::kGpt && !kv_given) c.model.kv_heads = c.model.heads;
  if (!preset_named) complete_model_by_shape(c.model, given_model_keys(file_values, overrides));
  if (bad.empty()) {
    if (check) validate(c);
    return c;
  }
  if (!check) throw_config_errors(bad);
  // A bad value leaves its key at the default; the rest is checked as the run would be, so
  // one pass lists every problem.
  const std::vector<std::string> rest = validation_errors(c);
  if (bad.size() == 1 && rest.empty()) throw ConfigError(bad.front());
  bad.insert(bad.end(), rest.begin(), rest.end());
  throw_config_errors(bad);
}

toml::table parse_toml_text(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "cannot parse config " << origin << " at line " << e.source().begin.line << ", column "
       << e.source().begin.column << ": " << e.description();
    throw ConfigError(os.str());
  }
}

}  // namespace

Config config_from_toml_string(const std::string& text, const std::vector<std::string>& overrides) {
  toml::table tbl = parse_toml_text(text, "<string>");
  return resolve(flatten(tbl), parse_overrides(overrides), true);
}

// A config is a few kilobytes; anything past this is not one.
constexpr size_t kMaxConfigBytes = size_t(16) << 20;

static Config read_config(const std::string& toml_path, const std::vector<std::string>& overrides, bool check) {
  std::vector<Assignment> file_values;
  toml::table tbl;
  if (!toml_path.empty()) {
    std::string text;
    try {  // a regular file of sane size: never a FIFO or a device such as /dev/urandom (issue 59)
      text = owned::read_regular(toml_path, kMaxConfigBytes);
    } catch (const Error& e) {
      throw ConfigError(std::string("config: ") + e.what());
    }
    try {
      tbl = toml::parse(text, toml_path);
    } catch (const toml::parse_error& e) {
      std::ostringstream os;
      os << "cannot parse config '" << toml_path << "'";
      if (e.source().begin.line > 0)
        os << " at line " << e.source().begin.line << ", column " << e.source().begin.column;
      os << ": " << e.description();
      throw ConfigError(os.str());
    }
    file_values = flatten(tbl);
  }
  return resolve(file_values, parse_overrides(overrides), check);
}

Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides) {
  return read_config(toml_path, overrides, true);
}

Config load_config_unvalidated(const std::string& toml_path, const std::vector<std::string>& overrides) {
  return read_config(toml_path, overrides, false);
}

std::string to_toml(const Config& c) {
  std::string out, current;
  for (const auto& k : schema()) {
    auto dot = k.name.find('.');
    std::string sec = k.name.substr(0, dot);
    if (sec != current) {
      out += (current.empty() ? "[" : "\n[") + sec + "]\n";
      current = sec;
    }
    out += k.name.substr(dot + 1) + " = " + k.get(c) + "\n";
  }
  return out;
}

bool same_model(const Config& a, const Config& b) {
  const std::string x = to_toml(a), y = to_toml(b);
  return x.substr(0, x.find("[data]")) == y.substr(0, y.find("[data]"));  // [model] is first
}

std::vector<std::pair<std::string, std::string>> config_key_help() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : schema()) out.emplace_back(k.name, k.help);
  return out;
}

}  // namespace loom
