// The engine's side of offload (Note [Optimizer offload] in modes/offload/offload.h, Note
// [Parameter offload] and Note [Chunk manager] in modes/offload/chunk_manager.h): the
// parameters into the file and the chunk manager, ZeRO-3's packed own pieces, the moments'
// file, and the update that streams p with m and v.
#include "loom/modes/offload/offload_part.h"

#include <algorithm>
#include <iomanip>

#include "loom/ckpt/shard_ckpt.h"
#include "loom/core/memory.h"
#include "loom/engine/engine.h"
#include "loom/engine/parts.h"
#include "loom/parallel/grad_sync.h"
#include "loom/train/memory_budget.h"
#include "loom/train/report.h"
#include "loom/train/trace.h"
#include "loom/train/train_options.h"

namespace loom {

OffloadPart::OffloadPart(const Config& cfg, Engine& e, GatherPart* gather, StateFile& file, int64_t chunk_floats,
                         int64_t budget_bytes, bool grads, std::unique_ptr<StateFile> whole)
    : cfg_(cfg), e_(e), file_(file), packed_(gather != nullptr), whole_(std::move(whole)) {
  Model& model = e.model;
  const uint64_t seed = uint64_t(cfg.train.seed);
  std::vector<FlatRange> units;
  float* managed = model.params().data();
  int64_t total = int64_t(model.params().size());
  StateFile* source = &file;  // the file the chunks are read from
  if (whole_) {  // Note [Replicated-parameter offload]
    source = whole_.get();
    model.init_weights(seed, source->map(0).data(), [this](int64_t at, int64_t n) { whole_->flush(0, at, n); });
    pack_from_whole();
    for (int u = 0; u < model.units(); u++) units.push_back(model.unit_range(u));
  } else if (gather) {  // Note [ZeRO-3 offload]
    units = pack_own_pieces(seed);
    managed = own_pieces_.data(), total = int64_t(own_pieces_.size());
    // A unit's whole gradients stay until its reduce-scatter is done, a moment that moves with
    // the other ranks: the memory besides the chunks varies by up to the largest unit.
    int64_t largest = 0;
    for (const parallel::Bucket& b : e.plan.buckets) largest = std::max(largest, b.count);
    if (budget_bytes > 0) budget_bytes = std::max<int64_t>(1, budget_bytes - largest * int64_t(sizeof(float)));
  } else {
    // The initial weights straight into the file, each tensor written back and dropped from
    // the process as it completes (a resume overwrites them there); the flat buffer was never
    // touched.
    model.init_weights(seed, file.map(2).data(), [&file](int64_t at, int64_t n) { file.flush(2, at, n); });
    for (int u = 0; u < model.units(); u++) units.push_back(model.unit_range(u));
  }
  chunks_ = std::make_unique<ChunkManager>(*source, managed, total, units, chunk_floats, budget_bytes, &e.memory,
                                           grads ? model.grads().data() : nullptr);
  ChunkManager* const c = chunks_.get();
  if (gather) {
    gather->gather().set_own_pieces([this, c, units](int unit, bool acquire) -> const float* {
      if (!acquire) return c->release(unit), nullptr;
      c->acquire(unit);
      return own_pieces_.data() + units[size_t(unit)].offset;
    });
    gather->set_packed_source([this] { return file_.map(file_.p_array()).data(); });
    return;
  }
  model.set_param_hook([c](int unit, bool acquire) {
    if (acquire) c->acquire(unit);
    else c->release(unit);
  });
  if (grads)
    model.set_grad_hook([c](int unit, bool begin) {
      if (begin) c->acquire_grads(unit);
      else c->release_grads(unit);
    });
}

bool OffloadPart::materialize_params() {
  if (packed_) return false;  // ZeRO-3: the gather part gathers from the packed file
  chunks_->materialize();
  return true;
}

void OffloadPart::after_resume(int64_t) {
  chunks_->drop_all();  // the file's parameters changed under any resident chunk
  if (whole_) pack_from_whole();  // Note [Replicated-parameter offload]
}

void OffloadPart::trace(Trace* t) {
  if (!t) return chunks_->set_span_hook(nullptr);
  chunks_->set_span_hook([t](const char* what, bool begin) {  // Note [Chunk manager]: waits on chunk transfers
    if (begin) t->begin(what, "io");
    else t->end();
  });
}

void OffloadPart::save_state(ShardState& s) const { s.params_packed = packed_; }

// Note [Chunk manager]: what parameter offload's chunks did over the run.
void OffloadPart::report_memory(std::ostream& os, TrainSummary& sum) {
  const ChunkManager& m = *chunks_;
  const ChunkManager::Stats& s = m.stats();
  sum.param_chunk_read_bytes = s.read_bytes, sum.param_chunk_evictions = s.evictions;
  sum.grad_chunk_written_bytes = s.grad_written_bytes;
  sum.param_chunk_last_step_read_bytes = s.last_step_read_bytes;
  os << " (parameter offload: " << m.chunks() << " chunks of "
     << (s.chunk_floats > 0 ? bytes_text(s.chunk_floats * int64_t(sizeof(float))) : std::string("one unit"))
     << ", at most " << bytes_text(s.peak_resident_bytes) << " resident at once; " << s.reads << " reads ("
     << bytes_text(s.read_bytes) << "), " << s.hits << " of " << s.acquires << " acquires found resident, "
     << s.evictions << " evictions; warm-up: " << s.trace_events << " accesses, non-model memory "
     << bytes_text(s.peak_non_model_bytes);
  if (s.replayed_steps > 0)
    os << "; after it " << bytes_text(s.replayed_read_bytes / s.replayed_steps) << " read per step, "
       << bytes_text(s.last_step_read_bytes) << " in the last";
  if (m.manages_grads())
    os << "; gradients in " << m.chunks(ChunkManager::kGrads) << " chunks: " << bytes_text(s.grad_written_bytes)
       << " spilled, " << bytes_text(s.grad_read_bytes) << " read back";
  if (cfg_.memory.limit_gib > 0 && s.over_budget_events > 0)
    os << "; " << s.over_budget_events << " acquires needed more than the budget left for chunks";
  os << ")";
}

// Note [Replicated-parameter offload]
// Parameter offload with ZeRO-1/2 (parallel.zero = 1 or 2, dp > 1): the parameters are
// replicated, the moments sharded. Two files: the whole parameters (a StateFile of one array,
// in the flat buffer's order), which the chunk manager reads as it does without ZeRO; and the
// optimizer's, whose third array holds this rank's own pieces packed in owned order beside
// their m and v, so the update streams p with m and v as ever. After the update the own
// pieces are all-gathered over dp straight into the whole file's mapping (every rank ends
// with every rank's new pieces), the resident chunks take the new values (refresh), and the
// mapping's pages are written back and handed back. Same values, same order: training equals
// in-memory ZeRO-1/2 bit for bit. Checkpoints save and load the whole view (as ZeRO 0), and a
// resume packs the own pieces from it again (pack_from_whole).
void OffloadPart::pack_from_whole() {
  StateFile& file = file_;
  const std::span<float> from = whole_->map(0), packed = file.map(2);
  int64_t q = 0;
  for (const FlatRange& r : e_.plan.owned(e_.rc.dp_rank)) {
    std::copy(from.begin() + r.offset, from.begin() + r.offset + r.count, packed.begin() + q);
    file.flush(2, q, r.count);
    whole_->flush(0, r.offset, r.count);
    q += r.count;
  }
}

// Note [ZeRO-3 offload]
// Parameter offload with ZeRO-3 (ZeRO-Infinity's layout): a rank's file holds its own pieces
// of every unit packed in owned order - the order of its moments, so the update streams p
// with m and v as without ZeRO - and the chunk manager keeps them in own_pieces_ under the
// budget. A unit's gather takes its own piece from the manager (read from the file if it
// was evicted), sends it, and hands it back once the all-gather is done; the gathered copy
// lives in the gather pool as before. The initial weights are drawn tensor by tensor into
// the (untouched) flat buffer, this rank's slices copied into the file, the tensor's pages
// handed back: the process never holds more than one tensor of them. Checkpoints save and
// load the packed view (ShardState::params_packed). Returns each unit's packed range.
std::vector<FlatRange> OffloadPart::pack_own_pieces(uint64_t seed) {
  StateFile& file = file_;
  Model& model = e_.model;
  const std::vector<int>& unit_bucket = e_.unit_bucket;
  const parallel::DataParallelPlan& plan = e_.plan;
  const std::vector<FlatRange> owned = plan.owned(e_.rc.dp_rank);
  int64_t n = 0;
  for (const FlatRange& r : owned) n += r.count;
  own_pieces_.assign(size_t(n), 0.0f);
  release_pages(own_pieces_.data(), n * int64_t(sizeof(float)));
  e_.memory.track(e_.memory.category("params"), own_pieces_.data(), n * int64_t(sizeof(float)));
  float* const flat = model.params().data();
  const std::span<float> packed = file.map(2);
  model.init_weights(seed, flat, [&](int64_t at, int64_t count) {
    int64_t q = 0;  // packed position of range r
    for (const FlatRange& r : owned) {
      const int64_t lo = std::max(at, r.offset), hi = std::min(at + count, r.offset + r.count);
      if (hi > lo) {
        std::copy(flat + lo, flat + hi, packed.data() + q + (lo - r.offset));
        file.flush(2, q + (lo - r.offset), hi - lo);
      }
      q += r.count;
    }
    release_pages(flat + at, count * int64_t(sizeof(float)));
  });
  release_pages(flat, int64_t(model.params().size() * sizeof(float)));  // the pages tensors shared at their ends
  std::vector<FlatRange> units(unit_bucket.size(), FlatRange{0, 0});
  int64_t q = 0;
  for (size_t b = 0; b < plan.buckets.size(); b++) {
    for (size_t u = 0; u < unit_bucket.size(); u++)
      if (unit_bucket[u] == int(b)) units[u] = {q, owned[b].count};
    q += owned[b].count;
  }
  return units;
}

void Updater::offload_optimizer(int global_rank) {
  const OffloadConfig& o = cfg_.offload;
  const int64_t group = std::max<int64_t>(1, int64_t(o.sub_group_mb * double(1 << 20)) / int64_t(sizeof(float)));
  const bool params = o.params == OffloadTier::kDisk;  // Note [Parameter offload]: p as the file's third array
  adamw_.offload(std::make_unique<StateFile>(o.dir, global_rank, adamw_.state_floats(), group, int(o.slots), o.direct,
                                             params ? 3 : 2, o.grads == OffloadTier::kDisk));
  std::unique_ptr<StateFile> whole;  // Note [Replicated-parameter offload]
  if (params && e_.rc.dp && (e_.rc.zero == 1 || e_.rc.zero == 2))
    whole = std::make_unique<StateFile>(o.dir, global_rank, int64_t(e_.model.params().size()), /*group=*/1, 2,
                                        o.direct, 1);  // never streamed: its two slot buffers stay a page each
  if (params) {
    auto part = std::make_unique<OffloadPart>(cfg_, e_, gather_part_, *adamw_.offload_file(), o.chunk_floats(),
                                              int64_t(cfg_.memory.limit_gib * double(int64_t(1) << 30)),
                                              o.grads == OffloadTier::kDisk, std::move(whole));
    offload_ = part.get();
    e_.add_store(std::move(part));
  }
  const StateFile& f = *adamw_.offload_file();
  for (int s = 0; s < f.slot_count(); s++) e_.memory.track(e_.memory.category("optimizer"), f.slot_data(s), f.slot_bytes());
}

// Note [Chunk manager]: p streams with m and v and refreshes the resident chunks; managed
// gradients (Note [Gradient chunks]) are made resident and clipped a sub-group at a time.
void Updater::step_chunked(const Kernels& k, double lr, double coef) {
  ChunkManager& chunks = offload_->chunks();
  float* g = e_.model.grads().data();
  AdamW::GroupFn before;
  if (chunks.manages_grads())
    before = [&](int64_t begin, int64_t count) {
      chunks.grads_for_update(begin, count);
      if (coef != 1.0) k.scale_inplace(g + begin, count, float(coef));
    };
  if (StateFile* const whole_file = offload_->whole()) {  // Note [Replicated-parameter offload]: the own pieces, then everyone's
    adamw_.step(k, e_.model.params(), e_.model.grads(), lr, {}, before);
    StateFile& whole = *whole_file;
    const std::span<float> all = whole.map(0);
    parallel::gather_pieces(*e_.rc.dp, e_.plan, all.data(), adamw_.offload_file()->map(2).data());
    chunks.refresh(0, int64_t(all.size()), all.data());
    whole.flush(0, 0, int64_t(all.size()));
    chunks.end_step();
    return;
  }
  adamw_.step(k, e_.model.params(), e_.model.grads(), lr,
              [&](int64_t begin, int64_t count, const float* p) { chunks.refresh(begin, count, p); }, before);
  chunks.end_step();
}

void OffloadPart::estimate(const EstimateInputs& in, MemoryEstimate& e) {
  // Note [Chunk manager]: at the least the units in use and the one read ahead (GPT's tied
  // head holds the embedding too), each rounded out to whole chunks (a unit touches at most
  // two chunks beyond its own length). The manager keeps more where the budget leaves room.
  // With ZeRO-3 it holds their own pieces (Note [ZeRO-3 offload]), beside the pool.
  const OffloadConfig& o = in.cfg.offload;
  const bool gathers = in.zero >= 3 && in.dp > 1;
  const int64_t in_flight = in.units_in_flight / (gathers ? in.shards() : 1) + 6 * o.chunk_floats();
  e.params_offloaded = std::min(e.params - e.gather_pool, in_flight * int64_t(sizeof(float))) + e.gather_pool;
  if (o.params == OffloadTier::kDisk) e.params = e.params_offloaded;
  if (o.grads == OffloadTier::kDisk) e.grads = e.params_offloaded;  // Note [Gradient chunks]: as many in flight
  if (o.optimizer == OffloadTier::kDisk) e.optimizer = o.buffer_bytes(e.moment_floats);
}

}  // namespace loom
