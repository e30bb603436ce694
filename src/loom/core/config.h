// The typed config tree: one struct per TOML section, validated once.
//
// Resolution order for every key: built-in default < model preset (model.* only)
// < TOML file < --set overrides. Unknown sections/keys and malformed values are errors;
// validate() lists every violation at once, each with the value and the expected form.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/config_enums.h"

namespace loom {

enum class Arch { kGpt, kLlama };

struct ModelConfig {
  std::string preset = "tiny";
  Arch arch = Arch::kGpt;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, ctx = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;  // Llama only
  double init_std = 0.02;
  // Note [Model given by shape]: keys derived or defaulted when no preset was named but
  // shape keys were, e.g. "model.ffn = 256 (4 x d_model, GPT)"; printed by train and simulate.
  std::vector<std::string> notes;
  int64_t head_dim() const { return heads > 0 ? d_model / heads : 0; }
};

struct DataConfig {
  std::string path;            // empty: the fortunes corpus from Debian's `fortunes` package
  std::string shards;          // token shards from `loom data prepare` (or llm.c's), or "0.7:web,0.3:code"
                               // (Note [Dataset mixtures]); replaces path
  std::string tokenizer;       // what made the shards (checked against them; `loom sample` decodes with it)
  bool doc_mask = false;       // document-causal attention inside packed windows (needs shards with an end token)
  bool bucketing = false;      // one document per row, padded to its length bucket (Note [Length bucketing])
  int64_t buckets = 0;         // padded lengths ceil(i seq / buckets), i = 1..buckets; 0: ceil(seq / 8) (multiples of 8)
  int64_t bucket_pool = 16;    // global batches per length-sorted megabatch (1: no length grouping)
  double val_fraction = 0.1;   // every round(1/val_fraction)-th 4 KiB block goes to validation
};

struct TrainConfig {
  int64_t steps = 400;
  int64_t batch = 16;          // global batch: sequences per optimizer step
  int64_t grad_accum = 1;      // micro-batches per step; micro-batch = batch / grad_accum
  int64_t seq = 0;             // tokens per sequence; 0 means model.ctx
  int64_t seed = 1337;
  int64_t val_every = 100;     // 0 disables periodic validation (a final one still runs)
  int64_t val_batches = 8;
  int64_t log_every = 10;
  std::string tensorboard;     // non-empty: TensorBoard event files in this directory (Note [TensorBoard events])
  int64_t threads = 0;         // 0: OpenMP default
  Device device = Device::kCpu;            // cpu | cuda (a -DLOOM_CUDA=ON build, one GPU; Note [CUDA precision] in cuda/ops.h)
  Precision precision = Precision::kFp32;  // fp32 | bf16 | fp16 (GEMM inputs rounded, fp32 accumulation; Note [bf16 rounding points])
  GemmFormat gemm_format = GemmFormat::kBf16;  // the blocks' linear layers: bf16, or fp8 on the GPU (Note [CUDA fp8 linear layers])
  // Note [Dynamic loss scaling]: auto (dynamic for fp16, else none) | dynamic | none | a
  // static power of two. Scales are powers of two; growth x2 and backoff x1/2 are fixed.
  std::string loss_scale = "auto";
  double loss_scale_init = 65536;    // dynamic: the first scale (2^16, GradScaler's)
  int64_t loss_scale_window = 2000;  // dynamic: applied steps in a row before the scale doubles
  double loss_scale_min = 1;         // dynamic: an overflow at this scale stops the run
};

struct OptimConfig {
  double lr = 1e-3;
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 40;
  double weight_decay = 0.1;   // decoupled; applied to matrices only (not norms/biases)
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;      // global L2 norm; 0 disables
  // adamw | sgd (Note [SGD with momentum] in optim/optimizer.h: torch.optim.SGD's rule with
  // `momentum`, coupled L2 weight decay on the decayed tensors; beta1/beta2/eps unused).
  OptimizerKind name = OptimizerKind::kAdamW;
  double momentum = 0.9;
  // fp32 | bf16: AdamW's m and v stored in bf16, stochastically rounded (Note [bf16 optimizer
  // moments] in kernels/ops_bf16.inc); an approximate mode beside the exact fp32 one.
  FloatFormat moments = FloatFormat::kFp32;
  bool sgd() const { return name == OptimizerKind::kSgd; }
  bool bf16_moments() const { return moments == FloatFormat::kBf16; }
  // Bytes of each stored moment of a parameter.
  int64_t moment_bytes() const { return bf16_moments() ? 2 : 4; }
  // Bytes a parameter's update reads and writes (AdamW: w, g, m, v in, w, m, v out; SGD:
  // w, g, m in, w, m out), for the simulator's optimizer and server times.
  double update_bytes() const { return sgd() ? 20.0 : 32.0 - (bf16_moments() ? 8.0 : 0.0); }
};

struct CheckpointConfig {
  std::string dir = "runs/default";  // empty: do not save
  int64_t save_every = 0;      // > 0: a sharded, resumable checkpoint every N steps (Note [Sharded checkpoints])
  int64_t keep_last = 3;       // sharded checkpoints kept (newest first); 0 keeps all
  int64_t memory_every = 0;    // > 0: an in-memory checkpoint every N steps, copied to a peer host (Note [In-memory checkpoints])
  std::string memory_dir = "/dev/shm";  // the memory file system the hosts' stores live in
};

struct CommConfig {
  double timeout_s = 300;      // bound on every collective; survivors of a dead rank exit within it
  double hang_s = 25;          // --nproc: a rank idle outside any collective this long ends the job (0: off)
  double rejoin_s = 60;        // --elastic: a lost host is tried again after this long (Note [Elastic growth])
  bool check_desync = false;   // debug: group members compare every collective's descriptor first
  FloatFormat grad_dtype = FloatFormat::kFp32;   // bf16: the dp gradient all-reduce sends bf16 (Note [Compressed all-reduce])
  FloatFormat param_dtype = FloatFormat::kFp32;  // bf16: ZeRO-3 gathers bf16 parameter copies (Note [bf16 parameter gathers])
  FloatFormat p2p_dtype = FloatFormat::kFp32;    // bf16: pipeline boundary transfers in bf16 (Note [bf16 pipeline transfers])
};

// Activation recompute for one layer: none; selective = the attention core (softmax
// probabilities, the (B,H,T,T) tensor, are recomputed in backward instead of kept);
// full = only the block input is kept and the whole block runs again in backward. The one
// enum the engine, the simulator and the planner share; the values index per-policy tables.
enum class Recompute { kNone = 0, kSelective = 1, kFull = 2 };

// The pipeline schedules (Note [Schedules as data] in parallel/schedule.h). The zero-bubble
// ones split each backward into its input-gradient (B) and weight-gradient (W) steps
// (Note [B/W split] in model/model.h).
enum class ScheduleKind { kGPipe, k1F1B, kInterleaved1F1B, kZbH1, kZbH2, kZbV, k2BW, kPipeDream, kPipeMare };
inline bool splits_backward(ScheduleKind k) {
  return k == ScheduleKind::kZbH1 || k == ScheduleKind::kZbH2 || k == ScheduleKind::kZbV;
}
// 2bw, pipedream, pipemare: one 1F1B stream across steps, no flush between them (Note
// [Pipeline streams] in parallel/schedule.h); the weights a micro-batch computes on are older
// than the ones it updates, which changes the optimisation.
inline bool streams(ScheduleKind k) {
  return k == ScheduleKind::k2BW || k == ScheduleKind::kPipeDream || k == ScheduleKind::kPipeMare;
}
// pipedream, pipemare: each stage updates after every minibatch's backward on it (Note
// [PipeDream weight stashing], Note [PipeMare] in modes/stream/async_pipe.h).
inline bool updates_per_batch(ScheduleKind k) { return k == ScheduleKind::kPipeDream || k == ScheduleKind::kPipeMare; }
// Parameter-sized fp32 buffers a stream's pipeline rank holds in the "params" and "grads"
// categories: 2bw two of each (a stash, a pending gradient), but no stash on the last stage,
// which runs no trailing backward (its lag is 0 under every lag rule: Note [Early stash]);
// pipedream one weight version per minibatch in flight (pp - rank); pipemare W, the velocity
// and the corrected weights where the stage's delay pp - 1 - rank is > 0; one each otherwise.
inline int stream_param_copies(ScheduleKind k, int pp, int pp_rank) {
  if (pp <= 1) return 1;
  if (k == ScheduleKind::k2BW) return pp_rank < pp - 1 ? 2 : 1;
  if (k == ScheduleKind::kPipeDream) return pp - pp_rank;
  if (k == ScheduleKind::kPipeMare) return pp - 1 - pp_rank > 0 ? 3 : 1;
  return 1;
}
inline int stream_grad_copies(ScheduleKind k, int pp) { return pp > 1 && k == ScheduleKind::k2BW ? 2 : 1; }

// How data-parallel gradients cross the dp group (Note [Gradient compressors] in
// parallel/compress.h): exact, a codec of the ring, a stateful compressor, or 1-bit / 0/1
// Adam (optimizer modes; Note [1-bit Adam], Note [0/1 Adam]; topk_adam is 1-bit Adam's frame
// with top-k in place of the signs, Note [Top-k Adam]).
enum class CompressKind { kNone, kBf16, kInt8, kTopK, kTernGrad, kPowerSgd, kOneBitAdam, kZeroOneAdam, kTopKAdam };
// topk, terngrad, powersgd, onebit_adam, zero_one_adam, topk_adam: compressors with state
// that run after backward (bf16 and int8 are codecs of the ring).
inline bool compress_has_state(CompressKind k) {
  return k == CompressKind::kTopK || k == CompressKind::kTernGrad || k == CompressKind::kPowerSgd ||
         k == CompressKind::kOneBitAdam || k == CompressKind::kZeroOneAdam || k == CompressKind::kTopKAdam;
}
// onebit_adam, zero_one_adam, topk_adam: the optimizer decides what crosses the dp group
// (momentum, parameter moves) on the steps whose gradients it keeps local.
inline bool compress_in_optimizer(CompressKind k) {
  return k == CompressKind::kOneBitAdam || k == CompressKind::kZeroOneAdam || k == CompressKind::kTopKAdam;
}
// 1-bit Adam's default warm-up: 15% of the run (rounded up, >= 1), the low end of the 15-25%
// DeepSpeed's 1-bit Adam tutorial suggests, and not before the learning-rate warm-up ends
// (v moves most while the learning rate ramps; DeepSpeed's 0/1 Adam freezes it there).
inline int64_t onebit_default_warmup(int64_t train_steps, int64_t lr_warmup_steps) {
  const int64_t share = train_steps * 15 / 100 + (train_steps * 15 % 100 != 0);
  return std::max<int64_t>({share, lr_warmup_steps, 1});
}
// How the dp ranks' gradients combine: their mean, or Adasum (Note [Adasum] in
// parallel/compress.h).
enum class GradReduce { kMean, kAdasum };
// Adaptive compression (Note [Accordion] in parallel/accordion.h).
enum class CompressAdapt { kNone, kAccordion };

// The text forms of the typed layout keys, as TOML files, --set, plan files and reports
// write them. The parse functions throw ConfigError naming the key, the text and the fix.
const char* schedule_name(ScheduleKind k);  // "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-h2" | "zb-v" | "2bw" | "pipedream" | "pipemare"
ScheduleKind parse_schedule(const std::string& text);
// "full*20,none*4" <-> {kFull x20, kNone x4}; a single policy stays one value (every layer).
std::vector<Recompute> parse_recompute(const std::string& text);
std::string recompute_text(const std::vector<Recompute>& layers);
// "keep*4,shard*20" <-> {true x4, false x20}; "" <-> {} (shard every layer).
std::vector<bool> parse_zero_keep(const std::string& text);
std::string zero_keep_text(const std::vector<bool>& layers);
// "3,4" <-> {3, 4}; "" <-> {}.
std::vector<int64_t> parse_pp_layers(const std::string& text);
// `layers` over `stages` as evenly as possible, the remainder to the middle stages (the ends
// also embed and run the head).
std::vector<int> even_stage_split(int layers, int stages);
// The pipeline rank that runs virtual stage v (0 <= v < pp x vpp): zb-v's V (chunk 0 down the
// ranks, chunk 1 back up), else Megatron's interleaving, v mod pp.
inline int stage_rank(ScheduleKind kind, int pp, int v) {
  if (kind == ScheduleKind::kZbV) return v < pp ? v : 2 * pp - 1 - v;
  return v % pp;
}
// As even_stage_split, but no rank takes a second block of the remainder before every rank has
// one (Note [Stage split]: with parallel.pp_vocab the ends carry no embedding or head).
// later_first: of two stages as near the middle, the later first (what loom plan also tries).
std::vector<int> rank_balanced_stage_split(int layers, int pp, int vpp, ScheduleKind kind, bool later_first = false);
std::string pp_layers_text(const std::vector<int64_t>& split);
// "none" | "bf16" | "int8" | "topk" | "terngrad" | "powersgd" | "onebit_adam" | "zero_one_adam"
const char* compress_name(CompressKind k);
CompressKind parse_compress(const std::string& text);
const char* grad_reduce_name(GradReduce r);  // "mean" | "adasum"
GradReduce parse_grad_reduce(const std::string& text);
const char* compress_adapt_name(CompressAdapt a);  // "none" | "accordion"
CompressAdapt parse_compress_adapt(const std::string& text);

// How one run is split over ranks (Note [Global batch]). Mesh axes, outermost first:
// pp, dp, tp (tp ranks are adjacent global ranks, as in Megatron).
struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t vpp = 1;             // model chunks per pipeline rank (interleaved schedule)
  bool sp = false;             // sequence parallel (needs tp > 1)
  // Context parallelism (Note [Context-parallel chunks] in rank/cp_chunks.h): each sequence
  // split over cp ranks of one dp replica; parameters replicated over cp, gradients reduced
  // over dp x cp (the mesh's dp axis holds dp x cp ranks, cp innermost).
  int64_t cp = 1;
  CpMode cp_mode = CpMode::kAllGather;
  CpSplit cp_split = CpSplit::kZigZag;
  bool vocab_parallel = true;  // under tp: embedding/head split by vocabulary, else replicated
  int64_t zero = 0;            // 0: plain data parallel; 1: optimizer state, 2: + gradients, 3: + params sharded
  int64_t micro_batch = 0;     // sequences per micro-batch per dp rank; 0: batch / (grad_accum * dp)
  // Layout choices, typed; the schema converts them to and from their TOML text once
  // (Note [Per-layer keys] in parallel_config.cc).
  ScheduleKind schedule = ScheduleKind::k1F1B;       // gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v | 2bw | pipedream | pipemare
  std::vector<Recompute> recompute{Recompute::kNone};  // one for every layer, or one per layer
  std::vector<int64_t> pp_layers;  // layers per pipeline stage, e.g. {3, 4}; empty: as even as possible
  // Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-
  // split: the default split counts the embedding (the loss) as one more layer of the first
  // (last) stage (Note [Stage split] in stage_split.cc).
  bool pp_account_embedding = false;
  bool pp_account_loss = false;
  // The head, the loss and the embedding split by vocabulary rows over the pp ranks (Note
  // [Vocabulary passes] in parallel/schedule.h); the default split balances each rank's blocks
  // (Note [Stage split] in stage_split.cc).
  bool pp_vocab = false;
  std::vector<bool> zero_keep;     // ZeRO-3, true = kept gathered; one for all, one per layer, or empty: shard all
  double bucket_mb = 25;       // data-parallel gradient bucket cap in MiB (the first bucket is 1 MiB)
  // Gradient compression (Note [Gradient compressors]); defaults are the papers'.
  CompressKind compress = CompressKind::kNone;
  double compress_ratio = 0.001;     // topk: fraction sent per bucket (DGC: 99.9% sparsity)
  double compress_momentum = 0.0;    // topk: DGC momentum correction (0: plain error feedback)
  int64_t compress_rank = 4;         // powersgd: rank (Vogels et al.'s language-model setting)
  // Steps reduced exactly before compression starts; -1: the compressor's default (0, and
  // for onebit_adam onebit_default_warmup).
  int64_t compress_warmup_steps = -1;
  int64_t compress_warmup(int64_t train_steps, int64_t lr_warmup_steps) const;
  GradReduce reduce = GradReduce::kMean;  // adasum: Maleki et al.'s adaptive summation
  // 0/1 Adam (Note [0/1 Adam] in parallel/compress.h), DeepSpeed's defaults: the last step
  // whose variance may update (-1: optim.warmup_steps), the variance updates per interval
  // before it doubles (kappa), the steps per local-step interval before it doubles, and the
  // longest interval (H).
  int64_t zero_one_var_freeze_steps = -1;
  int64_t zero_one_var_scaler = 16;
  int64_t zero_one_local_scaler = 32678;
  int64_t zero_one_local_clip = 16;
  // ZeRO++ (Wang et al. 2023): qwZ, ZeRO-3's parameter all-gathers in int8 blocks (Note [bf16
  // parameter gathers] in parallel/zero.h).
  bool zeropp_qwz = false;
  // qgZ: ZeRO-2/3's gradient reduce-scatters as an all-to-all of int8 blocks (Note [qgZ] in
  // parallel/qgz.h).
  bool zeropp_qgz = false;
  // hpZ: a secondary parameter piece per host so ZeRO-3's backward gathers stay on the host
  // (Note [hpZ] in parallel/zero.h).
  bool zeropp_hpz = false;
  // Accordion (Note [Accordion] in parallel/accordion.h): compress_rank / compress_ratio are
  // the light setting, these the heavy one; a window of optimizer steps is its "epoch".
  CompressAdapt compress_adapt = CompressAdapt::kNone;
  int64_t accordion_window = 100;
  double accordion_eta = 0.5;          // Agarwal et al.'s threshold on the norm's relative change
  int64_t accordion_heavy_rank = 1;    // powersgd
  double accordion_heavy_ratio = 0;    // topk; 0: compress_ratio / 10 (heavy_ratio())
  double heavy_ratio() const { return accordion_heavy_ratio > 0 ? accordion_heavy_ratio : compress_ratio / 10; }
  // PipeMare (Note [PipeMare] in modes/stream/async_pipe.h): the steps over which the learning-rate
  // rescheduling anneals away (T1; -1: optim.warmup_steps, at least 1), and D, the decay of
  // the weight-velocity estimate per step of delay (T2; 0 turns the correction off).
  int64_t pipemare_lr_steps = -1;
  double pipemare_decay = 0.1;
  // 2bw, pipedream, pipemare: the first steps flush the pipeline after every step, so each
  // minibatch computes on the weights it updates (synchronous training) before the stream
  // starts (Note [Synchronous warm-up] in parallel/schedule.h). 0: asynchronous from step 1.
  // The flushing schedules are synchronous throughout: for them any value holds as it is.
  int64_t sync_warmup_steps = 0;
  int64_t pipemare_anneal(int64_t lr_warmup_steps) const {
    return pipemare_lr_steps >= 0 ? std::max<int64_t>(pipemare_lr_steps, 1) : std::max<int64_t>(lr_warmup_steps, 1);
  }
  // Note [Parameter server] (modes/ps/ps.h): > 0 adds that many server ranks per model shard
  // (tp x pp shards) to the dp workers.
  int64_t ps_servers = 0;
  int64_t world() const { return dp * cp * tp * pp; }  // the training mesh (a PS job's workers)
  // The data-parallel gradient group: the dp replicas' cp ranks (ZeRO shards over it).
  int64_t dp_ranks() const { return dp * cp; }
  int64_t servers() const { return ps_servers * tp * pp; }  // a PS job's server ranks
  int64_t ranks() const { return world() + servers(); }  // every rank the job launches
  // "dp x tp x pp = 2 x 2 x 1 + 2 servers (1 per tp x pp shard)", for launch errors.
  std::string shape_text() const;
  // The parallel.dp that fills `ranks` ranks with this tp, pp and ps_servers; 0 when none does.
  int64_t dp_for(int64_t ranks) const;
  // Blocks per virtual stage (pp x vpp of them) of a `layers`-layer model: pp_layers, else the
  // accounted split, else as even as possible (Note [Stage split] in stage_split.cc).
  std::vector<int> layer_split(int64_t layers) const;
  // The recompute policy of each of `layers` layers. Throws ConfigError when the list does
  // not cover them (validate() has already refused that for a loaded config).
  std::vector<Recompute> recompute_layers(int64_t layers) const;
  // ZeRO-3 per layer: true = its gathered parameters stay for the whole step (gathered once,
  // dropped after the optimizer), false = gathered per use.
  std::vector<bool> zero_keep_layers(int64_t layers) const;
  // A stateful compressor or Adasum: whole buckets reduced once per step, after backward, at
  // every ZeRO stage (Note [Compressed ZeRO-2/3] in parallel/compress.h).
  bool reduces_whole_buckets() const { return compress_has_state(compress) || reduce == GradReduce::kAdasum; }
};

// Note [Memory budget] (train/memory_budget.h).
struct MemoryConfig {
  double limit_gib = 0;  // per rank: loom's resident state at most this; 0: no budget (the machine's memory)
};

// Note [Optimizer offload] (modes/offload/offload.h).
struct OffloadConfig {
  OffloadTier optimizer = OffloadTier::kNone;  // none | disk: AdamW's moments in a scratch file under dir, streamed
  OffloadTier params = OffloadTier::kNone;     // none | disk: the parameters there too, units read just in time (Note [Parameter offload])
  OffloadTier grads = OffloadTier::kNone;      // none | disk: the gradients in chunks too, spilled there (Note [Gradient chunks])
  std::string dir;                 // an existing writable directory (local disk) for the scratch files
  double sub_group_mb = 16;        // MiB of each moment per streamed sub-group
  int64_t slots = 3;               // sub-group buffers: one updated while the others read ahead and write behind
  bool direct = false;             // O_DIRECT: bypass the page cache (the disk's own speed; no cached copy)
  // Parameter offload's chunks (Note [Chunk manager]): MiB each, rounded to whole 4 KiB
  // pages; 0: one chunk per unit (block, embedding, head).
  double chunk_mb = 0;
  int64_t chunk_floats() const { return chunk_mb <= 0 ? 0 : std::max<int64_t>(1024, int64_t(chunk_mb * double(1 << 18)) / 1024 * 1024); }
  // Resident bytes of the buffers streaming `state_floats` floats of each moment (a
  // sub-group is never larger than the state; each moment's part of a buffer is rounded
  // up to 4 KiB).
  int64_t buffer_bytes(int64_t state_floats) const {
    const int64_t group = std::max<int64_t>(1, int64_t(sub_group_mb * double(1 << 20)) / 4);
    return slots * (params == OffloadTier::kDisk ? 3 : 2) * ((std::min(group, std::max<int64_t>(state_floats, 1)) + 1023) / 1024 * 1024) * 4;
  }
};

// Note [Parameter server] (modes/ps/ps.h): how servers apply the workers' pushes.
struct PsConfig {
  PsMode mode = PsMode::kSync;  // sync (bulk synchronous) | async (each push on arrival) | ssp (bounded staleness)
  int64_t staleness = 2;      // ssp: a worker may run at most this many steps ahead of the slowest
  // Note [Sparse embeddings] (modes/ps/ps_sparse.h): the embedding's touched rows only, lazy AdamW.
  bool sparse_embedding = false;
  // Benchmarks and tests: worker slow_worker (-1: none) sleeps (slow_factor - 1) x its
  // compute time before each push, a straggler running slow_factor times slower.
  int64_t slow_worker = -1;
  double slow_factor = 1.0;
  bool free_running() const { return mode != PsMode::kSync; }  // workers never meet per step
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  CheckpointConfig checkpoint;
  CommConfig comm;
  ParallelConfig parallel;
  MemoryConfig memory;
  OffloadConfig offload;
  PsConfig ps;

  // Note [Global batch]: train.batch is the global batch (sequences per optimizer step) in
  // every layout: batch = micro_batch() x train.grad_accum x parallel.dp, checked by
  // validate(), so changing the layout never silently changes the math.
  int64_t seq_len() const { return train.seq > 0 ? train.seq : model.ctx; }
  // A rank's tokens of each sequence: seq_len() / parallel.cp.
  int64_t local_seq() const { return seq_len() / std::max<int64_t>(parallel.cp, 1); }
  int64_t micro_batch() const {
    if (parallel.micro_batch > 0) return parallel.micro_batch;
    const int64_t d = train.grad_accum * parallel.dp;
    return d > 0 ? train.batch / d : 0;
  }
};

// Loads `toml_path` (may be empty) and applies `overrides` ("section.key=value").
// Throws ConfigError for unknown keys, bad syntax or type mismatch; then validates.
Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides);
// The same without validating the values (unknown keys and values that do not parse still
// throw): for a caller that derives keys from what was given before the one validated load
// (loom simulate's layout from --gpus and the batch).
Config load_config_unvalidated(const std::string& toml_path, const std::vector<std::string>& overrides);

// Builds a config from TOML text (used for checkpoints and tests). Validates.
Config config_from_toml_string(const std::string& text, const std::vector<std::string>& overrides = {});

// Applies a model preset's values to every model key.
void apply_model_preset(ModelConfig& m, const std::string& preset);
std::vector<std::string> model_preset_names();
// Note [Model given by shape]: with no preset named, the keys `given` ("model.d_model", ...)
// decide ffn and kv_heads by the architecture; the rest from the default preset are noted.
void complete_model_by_shape(ModelConfig& m, const std::vector<std::string>& given);

// Every violation, one message each; empty when valid.
std::vector<std::string> validation_errors(const Config& c);
// The [parallel] checks and the global-batch identity (parallel_config.cc); part of
// validation_errors.
void append_parallel_errors(const Config& c, std::vector<std::string>& errs);
// Throws ConfigError listing all violations.
void validate(const Config& c);

// True when two configs describe the same model (their [model] sections are equal): what
// a checkpoint must share with the run that loads it.
bool same_model(const Config& a, const Config& b);

// The fully-resolved config as TOML (what a checkpoint stores).
std::string to_toml(const Config& c);

// "section.key" -> one-line help, for `loom train --help`.
std::vector<std::pair<std::string, std::string>> config_key_help();

}  // namespace loom
