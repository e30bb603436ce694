// Validation of the [parallel] section: every violation with its values and valid choices.
#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "loom/core/config.h"
#include "loom/core/error.h"

namespace loom {

namespace {

std::string str(int64_t v) { return std::to_string(v); }
std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + str(v[i]);
  return s;
}

// Divisors of every value in `of` (all > 0), ascending.
std::vector<int64_t> common_divisors(const std::vector<int64_t>& of) {
  std::vector<int64_t> out;
  if (of.empty()) return out;
  for (int64_t d = 1; d <= of.front(); d++) {
    bool all = true;
    for (int64_t x : of) all = all && x % d == 0;
    if (all) out.push_back(d);
  }
  return out;
}

void check_degrees(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  for (auto [name, v] : {std::pair{"parallel.dp", p.dp}, {"parallel.tp", p.tp}, {"parallel.pp", p.pp},
                         {"parallel.vpp", p.vpp}})
    if (v < 1) errs.push_back(std::string(name) + " = " + str(v) + ": expected a positive integer");
  if (p.zero < 0 || p.zero > 3) errs.push_back("parallel.zero = " + str(p.zero) + ": expected 0, 1, 2 or 3");
  if (p.micro_batch < 0)
    errs.push_back("parallel.micro_batch = " + str(p.micro_batch) + ": expected >= 0 (0 derives it from train.batch)");
  if (!(p.bucket_mb > 0 && p.bucket_mb <= 1 << 20))
    errs.push_back("parallel.bucket_mb = " + std::to_string(p.bucket_mb) + ": expected MiB in (0, 1048576]");
  if (c.model.layers > 0) {
    for (const auto& check : {std::function<void()>([&] { p.recompute_layers(c.model.layers); }),
                              std::function<void()>([&] { p.zero_keep_layers(c.model.layers); })}) {
      try {
        check();
      } catch (const ConfigError& e) {
        errs.push_back(e.what());
      }
    }
  }
  if (!p.zero_keep.empty() && p.zero != 3)
    errs.push_back("parallel.zero_keep = '" + zero_keep_text(p.zero_keep) + "' needs parallel.zero = 3 (it is " + str(p.zero) +
                   "): only ZeRO-3 shards parameters");

  const ModelConfig& m = c.model;
  if (p.tp > 1 && m.heads > 0 && m.kv_heads > 0 && m.ffn > 0 &&
      (m.heads % p.tp || m.kv_heads % p.tp || m.ffn % p.tp)) {
    errs.push_back("parallel.tp = " + str(p.tp) + " does not divide model.heads = " + str(m.heads) +
                   ", model.kv_heads = " + str(m.kv_heads) + " and model.ffn = " + str(m.ffn) +
                   "; valid tp: " + join(common_divisors({m.heads, m.kv_heads, m.ffn})));
  }
  if (p.sp && p.tp <= 1)
    errs.push_back("parallel.sp = true needs parallel.tp > 1 (sequence parallel splits the tp group's work); "
                   "set parallel.tp or drop sp");
  const int64_t T = c.seq_len();
  if (p.sp && p.tp > 1 && T > 0 && T % p.tp != 0)
    errs.push_back("parallel.sp = true with sequence length " + str(T) + " not divisible by parallel.tp = " +
                   str(p.tp) + "; valid tp for this sequence: " + join(common_divisors({T, m.heads, m.kv_heads, m.ffn})));
}

void check_pipeline(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  const int64_t L = c.model.layers;
  if (p.pp < 1 || p.vpp < 1 || L < 1) return;
  const int64_t stages = p.pp * p.vpp;
  const int64_t accounted = int64_t(p.pp_account_embedding) + int64_t(p.pp_account_loss);
  if (p.pp_layers.empty() && stages > L + accounted)
    errs.push_back("parallel.pp x parallel.vpp = " + str(p.pp) + " x " + str(p.vpp) + " = " + str(stages) +
                   " stages exceeds model.layers = " + str(L) +
                   (accounted ? " + " + str(accounted) + " accounted (embedding, loss)" : std::string()) +
                   ": every stage needs a layer; valid pp at vpp " + str(p.vpp) + ": 1.." + str((L + accounted) / p.vpp));
  if (p.vpp > 1 && p.schedule != ScheduleKind::kInterleaved1F1B && p.schedule != ScheduleKind::kZbV)
    errs.push_back("parallel.vpp = " + str(p.vpp) + " needs parallel.schedule = interleaved or zb-v (it is '" +
                   schedule_name(p.schedule) + "')");
  if (p.schedule == ScheduleKind::kZbV && p.vpp != 2)
    errs.push_back("parallel.schedule = zb-v runs two model chunks per rank in a V: set parallel.vpp = 2 (have " +
                   str(p.vpp) + ")");
  if (p.schedule == ScheduleKind::kInterleaved1F1B) {
    if (p.vpp < 2 || p.pp < 2)
      errs.push_back("parallel.schedule = interleaved needs parallel.pp >= 2 and parallel.vpp >= 2 (have pp " +
                     str(p.pp) + ", vpp " + str(p.vpp) + "); use 1f1b otherwise");
    else if (c.train.grad_accum > 0 && c.train.grad_accum % p.pp != 0)
      errs.push_back("parallel.schedule = interleaved needs train.grad_accum (micro-batches) = " +
                     str(c.train.grad_accum) + " divisible by parallel.pp = " + str(p.pp) + "; e.g. grad_accum = " +
                     str((c.train.grad_accum / p.pp + 1) * p.pp));
  }
  if (splits_backward(p.schedule)) {  // Note [B/W split] (model/model.h)
    const std::string name = schedule_name(p.schedule);
    if (p.pp < 2)
      errs.push_back("parallel.schedule = " + name + " splits backward to fill pipeline bubbles and needs parallel.pp "
                     ">= 2 (have " + str(p.pp) + "); use 1f1b without a pipeline");
    if (std::find(p.recompute.begin(), p.recompute.end(), Recompute::kFull) != p.recompute.end())
      errs.push_back("parallel.schedule = " + name + " runs each weight gradient after its backward, when a fully "
                     "recomputed layer's inputs are gone; parallel.recompute = '" + recompute_text(p.recompute) +
                     "' has full layers: use none or selective, or schedule 1f1b");
  }
  if (const std::vector<int64_t>& split = p.pp_layers; !split.empty()) {
    int64_t sum = 0;
    for (int64_t v : split) sum += v;
    if (int64_t(split.size()) != stages || sum != L)
      errs.push_back("parallel.pp_layers = \"" + pp_layers_text(split) + "\" lists " + str(int64_t(split.size())) +
                     " stages with " + str(sum) + " layers; need " + str(stages) + " stages (pp x vpp) summing to " +
                     "model.layers = " + str(L));
    for (size_t i = 1; i + 1 < split.size(); ++i)
      if (split[i] == 0)
        errs.push_back("parallel.pp_layers = \"" + pp_layers_text(split) + "\": stage " + str(int64_t(i)) +
                       " holds no layers; only the first stage (it embeds) and the last (it runs the head) may");
    if (accounted)
      errs.push_back("parallel.pp_layers = \"" + pp_layers_text(split) + "\" fixes every stage's layers, so "
                     "parallel.pp_account_embedding / pp_account_loss have nothing to split: drop one or the other");
  }
}

// Note [Global batch]: batch = micro_batch x grad_accum x dp.
void check_batch(const Config& c, std::vector<std::string>& errs) {
  const int64_t B = c.train.batch, A = c.train.grad_accum, D = c.parallel.dp, M = c.parallel.micro_batch;
  if (B <= 0 || A <= 0 || D <= 0 || M < 0) return;
  auto valid_accum = [&] {
    std::vector<int64_t> v;
    for (int64_t a = 1; a <= B / D; a++)
      if (B % (a * D) == 0) v.push_back(a);
    return v;
  };
  if (M > 0) {
    if (M * A * D != B)
      errs.push_back("parallel.micro_batch x train.grad_accum x parallel.dp = " + str(M) + " x " + str(A) + " x " +
                     str(D) + " = " + str(M * A * D) + " but train.batch (the global batch) = " + str(B) +
                     (B % (M * D) == 0 ? "; set train.grad_accum = " + str(B / (M * D))
                                       : "; valid micro_batch at grad_accum " + str(A) + ": " +
                                             (B % (A * D) == 0 ? str(B / (A * D)) : std::string("none"))));
    return;
  }
  if (B % (A * D) != 0) {
    const std::vector<int64_t> ok = valid_accum();
    errs.push_back("train.grad_accum x parallel.dp = " + str(A) + " x " + str(D) + " does not divide train.batch = " +
                   str(B) + ": the micro-batch must be whole; " +
                   (ok.empty() ? "train.batch must be a multiple of parallel.dp = " + str(D)
                               : "valid grad_accum at dp " + str(D) + ": " + join(ok)));
  }
}

// data.bucketing (Note [Length bucketing] in data/length_buckets.h): rows of varying length
// per micro-batch run on dp, tp and ZeRO; the pipeline runner and sequence parallelism size
// their buffers and row splits for one fixed length.
// comm.grad_dtype = bf16 runs the ring all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1/2/3)
// with bf16 messages (Note [Compressed all-reduce], Note [Ring codecs]).
void check_grad_dtype(const Config& c, std::vector<std::string>& errs) {
  if (c.comm.grad_dtype == FloatFormat::kFp32) return;
  if (c.parallel.dp < 2)
    errs.push_back("comm.grad_dtype = bf16 compresses the data-parallel gradient all-reduce, but parallel.dp = " +
                   str(c.parallel.dp) + ": set parallel.dp >= 2 or leave comm.grad_dtype = fp32");
  else if (c.parallel.zeropp_qgz)
    errs.push_back("comm.grad_dtype = bf16 sends bf16 gradients, parallel.zeropp_qgz int8 ones: set only one");
}

// Note [Adasum] (parallel/compress.h): recursive halving over a power-of-two dp group of
// uncompressed gradients, whole buckets at the step's end under every ZeRO stage (Note
// [Compressed ZeRO-2/3]).
void check_adasum(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  if (p.dp < 2 || (p.dp & (p.dp - 1)) != 0)
    errs.push_back("parallel.reduce = adasum combines gradients by recursive halving, which needs parallel.dp a "
                   "power of two >= 2 (2, 4, 8, ...); parallel.dp = " + str(p.dp));
  if (p.zeropp_qgz)  // Note [Compressed ZeRO-2/3]: Adasum reduces whole buckets
    errs.push_back("parallel.reduce = adasum with parallel.zeropp_qgz: Adasum combines whole exact buckets, qgZ "
                   "quantises a reduce-scatter; set only one");
  if (p.compress != CompressKind::kNone || c.comm.grad_dtype != FloatFormat::kFp32)
    errs.push_back(std::string("parallel.reduce = adasum combines exact fp32 gradients; parallel.compress = ") +
                   compress_name(p.compress) + ", comm.grad_dtype = " + std::string(name_of(c.comm.grad_dtype)) +
                   ": set parallel.compress = none and comm.grad_dtype = fp32, or parallel.reduce = mean");
}

// Note [Accordion] (parallel/accordion.h): it switches PowerSGD's rank or top-k's ratio.
void check_accordion(const ParallelConfig& p, std::vector<std::string>& errs) {
  if (p.compress != CompressKind::kPowerSgd && p.compress != CompressKind::kTopK)
    errs.push_back(std::string("parallel.compress_adapt = accordion switches powersgd's rank or topk's ratio; "
                               "parallel.compress = ") + compress_name(p.compress) + ": set powersgd or topk");
  if (p.accordion_window < 1)
    errs.push_back("parallel.accordion_window = " + str(p.accordion_window) + ": expected >= 1 optimizer steps");
  if (p.accordion_eta < 0) errs.push_back("parallel.accordion_eta = " + num(p.accordion_eta) + ": expected >= 0");
  if (p.compress == CompressKind::kPowerSgd && (p.accordion_heavy_rank < 1 || p.accordion_heavy_rank > p.compress_rank))
    errs.push_back("parallel.accordion_heavy_rank = " + str(p.accordion_heavy_rank) +
                   ": the heavy setting's rank must be in [1, parallel.compress_rank = " + str(p.compress_rank) + "]");
  if (p.compress == CompressKind::kTopK && (p.accordion_heavy_ratio < 0 || p.accordion_heavy_ratio > p.compress_ratio))
    errs.push_back("parallel.accordion_heavy_ratio = " + num(p.accordion_heavy_ratio) +
                   ": the heavy setting's ratio must be in (0, parallel.compress_ratio = " + num(p.compress_ratio) +
                   "], or 0 for a tenth of it");
}

// Note [1-bit Adam] (parallel/compress.h): the optimizer freezes a variance the warm-up must
// have filled; under ZeRO the momentum is sharded (Note [Compressed Adam with ZeRO]), but
// 0/1 Adam's local steps run every rank's whole optimizer on its own gradients.
void check_onebit_adam(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  const std::string what = std::string("parallel.compress = ") + compress_name(p.compress);
  if (p.zero != 0 && p.compress == CompressKind::kZeroOneAdam)
    errs.push_back(what + " takes local AdamW steps in which every rank updates all its parameters from its own "
                   "gradients and momentum (Lu et al. 2023), which ZeRO's sharded optimizer cannot; parallel.zero = " +
                   str(p.zero) + ": set parallel.zero = 0, or use onebit_adam | topk_adam (any ZeRO stage)");
  if (p.compress == CompressKind::kZeroOneAdam) {
    for (const auto& [key, v] : {std::pair{"zero_one_var_scaler", p.zero_one_var_scaler},
                                 std::pair{"zero_one_local_scaler", p.zero_one_local_scaler},
                                 std::pair{"zero_one_local_clip", p.zero_one_local_clip}})
      if (v < 1) errs.push_back(std::string("parallel.") + key + " = " + str(v) + ": expected >= 1");
    if (p.compress_warmup_steps > 0)
      errs.push_back("parallel.compress = zero_one_adam has no exact warm-up (its variance steps are the exact ones, "
                     "until parallel.zero_one_var_freeze_steps); parallel.compress_warmup_steps = " +
                     str(p.compress_warmup_steps) + ": leave it at -1 or 0");
    if (p.zero_one_var_freeze_steps < -1)
      errs.push_back("parallel.zero_one_var_freeze_steps = " + str(p.zero_one_var_freeze_steps) +
                     ": expected >= 0, or -1 for optim.warmup_steps");
    return;
  }
  if (p.compress == CompressKind::kTopKAdam && p.compress_momentum != 0)
    errs.push_back("parallel.compress = topk_adam sends Adam's own momentum (Note [Top-k Adam]); "
                   "parallel.compress_momentum = " + num(p.compress_momentum) + " would add DGC's on top: set it to 0");
  if (p.compress_warmup_steps == 0)
    errs.push_back(what + " freezes Adam's variance after parallel.compress_warmup_steps "
                   "exact steps; 0 would freeze it at zero: set it >= 1, or -1 for the larger of 15% of train.steps and "
                   "optim.warmup_steps = " +
                   str(onebit_default_warmup(c.train.steps, c.optim.warmup_steps)));
}

// Note [Gradient compressors] (parallel/compress.h): every compressor needs dp >= 2 and reduces
// whole buckets (under ZeRO too: Note [Compressed ZeRO-2/3]); the stateful ones keep residuals in gradient units, which
// fp16's changing loss scale would corrupt.
void check_compress(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  if (p.compress_ratio <= 0 || p.compress_ratio > 1)
    errs.push_back("parallel.compress_ratio = " + num(p.compress_ratio) + ": expected a fraction in (0, 1]");
  if (p.compress_momentum < 0 || p.compress_momentum >= 1)
    errs.push_back("parallel.compress_momentum = " + num(p.compress_momentum) + ": expected [0, 1)");
  if (p.compress_rank < 1) errs.push_back("parallel.compress_rank = " + str(p.compress_rank) + ": expected >= 1");
  if (p.compress_warmup_steps < -1)
    errs.push_back("parallel.compress_warmup_steps = " + str(p.compress_warmup_steps) +
                   ": expected >= 0, or -1 for the compressor's default");
  if (p.reduce == GradReduce::kAdasum) check_adasum(c, errs);
  if (p.compress_adapt == CompressAdapt::kAccordion) check_accordion(p, errs);
  if (p.compress == CompressKind::kNone) return;
  const std::string what = std::string("parallel.compress = ") + compress_name(p.compress);
  if (c.comm.grad_dtype != FloatFormat::kFp32)
    errs.push_back(what + " with comm.grad_dtype = " + std::string(name_of(c.comm.grad_dtype)) +
                   ": comm.grad_dtype = bf16 is parallel.compress = bf16; set only one");
  if (p.dp < 2)
    errs.push_back(what + " compresses the data-parallel gradients, but parallel.dp = " + str(p.dp) +
                   ": set parallel.dp >= 2 or parallel.compress = none");
  const bool stateful = compress_has_state(p.compress);
  // bf16 and int8 are codecs of the ring, which ZeRO-2/3's reduce-scatter runs too (Note
  // [Ring codecs]); the stateful compressors reduce whole buckets (Note [Compressed ZeRO-2/3]).
  if (p.dp >= 2 && p.zero >= 2 && p.zeropp_qgz)
    errs.push_back(what + " with parallel.zeropp_qgz: both encode ZeRO-2/3's gradient reduction; set only one");
  // parallel::kTernGradMaxDp: TernGrad's int8 sums hold |sum| <= dp.
  if (p.compress == CompressKind::kTernGrad && p.dp > 127)
    errs.push_back(what + " sums ternary values as int8, which holds up to parallel.dp = 127; parallel.dp = " +
                   str(p.dp) + ": use powersgd or topk");
  if (compress_in_optimizer(p.compress)) check_onebit_adam(c, errs);
  if (stateful && c.train.precision == Precision::kFp16)
    errs.push_back(what + " with train.precision = fp16: its gradients carry a loss scale that changes between "
                          "steps, which the compressor's residual and scale cannot follow; use train.precision = "
                          "bf16 or fp32, or parallel.compress = bf16 | int8");
}

// ZeRO++ (Note [bf16 parameter gathers] in parallel/zero.h, Note [qgZ] in parallel/qgz.h):
// qwZ quantises ZeRO-3's parameter gathers, qgZ ZeRO-2/3's gradient reduce-scatters.
void check_zeropp(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  if (p.zeropp_qwz && (p.zero != 3 || p.dp < 2))
    errs.push_back("parallel.zeropp_qwz quantises ZeRO-3's parameter all-gathers, but parallel.zero = " +
                   str(p.zero) + " and parallel.dp = " + str(p.dp) +
                   ": set parallel.zero = 3 with parallel.dp >= 2, or leave parallel.zeropp_qwz = false");
  else if (p.zeropp_qwz && c.comm.param_dtype == FloatFormat::kBf16)
    errs.push_back("parallel.zeropp_qwz gathers int8 parameters, comm.param_dtype = bf16 gathers bf16 ones: set only one");
  if (p.zeropp_hpz && (p.zero != 3 || p.dp < 2))
    errs.push_back("parallel.zeropp_hpz keeps secondary pieces of ZeRO-3's parameters, but parallel.zero = " +
                   str(p.zero) + " and parallel.dp = " + str(p.dp) +
                   ": set parallel.zero = 3 with parallel.dp >= 2, or leave parallel.zeropp_hpz = false");
  if (p.zeropp_qgz && (p.zero < 2 || p.dp < 2))
    errs.push_back("parallel.zeropp_qgz quantises ZeRO-2/3's gradient reduce-scatters, but parallel.zero = " +
                   str(p.zero) + " and parallel.dp = " + str(p.dp) +
                   ": set parallel.zero = 2 or 3 with parallel.dp >= 2 (for zero 0/1 use parallel.compress = int8), "
                   "or leave parallel.zeropp_qgz = false");
}

// Note [bf16 parameter gathers] (parallel/zero.h).
void check_param_dtype(const Config& c, std::vector<std::string>& errs) {
  if (c.comm.param_dtype == FloatFormat::kBf16 && (c.parallel.zero != 3 || c.parallel.dp < 2))
    errs.push_back("comm.param_dtype = bf16 is the dtype of ZeRO-3's parameter all-gathers, but parallel.zero = " +
                   str(c.parallel.zero) + " and parallel.dp = " + str(c.parallel.dp) +
                   ": set parallel.zero = 3 with parallel.dp >= 2, or leave comm.param_dtype = fp32");
  // Note [bf16 pipeline transfers] (parallel/pipeline.h)
  if (c.comm.p2p_dtype == FloatFormat::kBf16 && c.parallel.pp < 2)
    errs.push_back("comm.p2p_dtype = bf16 is the dtype of pipeline transfers, but parallel.pp = " + str(c.parallel.pp) +
                   ": set parallel.pp >= 2 or leave comm.p2p_dtype = fp32");
}

void check_bucketing(const Config& c, std::vector<std::string>& errs) {
  const DataConfig& d = c.data;
  const int64_t T = c.seq_len();
  if (d.buckets < 0 || (d.bucketing && T > 0 && d.buckets > T))
    errs.push_back("data.buckets = " + str(d.buckets) + ": expected 1 .. the sequence length " + str(T) +
                   ", or 0 for one bucket per 8 tokens");
  if (d.bucket_pool < 1 || d.bucket_pool > 4096)
    errs.push_back("data.bucket_pool = " + str(d.bucket_pool) + ": expected 1 .. 4096");
  if (!d.bucketing) return;
  if (d.shards.empty())
    errs.push_back("data.bucketing = true needs data.shards: the text corpus has no document boundaries "
                   "(loom data prepare ends each document with the tokenizer's end token)");
  if (c.parallel.pp > 1 || c.parallel.sp)
    errs.push_back(std::string("data.bucketing = true runs on parallel.dp, parallel.tp and parallel.zero 0-3, not with ") +
                   (c.parallel.pp > 1 ? "parallel.pp = " + str(c.parallel.pp) : std::string("parallel.sp = true")) +
                   " (pipeline buffers and sequence-parallel row splits assume one fixed length); turn one off");
}

}  // namespace

// Note [Per-layer keys]
// parallel.recompute and parallel.zero_keep choose a policy per layer. Their text is a list
// of policy[*count] runs ("full*20,none*4"); one policy alone (with or without a count)
// applies to every layer. The config holds the values, one per layer or one for all, so
// the engine, the simulator and the planner never read text, and the planner writes its
// per-layer answer as values. Whether a list covers model.layers is checked at validation,
// where the layer count is final (a --set may change it after the key).

namespace {

constexpr int64_t kMaxLayers = int64_t(1) << 20;  // bounds a list before it is expanded

template <typename T>
using Names = std::vector<std::pair<const char*, T>>;

template <typename T>
std::string choices_of(const Names<T>& names) {
  std::string out;
  for (const auto& [n, v] : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

template <typename T>
ConfigError bad_runs(const std::string& key, const std::string& text, const std::string& why, const Names<T>& names) {
  return ConfigError(key + " = '" + text + "': " + why + "; expected one of " + choices_of(names) +
                     ", or one per layer as policy[*count] entries, e.g. \"" + names.back().first + "*3," +
                     names.front().first + "\"");
}

template <typename T>
std::vector<T> parse_runs(const std::string& key, const std::string& text, const Names<T>& names) {
  std::vector<T> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    int64_t count = 1;
    if (const size_t star = item.find('*'); star != std::string::npos) {
      const std::string n = item.substr(star + 1);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || n.size() > 9 || std::stoll(n) < 1)
        throw bad_runs(key, text, "'" + item + "' has no positive count after '*'", names);
      count = std::stoll(n);
      item = item.substr(0, star);
    }
    const auto it = std::find_if(names.begin(), names.end(), [&](const auto& nv) { return item == nv.first; });
    if (it == names.end()) throw bad_runs(key, text, "'" + item + "' is not a policy", names);
    if (int64_t(out.size()) + count > kMaxLayers)
      throw bad_runs(key, text, "lists more than " + str(kMaxLayers) + " layers", names);
    out.insert(out.end(), size_t(count), it->second);
  }
  return out;
}

template <typename T>
std::string runs_text(const std::vector<T>& v, const Names<T>& names) {
  auto name = [&](T x) {
    for (const auto& [n, value] : names)
      if (value == x) return std::string(n);
    return std::string("?");
  };
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j < v.size() && v[j] == v[i]) ++j;
    out += (out.empty() ? "" : ",") + name(v[i]) + (j - i > 1 ? "*" + std::to_string(j - i) : "");
    i = j;
  }
  return out;
}

// One value for every layer, or exactly one per layer.
template <typename T>
std::vector<T> for_layers(const std::string& key, const std::vector<T>& v, int64_t layers, const Names<T>& names) {
  if (v.size() == 1) return std::vector<T>(size_t(std::max<int64_t>(0, layers)), v[0]);
  if (int64_t(v.size()) == layers) return v;
  const std::string why = int64_t(v.size()) > layers ? "lists more than model.layers = " + str(layers) + " layers"
                                                     : "covers " + str(int64_t(v.size())) + " of model.layers = " +
                                                           str(layers) + " layers";
  throw bad_runs(key, runs_text(v, names), why, names);
}

const Names<Recompute>& recompute_names() {
  static const Names<Recompute> n = {{"none", Recompute::kNone}, {"selective", Recompute::kSelective},
                                     {"full", Recompute::kFull}};
  return n;
}

const Names<bool>& keep_names() {
  static const Names<bool> n = {{"shard", false}, {"keep", true}};
  return n;
}

}  // namespace

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::k1F1B: return "1f1b";
    case ScheduleKind::kInterleaved1F1B: return "interleaved";
    case ScheduleKind::kZbH1: return "zb-h1";
    case ScheduleKind::kZbH2: return "zb-h2";
    case ScheduleKind::kZbV: return "zb-v";
    case ScheduleKind::k2BW: return "2bw";
    case ScheduleKind::kPipeDream: return "pipedream";
    case ScheduleKind::kPipeMare: return "pipemare";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& text) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved1F1B,
                         ScheduleKind::kZbH1, ScheduleKind::kZbH2, ScheduleKind::kZbV, ScheduleKind::k2BW,
                         ScheduleKind::kPipeDream, ScheduleKind::kPipeMare})
    if (text == schedule_name(k)) return k;
  throw ConfigError("parallel.schedule = '" + text + "': expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, 2bw, "
                    "pipedream or pipemare");
}

const char* compress_name(CompressKind k) {
  switch (k) {
    case CompressKind::kNone: return "none";
    case CompressKind::kBf16: return "bf16";
    case CompressKind::kInt8: return "int8";
    case CompressKind::kTopK: return "topk";
    case CompressKind::kTernGrad: return "terngrad";
    case CompressKind::kPowerSgd: return "powersgd";
    case CompressKind::kOneBitAdam: return "onebit_adam";
    case CompressKind::kZeroOneAdam: return "zero_one_adam";
    case CompressKind::kTopKAdam: return "topk_adam";
  }
  return "?";
}

const char* grad_reduce_name(GradReduce r) { return r == GradReduce::kAdasum ? "adasum" : "mean"; }

GradReduce parse_grad_reduce(const std::string& text) {
  if (text == "mean") return GradReduce::kMean;
  if (text == "adasum") return GradReduce::kAdasum;
  throw ConfigError("parallel.reduce = '" + text + "': expected mean or adasum");
}

const char* compress_adapt_name(CompressAdapt a) { return a == CompressAdapt::kAccordion ? "accordion" : "none"; }

CompressAdapt parse_compress_adapt(const std::string& text) {
  if (text == "none") return CompressAdapt::kNone;
  if (text == "accordion") return CompressAdapt::kAccordion;
  throw ConfigError("parallel.compress_adapt = '" + text + "': expected none or accordion");
}

CompressKind parse_compress(const std::string& text) {
  for (CompressKind k : {CompressKind::kNone, CompressKind::kBf16, CompressKind::kInt8, CompressKind::kTopK,
                         CompressKind::kTernGrad, CompressKind::kPowerSgd, CompressKind::kOneBitAdam,
                         CompressKind::kZeroOneAdam, CompressKind::kTopKAdam})
    if (text == compress_name(k)) return k;
  throw ConfigError("parallel.compress = '" + text +
                    "': expected none, bf16, int8, topk, terngrad, powersgd, onebit_adam, zero_one_adam or topk_adam");
}

std::vector<Recompute> parse_recompute(const std::string& text) {
  std::vector<Recompute> v = parse_runs("parallel.recompute", text, recompute_names());
  if (v.empty()) throw bad_runs("parallel.recompute", text, "no policy given", recompute_names());
  return v;
}

std::string recompute_text(const std::vector<Recompute>& layers) { return runs_text(layers, recompute_names()); }

std::vector<bool> parse_zero_keep(const std::string& text) { return parse_runs("parallel.zero_keep", text, keep_names()); }

std::string zero_keep_text(const std::vector<bool>& layers) { return runs_text(layers, keep_names()); }

std::vector<int64_t> parse_pp_layers(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v < 0 || v > kMaxLayers) throw 0;
      out.push_back(v);
    } catch (...) {
      throw ConfigError("parallel.pp_layers = \"" + text + "\": '" + item +
                        "' is not a layer count; expected e.g. \"3,4\"");
    }
  }
  return out;
}

std::string pp_layers_text(const std::vector<int64_t>& split) {
  std::string out;
  for (int64_t v : split) out += (out.empty() ? "" : ",") + str(v);
  return out;
}

int64_t ParallelConfig::compress_warmup(int64_t train_steps, int64_t lr_warmup_steps) const {
  if (compress_warmup_steps >= 0) return compress_warmup_steps;
  const bool frozen = compress == CompressKind::kOneBitAdam || compress == CompressKind::kTopKAdam;
  return frozen ? onebit_default_warmup(train_steps, lr_warmup_steps) : 0;
}

std::string ParallelConfig::shape_text() const {
  std::string out = cp > 1 ? "dp x cp x tp x pp = " + std::to_string(dp) + " x " + std::to_string(cp) + " x " +
                                 std::to_string(tp) + " x " + std::to_string(pp)
                           : "dp x tp x pp = " + std::to_string(dp) + " x " + std::to_string(tp) + " x " + std::to_string(pp);
  if (ps_servers > 0) {
    out += " + " + std::to_string(servers()) + " servers";
    if (tp * pp > 1) out += " (" + std::to_string(ps_servers) + " per tp x pp shard)";
  }
  return out;
}

int64_t ParallelConfig::dp_for(int64_t ranks) const {
  const int64_t shards = tp * pp * cp;
  if (shards <= 0 || ranks % shards != 0) return 0;
  return std::max<int64_t>(ranks / shards - ps_servers, 0);
}

std::vector<Recompute> ParallelConfig::recompute_layers(int64_t layers) const {
  return for_layers("parallel.recompute", recompute, layers, recompute_names());
}

std::vector<bool> ParallelConfig::zero_keep_layers(int64_t layers) const {
  if (zero_keep.empty()) return std::vector<bool>(size_t(std::max<int64_t>(0, layers)), false);
  return for_layers("parallel.zero_keep", zero_keep, layers, keep_names());
}

void append_parallel_errors(const Config& c, std::vector<std::string>& errs) {
  check_degrees(c, errs);
  check_pipeline(c, errs);
  check_batch(c, errs);
  check_bucketing(c, errs);
  check_grad_dtype(c, errs);
  check_param_dtype(c, errs);
  check_zeropp(c, errs);
  check_compress(c, errs);
}

}  // namespace loom
