#include "loom/core/config.h"

#include <algorithm>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string_view>
#include <toml++/toml.h>

#include "loom/core/error.h"

namespace loom {

namespace {

constexpr const char* kSections = "model, data, train, optim, checkpoint, comm, parallel";

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

[[noreturn]] void throw_config_errors(const std::vector<std::string>& errs) {
  std::string msg = errs.size() == 1 ? "invalid config: " : "invalid config (" + std::to_string(errs.size()) + " problems):";
  for (const auto& e : errs) msg += (errs.size() == 1 ? "" : "\n  - ") + e;
  throw ConfigError(msg);
}

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

std::string fmt_double(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  std::string s = os.str();
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos) s += ".0";
  return s;
}

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
      LOOM_INT_KEY(parallel, zero, "ZeRO stage over dp: 0 none, 1 optimizer, 2 + gradients, 3 + parameters"),
      LOOM_INT_KEY(parallel, micro_batch, "sequences per micro-batch per dp rank; 0 = batch / (grad_accum * dp)"),
      // The layout keys are typed in ParallelConfig; these convert their text once.
      LOOM_TEXT_KEY(parallel, schedule, "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v",
                    parse_schedule, schedule_name),
      LOOM_TEXT_KEY(parallel, recompute, "activation recompute: none | selective | full, or per layer: \"full*20,none*4\"",
                    parse_recompute, recompute_text),
      LOOM_TEXT_KEY(parallel, zero_keep, "ZeRO-3: layers whose gathered parameters stay for the whole step, per layer "
                    "keep | shard (e.g. \"keep*4,shard*20\"); empty = shard all", parse_zero_keep, zero_keep_text),
      LOOM_TEXT_KEY(parallel, pp_layers, "layers per pipeline stage, e.g. \"3,4\"; empty = even split", parse_pp_layers,
                    pp_layers_text),
      LOOM_FLOAT_KEY(parallel, bucket_mb, "data-parallel gradient bucket cap in MiB"),
      LOOM_TEXT_KEY(parallel, compress, "dp gradient compression: none | bf16 | int8 | topk | terngrad | powersgd | onebit_adam | zero_one_adam",
                    parse_compress, compress_name),
      LOOM_FLOAT_KEY(parallel, compress_ratio, "topk: fraction of each gradient bucket sent (DGC default 0.001)"),
      LOOM_FLOAT_KEY(parallel, compress_momentum, "topk: DGC momentum correction factor (0 = error feedback only)"),
      LOOM_INT_KEY(parallel, compress_rank, "powersgd: low-rank approximation rank"),
      LOOM_INT_KEY(parallel, compress_warmup_steps, "optimizer steps with exact gradients before compression; -1 = the compressor's default (onebit_adam: the larger of 15% of train.steps and optim.warmup_steps, else 0)"),
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
      LOOM_TEXT_KEY(parallel, reduce, "how dp gradients combine: mean | adasum (dp a power of two, zero 0/1)",
                    parse_grad_reduce, grad_reduce_name),
  };
}

const std::vector<KeyDef>& schema() {
  static const std::vector<KeyDef> keys = [] {
    std::vector<KeyDef> k = {
      LOOM_STRING_KEY(model, preset, "tiny | gpt2 | gpt2-medium | llama | gpt-1.7b..gpt-1t | gpt3-175b | llama2-7b/13b/70b | llama3-8b/70b/405b | custom; sets every model key"),
      KeyDef{"model.arch", "gpt | llama",
             [](Config& c, const RawValue& v, const std::string& k) {
               std::string s = parse_string(k, v);
               if (s == "gpt") c.model.arch = Arch::kGpt;
               else if (s == "llama") c.model.arch = Arch::kLlama;
               else bad_value(k, s, "'gpt' or 'llama'");
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
      LOOM_STRING_KEY(data, shards, "directory of token shards (loom data prepare, or llm.c .bin); replaces data.path"),
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
      LOOM_INT_KEY(train, threads, "CPU threads; 0 = OpenMP default"),
      LOOM_STRING_KEY(train, device, "cpu | cuda (one GPU, bf16; needs a build with -DLOOM_CUDA=ON)"),
      LOOM_STRING_KEY(train, precision, "fp32 | bf16 | fp16 (GEMM inputs rounded, fp32 accumulation, fp32 master weights)"),
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
      LOOM_STRING_KEY(checkpoint, dir, "where the final checkpoint is saved; empty = no save"),
      LOOM_INT_KEY(checkpoint, save_every, "> 0: sharded resumable checkpoint every N steps (dir/step-N)"),
      LOOM_INT_KEY(checkpoint, keep_last, "sharded checkpoints to keep, newest first; 0 = all"),
      LOOM_FLOAT_KEY(comm, timeout_s, "seconds any collective may take before every rank reports and exits"),
      LOOM_BOOL_KEY(comm, check_desync, "debug: compare each collective's op/count across ranks first"),
      LOOM_STRING_KEY(comm, grad_dtype, "fp32 | bf16: payload of the data-parallel gradient all-reduce (zero 0/1)"),
      LOOM_STRING_KEY(comm, param_dtype, "fp32 | bf16: ZeRO-3's parameter all-gathers in bf16 (compute sees rounded weights)"),
      LOOM_STRING_KEY(comm, p2p_dtype, "fp32 | bf16: pipeline activations and their gradients sent in bf16 (pp >= 2)"),
    };
    for (KeyDef& d : parallel_keys()) k.push_back(std::move(d));
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

Config resolve(const std::vector<Assignment>& file_values, const std::vector<Assignment>& overrides) {
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
    validate(c);
    return c;
  }
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

namespace {

bool power_of_two(double x) {
  int e = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &e) == 0.5;
}

// Note [Dynamic loss scaling] (optim/loss_scale.h).
void append_loss_scale_errors(const TrainConfig& t, std::vector<std::string>& errs) {
  const std::string& ls = t.loss_scale;
  const std::string why = ": loss scales are powers of two, so scaling and unscaling change no bits";
  if (ls != "auto" && ls != "dynamic" && ls != "none") {
    char* end = nullptr;
    const double v = std::strtod(ls.c_str(), &end);
    if (ls.empty() || end != ls.c_str() + ls.size())
      errs.push_back("train.loss_scale = '" + ls + "': expected auto, dynamic, none or a number (a static scale)");
    else if (!power_of_two(v))
      errs.push_back("train.loss_scale = " + ls + ": expected a power of two (e.g. 1024)" + why);
  }
  if (!power_of_two(t.loss_scale_min))
    errs.push_back("train.loss_scale_min = " + fmt_double(t.loss_scale_min) + ": expected a power of two" + why);
  if (!power_of_two(t.loss_scale_init))
    errs.push_back("train.loss_scale_init = " + fmt_double(t.loss_scale_init) + ": expected a power of two" + why);
  else if (t.loss_scale_init < t.loss_scale_min)
    errs.push_back("train.loss_scale_init = " + fmt_double(t.loss_scale_init) + " is below train.loss_scale_min = " +
                   fmt_double(t.loss_scale_min));
  if (t.loss_scale_window < 1)
    errs.push_back("train.loss_scale_window = " + std::to_string(t.loss_scale_window) + ": expected >= 1");
}

}  // namespace

namespace {

void require_positive(std::vector<std::string>& errs, const char* name, int64_t v) {
  if (v <= 0) errs.push_back(std::string(name) + " = " + std::to_string(v) + ": expected a positive integer");
}

// false: the model is so far out of range that the later checks (which build per-layer
// lists and divide by these) must not run; its errors are reported alone.
bool check_model(const ModelConfig& m, std::vector<std::string>& errs) {
  const size_t before = errs.size();
  auto positive = [&](const char* name, int64_t v) { require_positive(errs, name, v); };
  positive("model.layers", m.layers);
  positive("model.d_model", m.d_model);
  positive("model.heads", m.heads);
  positive("model.kv_heads", m.kv_heads);
  positive("model.ffn", m.ffn);
  positive("model.vocab", m.vocab);
  positive("model.ctx", m.ctx);
  // Far beyond any real model, and low enough that shapes and their products never overflow.
  constexpr int64_t kMaxDim = int64_t(1) << 24;
  for (auto [name, v] : {std::pair<const char*, int64_t>{"model.layers", m.layers}, {"model.d_model", m.d_model},
                         {"model.heads", m.heads}, {"model.kv_heads", m.kv_heads}, {"model.ffn", m.ffn},
                         {"model.vocab", m.vocab}, {"model.ctx", m.ctx}})
    if (v > kMaxDim) errs.push_back(std::string(name) + " = " + std::to_string(v) + ": expected at most " + std::to_string(kMaxDim));
  // Later checks build per-layer lists and divide by these: a model this far out of range
  // is reported alone.
  if (errs.size() > before) return false;
  if (m.heads > 0 && m.d_model > 0 && m.d_model % m.heads != 0)
    errs.push_back("model.heads = " + std::to_string(m.heads) + " does not divide model.d_model = " +
                   std::to_string(m.d_model) + ": choose heads so that d_model / heads is an integer");
  if (m.heads > 0 && m.d_model > 0 && m.d_model % m.heads == 0 && m.head_dim() % 2 != 0 && m.arch == Arch::kLlama)
    errs.push_back("head dim d_model/heads = " + std::to_string(m.head_dim()) + ": RoPE needs an even head dim");
  if (m.kv_heads > 0 && m.heads > 0 && m.heads % m.kv_heads != 0)
    errs.push_back("model.kv_heads = " + std::to_string(m.kv_heads) + " does not divide model.heads = " +
                   std::to_string(m.heads));
  if (m.arch == Arch::kGpt && m.kv_heads != m.heads && m.kv_heads > 0)
    errs.push_back("model.kv_heads = " + std::to_string(m.kv_heads) + " with arch gpt: GPT-2 has no grouped-query "
                   "attention, set kv_heads = heads = " + std::to_string(m.heads));
  if (m.vocab > 0 && m.vocab < 256)
    errs.push_back("model.vocab = " + std::to_string(m.vocab) + ": the byte tokenizer needs vocab >= 256");
  if (!(m.norm_eps > 0)) errs.push_back("model.norm_eps = " + fmt_double(m.norm_eps) + ": expected > 0");
  if (!(m.rope_theta > 0)) errs.push_back("model.rope_theta = " + fmt_double(m.rope_theta) + ": expected > 0");
  if (!(m.init_std > 0)) errs.push_back("model.init_std = " + fmt_double(m.init_std) + ": expected > 0");

  return true;
}

void check_io(const Config& c, std::vector<std::string>& errs) {
  if (c.checkpoint.save_every < 0)
    errs.push_back("checkpoint.save_every = " + std::to_string(c.checkpoint.save_every) + ": expected >= 0 (0: final only)");
  if (c.checkpoint.keep_last < 0)
    errs.push_back("checkpoint.keep_last = " + std::to_string(c.checkpoint.keep_last) + ": expected >= 0 (0: keep all)");
  if (c.checkpoint.save_every > 0 && c.checkpoint.dir.empty())
    errs.push_back("checkpoint.save_every = " + std::to_string(c.checkpoint.save_every) +
                   " needs checkpoint.dir (where to save)");
  if (!(c.comm.timeout_s > 0 && c.comm.timeout_s < 1e9))
    errs.push_back("comm.timeout_s = " + fmt_double(c.comm.timeout_s) + ": expected seconds in (0, 1e9)");
  if (!c.data.shards.empty() && !c.data.path.empty())
    errs.push_back("data.path = '" + c.data.path + "' and data.shards = '" + c.data.shards +
                   "' are both set: give one (shards carry their own validation split)");
  if (c.data.doc_mask && c.data.shards.empty())
    errs.push_back("data.doc_mask = true needs data.shards: the text corpus has no document boundaries "
                   "(loom data prepare ends each document with the tokenizer's end token)");
  if (!(c.data.val_fraction > 0 && c.data.val_fraction < 1))
    errs.push_back("data.val_fraction = " + fmt_double(c.data.val_fraction) + ": expected a value in (0, 1)");
}

// false: a size beyond any real run; the layout checks, which multiply these, must not run.
bool check_train(const TrainConfig& t, const ModelConfig& m, std::vector<std::string>& errs) {
  auto positive = [&](const char* name, int64_t v) { require_positive(errs, name, v); };
  // Far beyond a real run, and low enough that batch x seq x width products never overflow.
  constexpr int64_t kMaxCount = int64_t(1) << 24;
  const size_t before_bounds = errs.size();
  for (auto [name, v] : {std::pair<const char*, int64_t>{"train.batch", t.batch}, {"train.grad_accum", t.grad_accum},
                         {"train.val_batches", t.val_batches}, {"train.seq", t.seq}, {"train.threads", t.threads}})
    if (v > kMaxCount) errs.push_back(std::string(name) + " = " + std::to_string(v) + ": expected at most " + std::to_string(kMaxCount));
  if (errs.size() > before_bounds) return false;  // the layout checks multiply these
  positive("train.steps", t.steps);
  positive("train.batch", t.batch);
  positive("train.grad_accum", t.grad_accum);
  positive("train.val_batches", t.val_batches);
  positive("train.log_every", t.log_every);
  if (t.seq < 0) errs.push_back("train.seq = " + std::to_string(t.seq) + ": expected >= 0 (0 means model.ctx)");
  if (t.seq > m.ctx && m.ctx > 0)
    errs.push_back("train.seq = " + std::to_string(t.seq) + " exceeds model.ctx = " + std::to_string(m.ctx));
  if (t.val_every < 0) errs.push_back("train.val_every = " + std::to_string(t.val_every) + ": expected >= 0");
  if (t.threads < 0) errs.push_back("train.threads = " + std::to_string(t.threads) + ": expected >= 0");
  if (t.seed < 0) errs.push_back("train.seed = " + std::to_string(t.seed) + ": expected >= 0");
  if (t.device != "cpu" && t.device != "cuda")
    errs.push_back("train.device = '" + t.device + "': expected cpu or cuda");
  if (t.precision != "fp32" && t.precision != "bf16" && t.precision != "fp16")
    errs.push_back("train.precision = '" + t.precision + "': expected fp32, bf16 or fp16");
  append_loss_scale_errors(t, errs);
  return true;
}

void check_optim(const OptimConfig& o, std::vector<std::string>& errs) {
  if (!(o.lr > 0)) errs.push_back("optim.lr = " + fmt_double(o.lr) + ": expected > 0");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    errs.push_back("optim.min_lr_ratio = " + fmt_double(o.min_lr_ratio) + ": expected a value in [0, 1]");
  if (o.warmup_steps < 0) errs.push_back("optim.warmup_steps = " + std::to_string(o.warmup_steps) + ": expected >= 0");
  if (!(o.weight_decay >= 0)) errs.push_back("optim.weight_decay = " + fmt_double(o.weight_decay) + ": expected >= 0");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) errs.push_back("optim.beta1 = " + fmt_double(o.beta1) + ": expected [0, 1)");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) errs.push_back("optim.beta2 = " + fmt_double(o.beta2) + ": expected [0, 1)");
  if (!(o.eps > 0)) errs.push_back("optim.eps = " + fmt_double(o.eps) + ": expected > 0");
  if (!(o.grad_clip >= 0)) errs.push_back("optim.grad_clip = " + fmt_double(o.grad_clip) + ": expected >= 0");
}

}  // namespace

std::vector<std::string> validation_errors(const Config& c) {
  std::vector<std::string> errs;
  if (!check_model(c.model, errs)) return errs;
  check_io(c, errs);
  if (!check_train(c.train, c.model, errs)) return errs;
  check_optim(c.optim, errs);
  append_parallel_errors(c, errs);
  return errs;
}

void validate(const Config& c) {
  if (auto errs = validation_errors(c); !errs.empty()) throw_config_errors(errs);
}

Config config_from_toml_string(const std::string& text, const std::vector<std::string>& overrides) {
  toml::table tbl = parse_toml_text(text, "<string>");
  return resolve(flatten(tbl), parse_overrides(overrides));
}

Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides) {
  std::vector<Assignment> file_values;
  toml::table tbl;
  if (!toml_path.empty()) {
    try {
      tbl = toml::parse_file(toml_path);
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
  return resolve(file_values, parse_overrides(overrides));
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
