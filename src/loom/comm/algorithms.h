// Collective algorithms over point-to-point transfers (Note [Transport contract]).
//
// Every algorithm leaves bit-identical results on all ranks: each output element is
// reduced by exactly one rank in one fixed order and then copied, or (recursive halving
// with a fold) reduced symmetrically with commutative adds of the same operands.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <thread>
#include <span>
#include <vector>

#include "loom/comm/transport.h"
#include "loom/comm/types.h"

namespace loom::comm {

// A transfer did not complete by the deadline. Group turns it into a diagnosed CommError.
class CommTimeout : public CommError {
 public:
  using CommError::CommError;
};

// What an algorithm runs on: a transport, the deadline of the current collective, a hook
// called about every 10 ms while waiting (answers peers' status requests), and a scratch
// buffer reused across calls so big collectives do not page-fault fresh memory each time.
class Link {
 public:
  Link(Transport& t, Clock::time_point deadline, std::function<void()> on_wait, std::vector<std::byte>& scratch)
      : t_(t), deadline_(deadline), on_wait_(std::move(on_wait)), scratch_(scratch) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  Transport& transport() { return t_; }

  TransferId isend(std::span<const std::byte> data, int peer, int tag) { return t_.isend(data, peer, tag); }
  TransferId irecv(std::span<std::byte> data, int peer, int tag) { return t_.irecv(data, peer, tag); }
  void wait(std::span<const TransferId> ids, const char* what, int peer);
  void send(std::span<const std::byte> data, int peer, int tag);
  void recv(std::span<std::byte> data, int peer, int tag);
  // Sends to `to` and receives from `from` at once (no ordering deadlock in rings).
  void exchange(std::span<const std::byte> out, int to, std::span<std::byte> in, int from, int tag);
  std::span<std::byte> scratch(size_t bytes);
  // Spins (yielding) until ready() is true; CommTimeout at the deadline naming `peer`.
  template <typename Ready>
  void spin_until(Ready&& ready, const char* what, int peer, int spin_limit = 64) {
    // Pure spinning first (a peer a few microseconds behind costs nothing extra; a
    // sched_yield costs ~1 us on this VM), then yield so oversubscribed ranks progress, or
    // in a background wait nap (Note [Background waits]). A background wait spins 64 times
    // at most: nobody waits on it, and its spins would take the core from the caller's
    // compute (a 2bw step's lazy loss sum, submitted while the other stage still ran its
    // last backward, held the first stage's step end for 0.5-0.9 ms in 20,000 spins).
    if (background_wait().urgent) spin_limit = std::min(spin_limit, 64);
    Clock::time_point slow_since{};
    for (int spins = 0; !ready(); ++spins) {
      if ((spins & 63) == 63) poll_deadline(what, peer);  // a yield can take ~1 ms when oversubscribed
      if (spins > spin_limit) {
        if (spins == spin_limit + 1) slow_since = Clock::now();
        // The clock is read again only in a background wait (a foreground spin just yields).
        if (background_wait().urgent && background_nap(Clock::now() - slow_since, deadline_)) poll_deadline(what, peer);
        else std::this_thread::yield();
      }
#if defined(__x86_64__)
      else __builtin_ia32_pause();
#endif
    }
  }

 private:
  void poll_deadline(const char* what, int peer);
  Transport& t_;
  Clock::time_point deadline_;
  Clock::time_point next_hook_{};
  std::function<void()> on_wait_;
  std::vector<std::byte>& scratch_;
};

// acc[i] = acc[i] (op) x[i] for sum/avg (adds) and max; bf16 adds in float and rounds.
void reduce_into(DType dtype, ReduceOp op, std::byte* acc, const std::byte* x, size_t count);
// data[i] *= 1 / divisor (the avg step); floating dtypes only.
void divide(DType dtype, std::byte* data, size_t count, int divisor);

// a mod n in [0, n) for ring neighbours of negative offsets.
inline int mod(int a, int n) { return ((a % n) + n) % n; }

// Element range of chunk i when `count` elements are cut into `parts` near-equal chunks
// (core/even_split.h: the first count % parts chunks get one more).
struct Chunk {
  size_t begin = 0, count = 0;
};
Chunk chunk_of(size_t count, int parts, int i);

// Note [Ring codecs]
// A ring step moves a chunk in a wire format. Without a codec that is the elements' own
// bytes: sent from and received into place, partial sums reduced in the buffer's dtype.
// With one (f32 sum/avg only), each step encodes the outgoing partial sum, decodes the
// incoming one into scratch and adds it in f32; the owner of a finished chunk encodes it
// once and keeps the decoded value itself, and the all-gather forwards wire bytes
// unchanged, so every rank ends with the same bits (Note [Compressed all-reduce]). One
// schedule serves both; a new compression is a new codec, not a new ring.
class RingCodec {
 public:
  virtual ~RingCodec() = default;
  virtual size_t wire_bytes(size_t count) const = 0;
  virtual void encode(const float* x, size_t count, std::byte* wire) const = 0;
  virtual void decode(const std::byte* wire, size_t count, float* x) const = 0;
};

// all_reduce in place on buf (count elements); `codec`: the messages' wire format.
void ring_all_reduce(Link& l, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op,
                     const RingCodec* codec = nullptr);
// Rabenseifner: fold to a power of two, recursive halving reduce-scatter, recursive
// doubling all-gather, unfold. 2 log2(p) steps instead of the ring's 2 (p - 1).
void recursive_all_reduce(Link& l, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op);
// in: count x size elements (block j for rank j); out: count elements. `codec` (f32 sum/avg
// only): the partial sums' wire format (Note [Ring codecs]).
void ring_reduce_scatter(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count,
                         DType dtype, ReduceOp op, const RingCodec* codec = nullptr);
// in: count elements; out: count x size elements (block j from rank j).
void ring_all_gather(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype);
void tree_broadcast(Link& l, std::span<std::byte> buf, int root);
// out is written on the root only.
void tree_reduce(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t count, DType dtype,
                 ReduceOp op, int root);
// in/out: size blocks of block_bytes; block j of in goes to rank j, block i of out came from rank i.
void pairwise_all_to_all(Link& l, std::span<const std::byte> in, std::span<std::byte> out, size_t block_bytes);
void dissemination_barrier(Link& l);
// Barrier through epoch flags in the group's shared segment (one node).
void shm_barrier(Link& l, SharedSegment& seg);

// Note [Shared-memory all-reduce]
// Members of a one-node group share regions [flag | slot 0 | slot 1]. The buffer is cut
// into chunks of kSlotBytes, numbered across calls; chunk k uses slot k % 2. Per chunk:
//   1. each member copies its chunk into its own slot;       barrier
//   2. member r adds piece r of every other slot (member order) into piece r of its own
//      slot (only r touches piece r of slot r in this step, so it is race-free); barrier
//   3. each member copies every piece j from member j's slot into its buffer.
// Slot k % 2 is rewritten at chunk k + 2, after the barrier of chunk k + 1 step 1, which
// every member passes only after finishing chunk k step 3. Each element is reduced once,
// in one order, so all members get the same bits. Barriers are epoch flags in shared
// memory: a member stores its epoch and waits until every flag reaches it.
void shm_all_reduce(Link& l, SharedSegment& seg, std::span<std::byte> buf, size_t count, DType dtype, ReduceOp op);

// Note [Shared-memory reduce-scatter]
// The reduce-scatter of a one-node group (in: count x size elements, block j for member j;
// out: count elements, inside `in` or not) through the same regions, in rounds of len =
// kSlotBytes / (size x element) elements of every block, numbered across calls like the
// all-reduce's chunks (round k uses slot k % 2):
//   1. each member copies the round's len elements of every block j into sub-slot j of its
//      own slot;                                                   barrier
//   2. member r sums sub-slot r of every slot into its output in the ring's order (member
//      r + 1's first, then r + 2, ..., r itself last; ring_reduce_scatter's partial sums), so
//      the bits are the ring's, whatever the placement; avg divides after.
// Slot k % 2 is rewritten at round k + 2, after round k + 1's barrier, which no member passes
// before it finished round k's step 2: one barrier a round. A member reads other members'
// slots only, never their buffers, so an output inside the input is safe. Half the traffic of
// shm_all_reduce, whose second half copies every piece back to every member.
void shm_reduce_scatter(Link& l, SharedSegment& seg, std::span<const std::byte> in, std::span<std::byte> out,
                        size_t count, DType dtype, ReduceOp op);
// The all-gather of a one-node group (in: count elements; out: count x size, block j from
// member j; `in` may be this member's own block of `out`) the same way: per round each member
// copies kSlotBytes of its input into its slot, one barrier, then every slot's round into its
// block of the output. A copy, so the bits are every algorithm's.
void shm_all_gather(Link& l, SharedSegment& seg, std::span<const std::byte> in, std::span<std::byte> out,
                    size_t count, DType dtype);

// All-reduce over members on several nodes: all-reduce inside the node (shm when the node
// shares memory, else recursive), ring all-reduce among node leaders (intra rank 0; `inter`
// is non-null on leaders only), broadcast from the leader inside the node. avg divides by
// `group_size` at the end on every member (same input, same bits).
void hierarchical_all_reduce(Link& intra, Link* inter, std::span<std::byte> buf, size_t count, DType dtype,
                             ReduceOp op, int group_size);

// Note [Compressed all-reduce]
// A ring all-reduce of f32 whose messages are bf16 (2 bytes per value) or int8 with one
// f32 scale per block of kQuantBlock values (scale = max|x| / 127, q = round(x / scale);
// ZeRO++'s block quantisation; ~3.9x smaller). Partial sums are quantised at every hop of
// the reduce-scatter and accumulated in f32; each owner quantises its finished chunk
// once and keeps the dequantised value itself, and the all-gather forwards those bytes
// unchanged, so all ranks end with the same bits. Error: bf16 rounds to 8 significant
// bits per hop; int8 adds at most scale / 2 per value per hop.
inline constexpr size_t kQuantBlock = 256;
void compress(Compression c, const float* x, size_t count, std::byte* out);
void decompress(Compression c, const std::byte* in, size_t count, float* x);
// The ring codec of a compression other than kNone.
const RingCodec& ring_codec(Compression c);

}  // namespace loom::comm
