#include "loom/cuda/train.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <iomanip>
#include <span>
#include <sstream>

#include "loom/ckpt/shard_ckpt.h"
#include "loom/ckpt/shard_format.h"
#include "loom/comm/agree.h"
#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/cuda/check.h"
#include "loom/cuda/model.h"
#include "loom/cuda/nccl.h"
#include "loom/cuda/ops.h"
#include "loom/model/model.h"
#include "loom/optim/loss_scale.h"
#include "loom/optim/optimizer.h"
#include "loom/data/loader.h"
#include "loom/train/report.h"
#include "loom/train/run_start.h"
#include "loom/train/step_observers.h"

namespace loom::cuda {

// The layout part of check_supported: data parallelism over NCCL only, one rank per GPU.
void check_layout(const ParallelConfig& p, int ranks, std::vector<std::string>& no) {
  if (p.tp != 1 || p.pp != 1 || p.sp || p.ps_servers > 0) {
    no.push_back("parallel dp x tp x pp = " + std::to_string(p.dp) + " x " + std::to_string(p.tp) + " x " +
                 std::to_string(p.pp) + (p.sp ? " with sp" : "") + (p.ps_servers > 0 ? " with parameter servers" : "") +
                 " (the GPU runs data parallelism only: tp = pp = 1, no sp, no servers)");
    return;
  }
  if (p.dp == 1) return;
  if (p.zero > 0)
    no.push_back("parallel.zero = " + std::to_string(p.zero) + " (GPU data parallelism keeps whole replicas: zero = 0)");
  if (p.compress != CompressKind::kNone || p.reduce != GradReduce::kMean || p.compress_adapt != CompressAdapt::kNone)
    no.push_back("gradient compression, adasum or accordion (the GPUs sum plain fp32 gradients with NCCL)");
  if (!nccl_available())
    no.push_back("parallel.dp = " + std::to_string(p.dp) + " (multi-GPU training needs NCCL: libnccl.so.2 on the "
                 "library path, and a loom built where nccl.h was found)");
  else if (p.dp != ranks)
    no.push_back("parallel.dp = " + std::to_string(p.dp) + " with " + std::to_string(ranks) + " process" +
                 (ranks == 1 ? "" : "es") + " (one process per GPU: add --nproc " + std::to_string(p.dp) +
                 ", or launch under mpirun -np " + std::to_string(p.dp) + ")");
}

// Note [CUDA fp8 linear layers]: Llama's blocks, one GPU, fp8 GEMM dimensions.
static void check_fp8(const Config& cfg, std::vector<std::string>& no) {
  const ModelConfig& m = cfg.model;
  if (m.arch == Arch::kGpt)
    no.push_back("train.gemm_format = fp8 with a GPT (its biases and GELU epilogue have no fp8 GEMM here: fp8 runs "
                 "Llama's blocks)");
  const int64_t hd = m.head_dim(), dims[] = {m.d_model, (m.heads + 2 * m.kv_heads) * hd, m.ffn, cfg.seq_len()};
  for (int64_t d : dims)
    if (d % 16 != 0) {
      no.push_back("train.gemm_format = fp8 with a dimension of " + std::to_string(d) +
                   " (d_model, the qkv width, ffn and train.seq must be multiples of 16 for fp8 GEMMs)");
      break;
    }
  if (cfg.parallel.dp > 1)
    no.push_back("train.gemm_format = fp8 with parallel.dp = " + std::to_string(cfg.parallel.dp) +
                 " (the GPUs' amaxes are not all-reduced yet: fp8 runs on one GPU)");
}

void check_supported(const Config& cfg, int ranks) {
  const ParallelConfig& p = cfg.parallel;
  std::vector<std::string> no;
  check_layout(p, ranks, no);
  if (cfg.offload.optimizer != OffloadTier::kNone || cfg.offload.params != OffloadTier::kNone ||
      cfg.offload.grads != OffloadTier::kNone)
    no.push_back("offload (the GPU keeps parameters, gradients and moments in device memory: offload.* = none)");
  if (cfg.train.precision != Precision::kBf16)
    no.push_back("train.precision = " + std::string(name_of(cfg.train.precision)) +
                 " (the GPU trains in bf16 with fp32 master weights: set train.precision = bf16 / --precision bf16)");
  for (Recompute r : p.recompute_layers(cfg.model.layers))
    if (r == Recompute::kSelective && !flash_supported(cfg.model.head_dim())) {
      no.push_back("parallel.recompute = selective with head size " + std::to_string(cfg.model.head_dim()) +
                   " (selective is what flash attention does, for head sizes 32, 64 and 128; use none or full)");
      break;
    }
  if (cfg.data.bucketing) no.push_back("data.bucketing (not on the GPU yet)");
  if (cfg.data.doc_mask) no.push_back("data.doc_mask (not on the GPU yet)");
  if (loss_scale_mode(cfg.train) != LossScaler::Mode::kNone)
    no.push_back("train.loss_scale = " + cfg.train.loss_scale + " (bf16 needs none: use auto or none)");
  if (cfg.train.gemm_format == GemmFormat::kFp8) check_fp8(cfg, no);
  if (cfg.model.arch == Arch::kLlama && cfg.model.head_dim() % 2 != 0)
    no.push_back("an odd Llama head size " + std::to_string(cfg.model.head_dim()) + " (RoPE rotates pairs)");
  if (no.empty()) return;
  std::string msg = "train.device = cuda does not run:";
  for (const std::string& n : no) msg += "\n  " + n;
  msg += "\nit runs GPT and Llama, train.precision = bf16 (Llama's blocks also in fp8: train.gemm_format = fp8), one "
         "GPU or data parallelism over NCCL (one process per GPU), recompute, gradient accumulation, validation and "
         "sharded checkpoints (resumable on the CPU and back)";
  throw ConfigError(msg);
}

namespace {

std::string device_line(const CudaModel& model, bool fp8) {
  int dev = 0;
  LOOM_CUDA_OK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  LOOM_CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  std::ostringstream os;
  os << "  device cuda:" << dev << " " << prop.name << " (" << prop.multiProcessorCount << " SMs, "
     << (prop.totalGlobalMem >> 20) << " MiB); model, optimizer and activations take "
     << (model.device_bytes() >> 20) << " MiB there; "
     << (fp8 ? "fp8 GEMMs in the blocks (Note [CUDA fp8 linear layers]), bf16 elsewhere" : "bf16 GEMMs")
     << ", fp32 master weights (Note [CUDA precision])";
  return os.str();
}

// Host copies of what a checkpoint holds: the flat parameters and moments, whole ranges.
struct HostState {
  std::vector<float> params, m, v;
  int64_t optimizer_steps = 0;
  ShardState view(const ParamLayout& layout) {
    const std::vector<FlatRange> all = {{0, layout.total_floats()}};
    ShardState s;
    s.layout = &layout, s.params = params, s.m = m, s.v = v, s.param_ranges = s.moment_ranges = all;
    s.optimizer_steps = optimizer_steps;
    return s;
  }
};

double evaluate(CudaModel& model, const DataLoader& val, int64_t batches, int64_t rows, int64_t T) {
  std::vector<int32_t> tok(size_t(rows * T)), tgt(size_t(rows * T));
  double sum = 0;
  for (int64_t i = 0; i < batches; i++) {
    val.val_batch(i, batches, rows, tok.data(), tgt.data());
    sum += model.forward_loss(tok.data(), tgt.data(), rows, T);
  }
  return sum / double(batches);
}

// Fresh weights come from the CPU model's init (the same values a CPU run starts from);
// --resume loads a checkpoint of any layout. Returns the step to continue from.
int64_t start_state(const Config& cfg, const TrainOptions& opt, CudaModel& model, HostState& h, Reporter& rep,
                    comm::Group* everyone) {
  const ParamLayout& layout = model.layout();
  {  // the CPU engine's init (engine.cc), on a model sized for one token of activations
    Model cpu(cfg.model, 1, 1);
    cpu.init_weights(uint64_t(cfg.train.seed));
    h.params = cpu.params();
  }
  h.m.assign(size_t(layout.total_floats()), 0.0f);
  h.v.assign(size_t(layout.total_floats()), 0.0f);
  ShardState s = h.view(layout);
  const int64_t step = load_resume(cfg, opt.resume, s, everyone, rep);
  h.optimizer_steps = s.optimizer_steps;
  model.upload_params(h.params);
  model.upload_moments(h.m, h.v);
  return opt.resume.empty() ? 0 : step;
}

void save(const Config& cfg, int64_t done, CudaModel& model, HostState& h) {
  h.params = model.download_params();
  model.download_moments(h.m, h.v);
  for (float x : h.params)
    if (!std::isfinite(x))
      throw Error("training diverged: parameters hold NaN or infinity after step " + std::to_string(done) +
                  "; nothing was saved over the earlier checkpoints (lower optim.lr or raise optim.warmup_steps)");
  save_shards(cfg, done, h.view(model.layout()), nullptr, 0);
}

// Before anything is read or allocated: a machine without a usable GPU gets one clear line.
void check_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return;
  throw Error(std::string("train.device = cuda: no CUDA device is usable here (") +
              (e != cudaSuccess ? cudaGetErrorString(e) : "no devices") + "); train on the CPU with train.device = cpu");
}

// The ranks of a data-parallel run (Note [GPU data parallelism] in cuda/nccl.h); one
// process without a world.
struct Ranks {
  comm::World* world = nullptr;
  std::unique_ptr<Nccl> nccl;
  int rank = 0, size = 1;
  comm::Group* everyone() const { return world ? &world->world_group() : nullptr; }
  double mean(double x) const {  // over the ranks (host, MPI)
    if (world) world->world_group().all_reduce(std::span<double>(&x, 1), comm::ReduceOp::kAvg).wait();
    return x;
  }
};

// Before anything is allocated: the GPU this rank drives.
Ranks pick_device(const Config& cfg, comm::World* world) {
  check_device();
  Ranks r;
  if (!world) return r;
  r.world = world, r.rank = world->global_rank(), r.size = world->world_size();
  int count = 0;
  LOOM_CUDA_OK(cudaGetDeviceCount(&count));
  LOOM_CUDA_OK(cudaSetDevice(gpu_for_rank(world->hosts(), r.rank, count)));
  r.nccl = std::make_unique<Nccl>(world->world_group(), cfg.comm.timeout_s);
  return r;
}

// Rank 0 writes the (replicated) state; every rank learns the outcome.
void save_on_rank0(const Config& cfg, int64_t done, CudaModel& model, HostState& h, const Ranks& r) {
  std::exception_ptr bad;
  if (r.rank == 0) {
    try {
      save(cfg, done, model, h);
    } catch (...) {
      bad = std::current_exception();
    }
  }
  agree_or_throw(r.everyone(), r.rank, bad);  // (one process: rethrows its own)
}

std::string run_header(const Config& cfg, const TrainSummary& sum, const CudaModel& model, const TrainData& data,
                       int ranks) {
  std::ostringstream head;
  head << "loom train: " << (cfg.model.arch == Arch::kGpt ? "gpt" : "llama") << " '" << cfg.model.preset << "' "
       << sum.params << " params on " << (ranks > 1 ? std::to_string(ranks) + " GPUs (data parallel, NCCL)" : "the GPU")
       << "; global batch " << cfg.train.batch << " = micro-batch " << cfg.micro_batch() << " x "
       << cfg.train.grad_accum << (ranks > 1 ? " x dp " + std::to_string(ranks) : "") << ", seq " << cfg.seq_len()
       << ", " << cfg.train.steps << " steps\n"
       << device_line(model, cfg.train.gemm_format == GemmFormat::kFp8) << "\n  " << data.describe;
  return head.str();
}

}  // namespace

TrainSummary train(const Config& cfg, const TrainOptions& given, comm::World* world) {
  check_supported(cfg, world ? world->world_size() : 1);
  LOOM_CONFIG_CHECK(given.trace_path.empty(), "--trace is not recorded on the GPU yet; drop it or train on the CPU");
  Ranks r = pick_device(cfg, world);
  NullBuffer null_buf;
  std::ostream null_out(&null_buf);
  TrainOptions opt = given;
  if (r.rank != 0) opt.out = opt.err = &null_out, opt.progress = false;
  Reporter rep(opt, cfg.train.steps);
  const int64_t T = cfg.seq_len(), mb = cfg.micro_batch(), accum = cfg.train.grad_accum;
  const std::unique_ptr<TrainData> data = load_train_data(cfg, T);
  const DataLoader train_data(*data->train, T, uint64_t(cfg.train.seed), r.rank, r.size, data->order);
  const DataLoader val_data(*data->val, T, uint64_t(cfg.train.seed), r.rank, r.size, data->order);
  const std::unique_ptr<DirLock> lock = claim_outputs(cfg, given, r.everyone(), rep);
  CudaModel model(cfg.model, mb, T, true, cfg.parallel.recompute_layers(cfg.model.layers),
                  cfg.train.gemm_format == GemmFormat::kFp8);
  HostState h;
  const int64_t first = start_state(cfg, opt, model, h, rep, r.everyone());
  if (r.nccl) model.broadcast_params(*r.nccl);

  TrainSummary sum;
  sum.params = model.layout().param_count();
  sum.unigram_entropy = data->unigram_entropy_nats;
  rep.info(run_header(cfg, sum, model, *data, r.size));
  const auto t0 = Clock::now();
  StepLog log(rep, sum, cfg, t0);
  std::vector<int32_t> tok(size_t(mb * T)), tgt(size_t(mb * T));
  auto fetch = [&](int64_t step, int64_t micro) {
    train_data.train_batch(step, micro, accum, cfg.train.batch, tok.data(), tgt.data());
  };
  if (first < cfg.train.steps) fetch(first, 0);
  for (int64_t step = first; step < cfg.train.steps; step++) {
    const auto start = Clock::now();
    model.zero_grads();
    for (int64_t micro = 0; micro < accum; micro++) {
      if (micro > 0) fetch(step, micro);
      model.forward_backward(tok.data(), tgt.data(), mb, T, float(1.0 / double(accum * r.size)));
    }
    if (r.nccl) model.all_reduce_grads(*r.nccl);
    const double lr = lr_at(cfg.optim, step, cfg.train.steps);
    model.clip_and_step(cfg.optim, lr, ++h.optimizer_steps);  // no wait for the norm
    if (step + 1 < cfg.train.steps) fetch(step + 1, 0);        // while the GPU works on this step
    if (r.nccl) model.wait(*r.nccl, "step " + std::to_string(step + 1));
    StepOutcome o;
    o.step = step, o.loss = r.mean(model.take_loss()), o.lr = lr, o.norm = model.last_grad_norm();
    o.real_tokens = o.positions = cfg.train.batch * T;
    o.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    o.last = step + 1 == cfg.train.steps;
    if (!std::isfinite(o.loss))
      throw Error("training diverged: loss is " + std::to_string(o.loss) + " at step " + std::to_string(step + 1) +
                  " (optim.lr = " + std::to_string(cfg.optim.lr) + "); lower optim.lr or raise optim.warmup_steps");
    log.after_step(o);
    const int64_t every = cfg.checkpoint.save_every, done = step + 1;
    if (!cfg.checkpoint.dir.empty() && ((every > 0 && done % every == 0) || o.last))
      save_on_rank0(cfg, done, model, h, r);
    if (o.last || (cfg.train.val_every > 0 && done % cfg.train.val_every == 0)) {
      sum.final_val_loss = r.mean(evaluate(model, val_data, cfg.train.val_batches, mb, T));
      rep.val(step, sum.final_val_loss, data->val_bytes_per_token);
    }
  }
  rep.end_bar();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  sum.tokens_per_s = double((cfg.train.steps - first) * cfg.train.batch * T) / seconds;
  if (opt.keep_params) {
    const std::vector<float> all = model.download_params();
    for (const ParamSpec& s : model.layout().specs())
      sum.final_params.insert(sum.final_params.end(), all.begin() + s.offset, all.begin() + s.offset + s.numel);
  }
  if (!cfg.checkpoint.dir.empty() && first < cfg.train.steps)
    rep.info("saved checkpoint " + cfg.checkpoint.dir + "/" + shard::step_name(cfg.train.steps) + " (latest)");
  return sum;
}

}  // namespace loom::cuda
