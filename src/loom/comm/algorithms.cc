#include "loom/comm/algorithms.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "loom/core/error.h"

namespace loom::comm {
namespace {

constexpr int kTagAllReduce = kFirstInternalTag + 1;
constexpr int kTagReduceScatter = kFirstInternalTag + 2;
constexpr int kTagAllGather = kFirstInternalTag + 3;
constexpr int kTagBroadcast = kFirstInternalTag + 4;
constexpr int kTagReduce = kFirstInternalTag + 5;
constexpr int kTagAllToAll = kFirstInternalTag + 6;
constexpr int kTagBarrier = kFirstInternalTag + 7;
constexpr int kTagCompressed = kFirstInternalTag + 9;

// Below this size recursive_all_reduce exchanges whole vectors (log2 p steps) instead of
// halving them (2 log2 p steps): at ~5 us per step and >= 5 GB/s, sending 32 KiB twice
// costs less than one extra step.
constexpr size_t kDoublingMaxBytes = 32 << 10;
// Up to this size shm_all_reduce uses one barrier and redundant sums (p x bytes read per
// member) instead of two barriers: a barrier costs ~0.5 us, reading 16 KiB ~0.5 us.
constexpr size_t kShmOneBarrierMaxBytes = 16 << 10;

// memmove that accepts empty ranges with null pointers (zero-count collectives).
void move_bytes(std::byte* dst, const std::byte* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

}  // namespace

void Link::wait(std::span<const TransferId> ids, const char* what, int peer) {
  // Completion flags: on the stack for the usual one or two transfers.
  char small_done[8] = {};
  std::vector<char> big_done(ids.size() > 8 ? ids.size() : 0, 0);
  char* const flags = ids.size() > 8 ? big_done.data() : small_done;
  auto done = [&](size_t i) -> char& { return flags[i]; };
  const Clock::time_point started = Clock::now();
  Clock::time_point next_hook = started + std::chrono::milliseconds(10);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < ids.size(); ++i)
      if (!done(i)) {
        done(i) = t_.test(ids[i]);
        all = all && done(i);
      }
    if (all) return;
    const Clock::time_point now = Clock::now();
    if (now >= deadline_) {
      for (size_t i = 0; i < ids.size(); ++i)
        if (!done(i)) t_.cancel(ids[i]);
      throw CommTimeout(detail::cat("timed out (comm.timeout_s): ", what, " with group rank ", peer, " did not complete"));
    }
    if (now >= next_hook) {
      try {
        if (on_wait_) on_wait_();  // may throw: a member of the group is known dead
      } catch (...) {
        for (size_t i = 0; i < ids.size(); ++i)
          if (!done(i)) t_.cancel(ids[i]);
        throw;
      }
      next_hook = now + std::chrono::milliseconds(10);
    }
    t_.idle(std::min(deadline_, now + std::chrono::milliseconds(1)), now - started);
  }
}

void Link::poll_deadline(const char* what, int peer) {
  const Clock::time_point now = Clock::now();
  if (now >= deadline_)
    throw CommTimeout(detail::cat("timed out (comm.timeout_s): ", what, " with group rank ", peer, " did not complete"));
  if (now >= next_hook_) {
    if (on_wait_) on_wait_();
    next_hook_ = now + std::chrono::milliseconds(10);
  }
}

void Link::send(std::span<const std::byte> data, int peer, int tag) {
  const TransferId id = t_.isend(data, peer, tag);
  wait({&id, 1}, "send", peer);
}

void Link::recv(std::span<std::byte> data, int peer, int tag) {
  const TransferId id = t_.irecv(data, peer, tag);
  wait({&id, 1}, "receive", peer);
}

void Link::exchange(std::span<const std::byte> out, int to, std::span<std::byte> in, int from, int tag) {
  const TransferId ids[2] = {t_.irecv(in, from, tag), t_.isend(out, to, tag)};
  wait(ids, "exchange", from);
}

std::span<std::byte> Link::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return {scratch_.data(), bytes};
}

void ring_all_reduce(Link& l, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op,
                     const RingCodec* codec) {
  const int n = l.size(), r = l.rank();
  if (n == 1) return;
  LOOM_ASSERT(!codec || (dtype == DType::kF32 && op != ReduceOp::kMax), "a ring codec carries f32 sums only");
  const size_t es = dtype_bytes(dtype), max_chunk = chunk_of(count, n, 0).count;
  const int right = mod(r + 1, n), left = mod(r - 1, n), tag = codec ? kTagCompressed : kTagAllReduce;
  // Scratch: [outgoing wire | incoming wire] (codec only; 64-byte aligned for scales and
  // floats) | one chunk of elements.
  const size_t wire = codec ? (codec->wire_bytes(max_chunk) + 63) / 64 * 64 : 0;
  const std::span<std::byte> s = l.scratch(2 * wire + max_chunk * es);
  std::byte* out_wire = s.data();
  std::byte* in_wire = s.data() + wire;
  std::byte* tmp = s.data() + 2 * wire;
  auto bytes_of = [&](Chunk c) { return buf.subspan(c.begin * es, c.count * es); };
  auto floats_of = [&](Chunk c) { return reinterpret_cast<float*>(buf.data() + c.begin * es); };
  // Reduce-scatter: after step s rank r holds s + 2 contributions of chunk r - s - 1;
  // after n - 1 steps chunk r + 1 is complete here.
  for (int st = 0; st < n - 1; ++st) {
    const Chunk send = chunk_of(count, n, mod(r - st, n)), recv = chunk_of(count, n, mod(r - st - 1, n));
    if (codec) {
      codec->encode(floats_of(send), send.count, out_wire);
      l.exchange({out_wire, codec->wire_bytes(send.count)}, right, {in_wire, codec->wire_bytes(recv.count)}, left,
                 tag);
      codec->decode(in_wire, recv.count, reinterpret_cast<float*>(tmp));
    } else {
      l.exchange(bytes_of(send), right, {tmp, recv.count * es}, left, tag);
    }
    reduce_into(dtype, op, buf.data() + recv.begin * es, tmp, recv.count);
  }
  const Chunk own = chunk_of(count, n, mod(r + 1, n));
  if (op == ReduceOp::kAvg) divide(dtype, buf.data() + own.begin * es, own.count, n);
  if (codec) {  // encode the finished chunk once; keep what the others will decode
    codec->encode(floats_of(own), own.count, out_wire);
    codec->decode(out_wire, own.count, floats_of(own));
  }
  // All-gather: pass complete chunks (or their wire bytes, unchanged) around the ring.
  for (int st = 0; st < n - 1; ++st) {
    const Chunk send = chunk_of(count, n, mod(r + 1 - st, n)), recv = chunk_of(count, n, mod(r - st, n));
    if (!codec) {
      l.exchange(bytes_of(send), right, bytes_of(recv), left, tag);
      continue;
    }
    l.exchange({out_wire, codec->wire_bytes(send.count)}, right, {in_wire, codec->wire_bytes(recv.count)}, left, tag);
    codec->decode(in_wire, recv.count, floats_of(recv));
    std::swap(out_wire, in_wire);
  }
}

void recursive_all_reduce(Link& l, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op) {
  const int n = l.size(), r = l.rank();
  if (n == 1) return;
  const size_t es = dtype_bytes(dtype);
  int pof2 = 1;
  while (pof2 * 2 <= n) pof2 *= 2;
  const int rem = n - pof2;
  const std::span<std::byte> tmp = l.scratch(count * es);
  // Fold: among the first 2 rem ranks, each even rank hands its data to the odd one above.
  int newrank = r - rem;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      l.send(buf, r + 1, kTagAllReduce);
      newrank = -1;
    } else {
      l.recv(tmp.first(count * es), r - 1, kTagAllReduce);
      reduce_into(dtype, op, buf.data(), tmp.data(), count);
      newrank = r / 2;
    }
  }
  auto real_rank = [&](int nr) { return nr < rem ? nr * 2 + 1 : nr + rem; };
  if (newrank >= 0 && count * es <= kDoublingMaxBytes) {
    // Latency-bound: recursive doubling of the whole vector, log2(p) exchanges. Partners
    // add the same two operands (a + b = b + a), so all ranks keep identical bits.
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = real_rank(newrank ^ mask);
      l.exchange(buf.first(count * es), partner, tmp.first(count * es), partner, kTagAllReduce);
      reduce_into(dtype, op, buf.data(), tmp.data(), count);
    }
    if (op == ReduceOp::kAvg) divide(dtype, buf.data(), count, n);
  } else if (newrank >= 0) {
    struct Step {
      int partner;
      size_t keep_lo, keep_hi, give_lo, give_hi;
    };
    std::vector<Step> steps;
    size_t lo = 0, hi = count;
    // Recursive halving: partners share [lo, hi); the lower keeps the lower half.
    for (int mask = pof2 / 2; mask >= 1; mask /= 2) {
      const int pn = newrank ^ mask;
      const size_t mid = lo + (hi - lo) / 2;
      Step st{real_rank(pn), lo, mid, mid, hi};
      if (newrank > pn) st = {real_rank(pn), mid, hi, lo, mid};
      l.exchange(buf.subspan(st.give_lo * es, (st.give_hi - st.give_lo) * es), st.partner,
                 tmp.first((st.keep_hi - st.keep_lo) * es), st.partner, kTagAllReduce);
      reduce_into(dtype, op, buf.data() + st.keep_lo * es, tmp.data(), st.keep_hi - st.keep_lo);
      steps.push_back(st);
      lo = st.keep_lo;
      hi = st.keep_hi;
    }
    if (op == ReduceOp::kAvg) divide(dtype, buf.data() + lo * es, hi - lo, n);
    // Recursive doubling: undo the halving, swapping finished halves.
    for (auto it = steps.rbegin(); it != steps.rend(); ++it)
      l.exchange(buf.subspan(it->keep_lo * es, (it->keep_hi - it->keep_lo) * es), it->partner,
                 buf.subspan(it->give_lo * es, (it->give_hi - it->give_lo) * es), it->partner, kTagAllReduce);
  }
  if (r < 2 * rem) {
    if (r % 2 == 0) l.recv(buf.first(count * es), r + 1, kTagAllReduce);
    else l.send(buf.first(count * es), r - 1, kTagAllReduce);
  }
}

// Note [Ring codecs] on the reduce-scatter: the ring of ring_reduce_scatter, each outgoing
// partial sum encoded and each incoming one decoded and added in f32; the block a rank keeps
// is its own f32 sum of the decoded partials, never encoded (no other rank needs it).
void coded_reduce_scatter(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                          const RingCodec& codec) {
  const int n = l.size(), r = l.rank();
  const size_t bytes = count * sizeof(float), wire = (codec.wire_bytes(count) + 63) / 64 * 64;
  const std::span<std::byte> s = l.scratch(2 * wire + 2 * bytes);
  std::byte* out_wire = s.data();
  std::byte* in_wire = s.data() + wire;
  float* acc = reinterpret_cast<float*>(s.data() + 2 * wire);
  float* incoming = acc + count;
  auto block = [&](int b) { return reinterpret_cast<const float*>(in.data() + static_cast<size_t>(b) * bytes); };
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int st = 0; st < n - 1; ++st) {
    codec.encode(st == 0 ? block(mod(r - 1, n)) : acc, count, out_wire);
    l.exchange({out_wire, codec.wire_bytes(count)}, right, {in_wire, codec.wire_bytes(count)}, left, kTagCompressed);
    codec.decode(in_wire, count, incoming);
    float* dst = st == n - 2 ? reinterpret_cast<float*>(out.data()) : acc;
    const float* own = block(mod(r - st - 2, n));
    for (size_t i = 0; i < count; ++i) dst[i] = own[i] + incoming[i];
  }
}

void ring_reduce_scatter(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                         DType dtype, ReduceOp op, const RingCodec* codec) {
  const int n = l.size(), r = l.rank();
  const size_t bytes = count * dtype_bytes(dtype);
  auto block = [&](int b) { return in.subspan(static_cast<size_t>(b) * bytes, bytes); };
  if (n > 1 && codec) {
    coded_reduce_scatter(l, in, out, count, *codec);
  } else if (n > 1) {
    const std::span<std::byte> s = l.scratch(2 * bytes);
    std::span<std::byte> acc = s.first(bytes), incoming = s.subspan(bytes);
    const int right = mod(r + 1, n), left = mod(r - 1, n);
    // Step s sends the partial sum of block r - s - 1 and receives that of block r - s - 2,
    // to which this rank adds its own; the last step receives block r.
    for (int st = 0; st < n - 1; ++st) {
      const std::span<const std::byte> send = st == 0 ? block(mod(r - 1, n)) : acc;
      l.exchange(send, right, incoming, left, kTagReduceScatter);
      const int b = mod(r - st - 2, n);
      if (st == n - 2) {
        move_bytes(out.data(), block(b).data(), bytes);
        reduce_into(dtype, op, out.data(), incoming.data(), count);
      } else {
        move_bytes(acc.data(), block(b).data(), bytes);
        reduce_into(dtype, op, acc.data(), incoming.data(), count);
      }
    }
  } else {
    move_bytes(out.data(), in.data(), bytes);
  }
  if (op == ReduceOp::kAvg) divide(dtype, out.data(), count, n);
}

void ring_all_gather(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype) {
  const int n = l.size(), r = l.rank();
  const size_t bytes = count * dtype_bytes(dtype);
  auto block = [&](int b) { return out.subspan(static_cast<size_t>(b) * bytes, bytes); };
  move_bytes(block(r).data(), in.data(), bytes);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) l.exchange(block(mod(r - s, n)), right, block(mod(r - s - 1, n)), left, kTagAllGather);
}

// Binomial tree rooted at `root`, in ranks relative to it (vr = r - root mod n).
void tree_broadcast(Link& l, std::span<std::byte> buf, int root) {
  const int n = l.size(), vr = mod(l.rank() - root, n);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      l.recv(buf, mod(vr - mask + root, n), kTagBroadcast);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) l.send(buf, mod(vr + mask + root, n), kTagBroadcast);
}

void tree_reduce(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype,
                 ReduceOp op, int root) {
  const int n = l.size(), vr = mod(l.rank() - root, n);
  const size_t bytes = count * dtype_bytes(dtype);
  const std::span<std::byte> s = l.scratch(2 * bytes);
  std::span<std::byte> acc = vr == 0 ? out.first(bytes) : s.first(bytes), incoming = s.subspan(bytes);
  move_bytes(acc.data(), in.data(), bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      l.send(acc, mod(vr - mask + root, n), kTagReduce);
      break;
    }
    if (vr + mask < n) {
      l.recv(incoming, mod(vr + mask + root, n), kTagReduce);
      reduce_into(dtype, op, acc.data(), incoming.data(), count);
    }
  }
  if (vr == 0 && op == ReduceOp::kAvg) divide(dtype, out.data(), count, n);
}

void pairwise_all_to_all(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t block_bytes) {
  const int n = l.size(), r = l.rank();
  auto in_block = [&](int b) { return in.subspan(static_cast<size_t>(b) * block_bytes, block_bytes); };
  auto out_block = [&](int b) { return out.subspan(static_cast<size_t>(b) * block_bytes, block_bytes); };
  move_bytes(out_block(r).data(), in_block(r).data(), block_bytes);
  for (int k = 1; k < n; ++k) {
    const int to = mod(r + k, n), from = mod(r - k, n);
    l.exchange(in_block(to), to, out_block(from), from, kTagAllToAll);
  }
}

void dissemination_barrier(Link& l) {
  const int n = l.size(), r = l.rank();
  for (int k = 1; k < n; k <<= 1) l.exchange({}, mod(r + k, n), {}, mod(r - k, n), kTagBarrier);
}

namespace {

std::atomic<uint64_t>& flag_of(SharedSegment& seg, int r) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(seg.region(r));
}

}  // namespace

void SharedSegment::set_members(int members) {
  const unsigned cores = std::thread::hardware_concurrency();
  spin_limit_ = cores != 0 && static_cast<unsigned>(members) > cores ? 64 : 20000;
}

void shm_barrier(Link& l, SharedSegment& seg) {
  const uint64_t epoch = seg.next_epoch();
  const int n = l.size();
  flag_of(seg, l.rank()).store(epoch, std::memory_order_release);
  for (int j = 0; j < n; ++j) {
    std::atomic<uint64_t>& f = flag_of(seg, j);
    l.spin_until([&] { return f.load(std::memory_order_acquire) >= epoch; }, "shared-memory barrier", j,
                 seg.spin_limit());
  }
}

void shm_all_reduce(Link& l, SharedSegment& seg, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op) {
  const int n = l.size(), r = l.rank();
  if (n == 1 || count == 0) return;  // every member skips alike, so the counters stay in step
  const size_t es = dtype_bytes(dtype);
  const size_t chunk_elems = SharedSegment::kSlotBytes / es;
  if (count * es <= kShmOneBarrierMaxBytes) {
    // Latency-bound: one barrier; every member sums all slots itself, in member order, so
    // all get the same bits. Slot reuse follows the same two-slot argument as below.
    const uint64_t k = seg.next_chunk();
    std::memcpy(seg.slot(r, k), buf.data(), count * es);
    shm_barrier(l, seg);
    move_bytes(buf.data(), seg.slot(0, k), count * es);
    for (int j = 1; j < n; ++j) reduce_into(dtype, op, buf.data(), seg.slot(j, k), count);
    if (op == ReduceOp::kAvg) divide(dtype, buf.data(), count, n);
    return;
  }
  for (size_t begin = 0; begin < count; begin += chunk_elems) {
    const uint64_t k = seg.next_chunk();  // numbered across calls, so slots keep alternating
    const size_t len = std::min(chunk_elems, count - begin);
    std::byte* mine = buf.data() + begin * es;
    std::memcpy(seg.slot(r, k), mine, len * es);
    shm_barrier(l, seg);
    // Piece r: own slot first, then the others in member order (fixed, so reproducible).
    const Chunk piece = chunk_of(len, n, r);
    if (piece.count) {
      std::byte* acc = seg.slot(r, k) + piece.begin * es;
      for (int j = 0; j < n; ++j)
        if (j != r) reduce_into(dtype, op, acc, seg.slot(j, k) + piece.begin * es, piece.count);
      if (op == ReduceOp::kAvg) divide(dtype, acc, piece.count, n);
    }
    shm_barrier(l, seg);
    for (int j = 0; j < n; ++j) {
      const Chunk p = chunk_of(len, n, j);
      move_bytes(mine + p.begin * es, seg.slot(j, k) + p.begin * es, p.count * es);
    }
  }
}

void shm_reduce_scatter(Link& l, SharedSegment& seg, std::span<const std::byte> in, std::span<std::byte> out,
                        size_t count, DType dtype, ReduceOp op) {
  const int n = l.size(), r = l.rank();
  const size_t es = dtype_bytes(dtype);
  if (n == 1 || count == 0) {  // every member skips alike, so the counters stay in step
    if (count > 0) move_bytes(out.data(), in.data(), count * es);
    return;
  }
  const size_t round = SharedSegment::kSlotBytes / (es * size_t(n));
  for (size_t begin = 0; begin < count; begin += round) {
    const uint64_t k = seg.next_chunk();  // numbered across calls, so slots keep alternating
    const size_t len = std::min(round, count - begin);
    auto sub = [&](int member, int block) {
      return seg.slot(member, k) + size_t(block) * len * es;
    };
    for (int j = 0; j < n; ++j) std::memcpy(sub(r, j), in.data() + (size_t(j) * count + begin) * es, len * es);
    shm_barrier(l, seg);
    std::byte* acc = out.data() + begin * es;
    std::memcpy(acc, sub(mod(r + 1, n), r), len * es);
    for (int j = 2; j <= n; ++j) reduce_into(dtype, op, acc, sub(mod(r + j, n), r), len);
    if (op == ReduceOp::kAvg) divide(dtype, acc, len, n);
  }
}

void shm_all_gather(Link& l, SharedSegment& seg, std::span<const std::byte> in, std::span<std::byte> out,
                    size_t count, DType dtype) {
  const int n = l.size(), r = l.rank();
  const size_t es = dtype_bytes(dtype);
  if (n == 1 || count == 0) {  // every member skips alike, so the counters stay in step
    move_bytes(out.data() + size_t(r) * count * es, in.data(), count * es);
    return;
  }
  const size_t round = SharedSegment::kSlotBytes / es;
  for (size_t begin = 0; begin < count; begin += round) {
    const uint64_t k = seg.next_chunk();  // numbered across calls, so slots keep alternating
    const size_t len = std::min(round, count - begin);
    std::memcpy(seg.slot(r, k), in.data() + begin * es, len * es);
    shm_barrier(l, seg);
    for (int j = 0; j < n; ++j) move_bytes(out.data() + (size_t(j) * count + begin) * es, seg.slot(j, k), len * es);
  }
}

void hierarchical_all_reduce(Link& intra, Link* inter, std::span<std::byte> buf, size_t count, DType dtype,
                             ReduceOp op, int group_size) {
  const ReduceOp step_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  if (SharedSegment* seg = intra.transport().shared()) shm_all_reduce(intra, *seg, buf, count, dtype, step_op);
  else recursive_all_reduce(intra, buf, count, dtype, step_op);
  if (inter != nullptr) ring_all_reduce(*inter, buf, count, dtype, step_op);
  tree_broadcast(intra, buf.first(count * dtype_bytes(dtype)), 0);
  if (op == ReduceOp::kAvg) divide(dtype, buf.data(), count, group_size);
}

}  // namespace loom::comm
