// Validation of every section but [parallel] (parallel_config.cc): each problem with its
// value and the fix.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "loom/core/config.h"
#include "loom/core/config_text.h"
#include "loom/core/error.h"

namespace loom {

namespace {

bool power_of_two(double x) {
  int e = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &e) == 0.5;
}

// Note [Dynamic loss scaling] (optim/loss_scale.h).
void append_loss_scale_errors(const TrainConfig& t, std::vector<std::string>& errs) {
  const std::string& ls = t.loss_scale;
  const std::string why = ": loss scales are powers of two, so scaling and unscaling change no bits";
  if (loss_scale_kind(ls) == LossScaleKind::kStatic) {
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
  if (c.checkpoint.memory_every < 0)
    errs.push_back("checkpoint.memory_every = " + std::to_string(c.checkpoint.memory_every) + ": expected >= 0 (0: off)");
  if (c.checkpoint.memory_every > 0 && c.checkpoint.dir.empty())
    errs.push_back("checkpoint.memory_every = " + std::to_string(c.checkpoint.memory_every) +
                   " needs checkpoint.dir (the disk checkpoints stay the fallback when both copies of a shard are lost)");
  if (c.checkpoint.memory_every > 0 && c.checkpoint.memory_dir.empty())
    errs.push_back("checkpoint.memory_every = " + std::to_string(c.checkpoint.memory_every) +
                   " needs checkpoint.memory_dir (a memory file system such as /dev/shm)");
  if (!(c.comm.timeout_s > 0 && c.comm.timeout_s < 1e9))
    errs.push_back("comm.timeout_s = " + fmt_double(c.comm.timeout_s) + ": expected seconds in (0, 1e9)");
  if (!(c.comm.rejoin_s >= 1 && c.comm.rejoin_s < 1e9))
    errs.push_back("comm.rejoin_s = " + fmt_double(c.comm.rejoin_s) + ": expected seconds >= 1 (default 60)");
  if (!(c.comm.hang_s == 0 || (c.comm.hang_s >= 2 && c.comm.hang_s < 1e9)))
    errs.push_back("comm.hang_s = " + fmt_double(c.comm.hang_s) +
                   ": expected 0 (no hang check) or seconds in [2, 1e9) (the heartbeat comes once a second)");
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
  append_loss_scale_errors(t, errs);
  if (t.gemm_format != GemmFormat::kBf16 && t.gemm_format != GemmFormat::kFp8)
    errs.push_back("train.gemm_format = " + std::string(name_of(t.gemm_format)) +
                   ": loom's engine runs bf16 or fp8 (delayed scaling) GEMMs; loom simulate --precision prices " +
                   name_of(t.gemm_format));
  else if (t.gemm_format == GemmFormat::kFp8 && t.device != Device::kCuda)
    errs.push_back("train.gemm_format = fp8 with train.device = " + std::string(name_of(t.device)) +
                   ": fp8 GEMMs run on the GPU's tensor cores (Note [CUDA fp8 linear layers]); use train.device = cuda, "
                   "or train.gemm_format = bf16");
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
  if (!(o.momentum >= 0 && o.momentum < 1)) errs.push_back("optim.momentum = " + fmt_double(o.momentum) + ": expected [0, 1)");
}

// Note [Memory budget], Note [Optimizer offload].
void check_memory(const Config& c, std::vector<std::string>& errs) {
  if (!(c.memory.limit_gib >= 0))
    errs.push_back("memory.limit_gib = " + fmt_double(c.memory.limit_gib) + ": expected >= 0 (0: no budget)");
  const OffloadConfig& o = c.offload;
  if (!(o.sub_group_mb > 0 && o.sub_group_mb <= 65536))
    errs.push_back("offload.sub_group_mb = " + fmt_double(o.sub_group_mb) + ": expected MiB in (0, 65536]");
  if (o.slots < 2 || o.slots > 64)
    errs.push_back("offload.slots = " + std::to_string(o.slots) + ": expected 2 to 64 (one sub-group updated while "
                   "the others are read ahead and written behind)");
  if (o.params == OffloadTier::kDisk && o.optimizer != OffloadTier::kDisk)
    errs.push_back("offload.params = disk needs offload.optimizer = disk (the parameters stream with the moments)");
  if (!(o.chunk_mb >= 0 && o.chunk_mb <= 65536))
    errs.push_back("offload.chunk_mb = " + fmt_double(o.chunk_mb) + ": expected MiB in [0, 65536] (0: one chunk per unit)");
  else if (o.chunk_mb > 0 && o.params != OffloadTier::kDisk)
    errs.push_back("offload.chunk_mb = " + fmt_double(o.chunk_mb) +
                   " sizes parameter offload's chunks: set offload.params = disk (with offload.optimizer = disk), or "
                   "leave chunk_mb at 0");
  if (o.grads == OffloadTier::kDisk && o.params != OffloadTier::kDisk)
    errs.push_back("offload.grads = disk needs offload.params = disk (gradient chunks share the parameters' chunk "
                   "manager and budget)");
  if (o.grads == OffloadTier::kDisk && !(o.chunk_mb >= 1 && o.chunk_mb == std::floor(o.chunk_mb)))
    errs.push_back("offload.grads = disk with offload.chunk_mb = " + fmt_double(o.chunk_mb) +
                   ": gradient chunks are a whole number of MiB (the gradient norm's 1 MiB pieces must not straddle "
                   "one); set offload.chunk_mb = 1 or more, whole");
  if (o.grads == OffloadTier::kDisk && c.parallel.world() != 1)
    errs.push_back("offload.grads = disk with dp x tp x pp = " + std::to_string(c.parallel.world()) +
                   ": gradient chunks run in one process (dp = tp = pp = 1); with more ranks offload the optimizer "
                   "and parameters only");
  if (o.optimizer == OffloadTier::kNone) return;
  if (o.dir.empty())
    errs.push_back("offload.optimizer = disk needs offload.dir: an existing writable directory on a local disk");
  if (compress_in_optimizer(c.parallel.compress))
    errs.push_back(std::string("offload.optimizer = disk with parallel.compress = ") + compress_name(c.parallel.compress) +
                   ": that optimizer mode reads and rewrites the moments outside AdamW's update; offload works "
                   "with compress = none, bf16, int8, topk, terngrad or powersgd");
  if (c.train.device != Device::kCpu)
    errs.push_back("offload.optimizer = disk with train.device = " + std::string(name_of(c.train.device)) + ": offload runs on the CPU engine");
}

// Note [Pipeline streams] (parallel/schedule.h): what 2bw, pipedream and pipemare compose with.
void check_streams(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  // (The flushing schedules are synchronous throughout, so any warm-up holds for them.)
  if (p.sync_warmup_steps < 0)
    errs.push_back("parallel.sync_warmup_steps = " + std::to_string(p.sync_warmup_steps) +
                   ": the synchronous steps before an asynchronous stream starts, steps >= 0");
  if (!streams(p.schedule)) return;
  const std::string name = schedule_name(p.schedule);
  const std::string is = "parallel.schedule = " + name + " ";
  const std::string grad_accum = std::to_string(c.train.grad_accum);
  if (p.schedule == ScheduleKind::k2BW && p.pp >= 2 && c.train.grad_accum < p.pp)
    errs.push_back(is + "keeps at most two weight versions only with at least as many micro-batches per step as "
                   "stages: train.grad_accum = " + grad_accum + " < parallel.pp = " +
                   std::to_string(p.pp) + "; set train.grad_accum >= " + std::to_string(p.pp) +
                   ", or use pipedream / pipemare with grad_accum = 1");
  if (updates_per_batch(p.schedule)) {
    if (c.train.grad_accum != 1)
      errs.push_back(is + "updates every stage after each minibatch (a step's batch, pp of them in flight): "
                     "train.grad_accum = " + grad_accum + "; set train.grad_accum = 1, or use 2bw to accumulate "
                     ">= pp micro-batches per update");
    if (c.optim.grad_clip > 0)
      errs.push_back(is + "with optim.grad_clip = " + fmt_double(c.optim.grad_clip) + ": each stage updates "
                     "as soon as its own gradient is done, so no global gradient norm exists to clip by; set "
                     "optim.grad_clip = 0, or use 2bw or a flushing schedule");
  }
  if (p.schedule == ScheduleKind::kPipeMare) {
    if (p.pipemare_decay < 0 || p.pipemare_decay >= 1)
      errs.push_back("parallel.pipemare_decay = " + fmt_double(p.pipemare_decay) + ": the velocity estimate's "
                     "decay is in [0, 1) (0: no discrepancy correction; 0.1 is the default)");
    if (p.pipemare_lr_steps < -1)
      errs.push_back("parallel.pipemare_lr_steps = " + std::to_string(p.pipemare_lr_steps) +
                     ": steps >= 0, or -1 for optim.warmup_steps");
  }
  // Note [Streams with data parallelism] (parallel/schedule.h): each update's gradient is
  // all-reduced exactly over the stage's replicas, whole.
  if (p.dp > 1 && p.zero > 0)
    errs.push_back(is + "with parallel.dp = " + std::to_string(p.dp) + " and parallel.zero = " + std::to_string(p.zero) +
                   ": " + name + " updates each stage replica's whole weights (and keeps a second version of them) "
                   "after an exact all-reduce, so nothing is sharded; set parallel.zero = 0, or use 1f1b, "
                   "interleaved or a zero-bubble schedule with ZeRO");
  if (p.dp > 1 && (p.compress != CompressKind::kNone || p.reduce == GradReduce::kAdasum ||
                   c.comm.grad_dtype != FloatFormat::kFp32))
    errs.push_back(is + "with parallel.dp = " + std::to_string(p.dp) + " all-reduces each update's gradient "
                   "exactly; parallel.compress = " + compress_name(p.compress) + ", parallel.reduce and "
                   "comm.grad_dtype must stay none, mean and fp32 (compressed gradients run with the flushing schedules)");
  if (c.train.precision == Precision::kFp16)
    errs.push_back(is + "with train.precision = fp16: a skipped update (loss scaling) would break the delayed "
                   "updates; use fp32 or bf16");
  if (c.offload.optimizer != OffloadTier::kNone)
    errs.push_back(is + "with offload.optimizer = " + std::string(name_of(c.offload.optimizer)) + ": " + name + " keeps its weight versions "
                   "and gradients in memory; offload runs with the flushing schedules");
  if (c.data.bucketing)
    errs.push_back(is + "with data.bucketing: the stream's micro-batches have one shape; set data.bucketing = false");
  if (c.train.device != Device::kCpu)
    errs.push_back(is + "with train.device = " + std::string(name_of(c.train.device)) + ": " + name + " runs on the CPU engine");
}

// Note [SGD with momentum] (optim/optimizer.h): the modes that are Adam's own refuse it.
void check_sgd(const Config& c, std::vector<std::string>& errs) {
  if (!c.optim.sgd()) return;
  if (compress_in_optimizer(c.parallel.compress))
    errs.push_back(std::string("optim.name = sgd with parallel.compress = ") + compress_name(c.parallel.compress) +
                   ": 1-bit, 0/1 and top-k Adam are Adam's update; use optim.name = adamw, or another compressor");
  if (c.train.device != Device::kCpu)
    errs.push_back("optim.name = sgd with train.device = " + std::string(name_of(c.train.device)) + ": the CUDA backend runs AdamW only");
}

// Note [bf16 optimizer moments] (kernels/ops_bf16.inc): AdamW's own update on moments in memory.
void check_moments(const Config& c, std::vector<std::string>& errs) {
  if (c.optim.moments == FloatFormat::kFp32) return;
  const std::string is = "optim.moments = bf16 with ";
  if (c.optim.sgd())
    errs.push_back(is + "optim.name = sgd: it stores AdamW's two moments; use optim.name = adamw, or optim.moments = fp32");
  if (compress_in_optimizer(c.parallel.compress))
    errs.push_back(is + "parallel.compress = " + compress_name(c.parallel.compress) + ": 1-bit, 0/1 and top-k Adam read "
                   "and rewrite the moments outside AdamW's update; bf16 moments work with compress = none, bf16, "
                   "int8, topk, terngrad or powersgd");
  if (c.offload.optimizer != OffloadTier::kNone)
    errs.push_back(is + "offload.optimizer = " + std::string(name_of(c.offload.optimizer)) + ": the offload file streams fp32 moments; keep "
                   "bf16 moments in memory (offload.optimizer = none) or offload fp32 ones (optim.moments = fp32)");
  if (c.parallel.ps_servers > 0)
    errs.push_back(is + "parallel.ps_servers = " + std::to_string(c.parallel.ps_servers) +
                   ": the parameter servers keep fp32 moments; use optim.moments = fp32");
  if (c.train.device != Device::kCpu)
    errs.push_back(is + "train.device = " + std::string(name_of(c.train.device)) + ": the CUDA backend keeps fp32 moments");
}

// Note [Parameter server] (modes/ps/ps.h): what a PS job composes with so far.
void check_ps(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  if (p.ps_servers < 0) errs.push_back("parallel.ps_servers = " + std::to_string(p.ps_servers) + ": expected >= 0");
  if (c.ps.staleness < 0) errs.push_back("ps.staleness = " + std::to_string(c.ps.staleness) + ": expected >= 0");
  if (c.ps.slow_worker < -1 || (p.ps_servers > 0 && c.ps.slow_worker >= p.dp))
    errs.push_back("ps.slow_worker = " + std::to_string(c.ps.slow_worker) + ": expected -1 (none) or a worker 0 .. " +
                   std::to_string(p.dp - 1));
  if (!(c.ps.slow_factor >= 1.0))
    errs.push_back("ps.slow_factor = " + std::to_string(c.ps.slow_factor) + ": expected >= 1");
  if (p.ps_servers <= 0) {
    if (c.ps.mode != PsMode::kSync || c.ps.sparse_embedding || c.ps.slow_worker >= 0)
      errs.push_back("ps.mode = " + std::string(name_of(c.ps.mode)) + ", ps.sparse_embedding, ps.slow_worker: parameter-server settings "
                     "need servers; set parallel.ps_servers > 0 or leave them at their defaults");
    return;
  }
  const std::string is = "parallel.ps_servers = " + std::to_string(p.ps_servers) + " ";
  if (p.pp > 1 && streams(p.schedule))
    errs.push_back(is + "with parallel.schedule = " + schedule_name(p.schedule) + ": " + schedule_name(p.schedule) +
                   " updates each stage inside the pipeline's stream, while the servers hold the update; use a "
                   "flushing schedule (1f1b, gpipe, interleaved, zb-h1, zb-h2, zb-v)");
  if (p.zero != 0 || p.compress != CompressKind::kNone || p.reduce != GradReduce::kMean)
    errs.push_back(is + "with parallel.zero / compress / reduce: the servers hold the optimizer state and average "
                   "exact gradients; set zero = 0, compress = none, reduce = mean");
  if (c.checkpoint.memory_every > 0 && c.ps.free_running())
    errs.push_back(is + "with ps.mode = " + std::string(name_of(c.ps.mode)) + " and checkpoint.memory_every = " +
                   std::to_string(c.checkpoint.memory_every) + ": free-running workers reach a step at different "
                   "times; set checkpoint.memory_every = 0 or ps.mode = sync");
  if (c.checkpoint.save_every > 0 && c.ps.free_running())
    errs.push_back(is + "with ps.mode = " + std::string(name_of(c.ps.mode)) + " and checkpoint.save_every = " +
                   std::to_string(c.checkpoint.save_every) + ": free-running workers reach a step at different "
                   "times, so only the end is saved; set checkpoint.save_every = 0 or ps.mode = sync");
  if (c.train.precision == Precision::kFp16)
    errs.push_back(is + "with train.precision = fp16: loss scaling's skipped steps are not built for servers; use "
                   "fp32 or bf16");
  if (c.offload.optimizer != OffloadTier::kNone || c.offload.params != OffloadTier::kNone ||
      c.offload.grads != OffloadTier::kNone)
    errs.push_back(is + "with offload: the servers keep their state in memory; set offload.* = none");
  if (c.data.bucketing) errs.push_back(is + "with data.bucketing: set data.bucketing = false");
  if (c.ps.sparse_embedding && c.model.arch != Arch::kLlama)
    errs.push_back("ps.sparse_embedding = true with model.arch = gpt: GPT's wte is also its output layer, whose "
                   "gradient touches every row; use model.arch = llama (an untied embedding) or sparse_embedding = false");
  if (c.ps.sparse_embedding && (p.tp > 1 || p.pp > 1))
    errs.push_back("ps.sparse_embedding = true with tp " + std::to_string(p.tp) + ", pp " + std::to_string(p.pp) +
                   ": the row-sparse table is built for a worker that holds the whole embedding; set "
                   "parallel.tp = parallel.pp = 1 or ps.sparse_embedding = false");
  if (c.ps.sparse_embedding && c.ps.free_running())
    errs.push_back("ps.sparse_embedding = true with ps.mode = " + std::string(name_of(c.ps.mode)) + ": sparse rows run under ps.mode = sync "
                   "only so far (a free-running worker cannot know its last step to pull the whole table)");
  if (c.ps.sparse_embedding && c.model.vocab >= (int64_t(1) << 24))
    errs.push_back("ps.sparse_embedding = true with model.vocab = " + std::to_string(c.model.vocab) +
                   ": row ids travel as floats, exact below 2^24 rows");
  if (c.train.device != Device::kCpu) errs.push_back(is + "with train.device = " + std::string(name_of(c.train.device)) + ": PS runs on the CPU engine");
}

// Note [Context-parallel chunks] (rank/cp_chunks.h): what context parallelism composes with
// so far; each refusal names what works.
void check_cp(const Config& c, std::vector<std::string>& errs) {
  const ParallelConfig& p = c.parallel;
  if (p.cp < 1) {
    errs.push_back("parallel.cp = " + std::to_string(p.cp) + ": expected >= 1");
    return;
  }
  if (p.cp == 1) return;
  const std::string is = "parallel.cp = " + std::to_string(p.cp) + " ";
  const int64_t pieces = cp_pieces(p.cp, p.cp_split);
  if (c.seq_len() % pieces != 0)
    errs.push_back(is + "with parallel.cp_split = " + name_of(p.cp_split) + ": the sequence of " +
                   std::to_string(c.seq_len()) + " tokens does not split into " + std::to_string(pieces) +
                   " equal chunks; use train.seq a multiple of " + std::to_string(pieces));
  // Note [Ulysses attention]: each cp rank takes heads / cp of the tp rank's heads and kv heads.
  const int64_t tp = std::max<int64_t>(1, p.tp), heads = c.model.heads / tp, kv = c.model.kv_heads / tp;
  if (p.cp_mode == CpMode::kUlysses && (heads % p.cp != 0 || kv % p.cp != 0))
    errs.push_back(is + "with parallel.cp_mode = ulysses: each tp rank's " + std::to_string(heads) + " heads and " +
                   std::to_string(kv) + " kv heads (model.heads " + std::to_string(c.model.heads) + ", kv_heads " +
                   std::to_string(c.model.kv_heads) + ", tp " + std::to_string(tp) + ") must split over " +
                   std::to_string(p.cp) + " ranks; use a cp that divides both, or parallel.cp_mode = allgather");
  auto refuse = [&](bool bad, const std::string& what, const std::string& fix) {
    if (bad) errs.push_back(is + "with " + what + ": not built for context parallelism yet; " + fix);
  };
  refuse(p.ps_servers > 0, "parallel.ps_servers", "set parallel.ps_servers = 0");
  // Adasum (Maleki et al.) combines independent gradients, averaging the parallel parts; the
  // ranks of a cp group hold parts of one gradient, which must be summed.
  if (p.reduce == GradReduce::kAdasum && p.cp > 1)
    errs.push_back(is + "with parallel.reduce = adasum: Adasum combines independent gradients, and a cp group's ranks "
                   "hold parts of one; use parallel.reduce = mean (the compressors run with cp)");
  refuse(c.train.device != Device::kCpu, "train.device = " + std::string(name_of(c.train.device)),
         "use train.device = cpu");
}

// Note [Vocabulary passes] (parallel/schedule.h).
void check_pp_vocab(const ParallelConfig& p, std::vector<std::string>& errs) {
  if (!p.pp_vocab) return;
  if (p.pp < 2)
    errs.push_back("parallel.pp_vocab splits the vocabulary over the pipeline's ranks and needs parallel.pp >= 2 (have " +
                   std::to_string(p.pp) + "); drop it without a pipeline");
  if (updates_per_batch(p.schedule))
    errs.push_back(std::string("parallel.pp_vocab runs in the flushing schedules (gpipe, 1f1b, interleaved, zb-h1, "
                               "zb-h2, zb-v) and 2bw, not with parallel.schedule = ") + schedule_name(p.schedule));
  if (p.pp_account_embedding || p.pp_account_loss)
    errs.push_back("parallel.pp_vocab spreads the embedding and the loss over every stage, so parallel."
                   "pp_account_embedding / pp_account_loss have nothing to account: drop them");
}

}  // namespace

std::vector<std::string> validation_errors(const Config& c) {
  std::vector<std::string> errs;
  if (!check_model(c.model, errs)) return errs;
  check_io(c, errs);
  if (!check_train(c.train, c.model, errs)) return errs;
  check_optim(c.optim, errs);
  check_memory(c, errs);
  check_streams(c, errs);
  check_ps(c, errs);
  check_cp(c, errs);
  check_sgd(c, errs);
  check_moments(c, errs);
  check_pp_vocab(c.parallel, errs);
  append_parallel_errors(c, errs);
  return errs;
}

void validate(const Config& c) {
  if (auto errs = validation_errors(c); !errs.empty()) throw_config_errors(errs);
}

}  // namespace loom
