// Note [1-bit Adam] (compress.h): the compressed all-reduce with worker and server error
// feedback that 1-bit Adam runs on the momentum.
#include <algorithm>
#include <cmath>

#include "loom/core/error.h"
#include "loom/parallel/compress.h"

namespace loom::parallel {

namespace {

// y = x + err; scale = rms(y) (so |scale sgn(y)|_2 = |y|_2); bit k = (y_k >= 0), so 0 goes
// to +scale as in DeepSpeed's compressed all-reduce; err = y - scale sgn(y). err holds y
// between the two passes. Returns the scale (0 for an empty chunk).
float encode(const float* x, float* err, int64_t len, uint8_t* bits) {
  double ss = 0;
  for (int64_t k = 0; k < len; k++) {
    err[k] += x[k];
    ss += double(err[k]) * err[k];
  }
  const float scale = len ? float(std::sqrt(ss / double(len))) : 0.0f;
  std::fill(bits, bits + (len + 7) / 8, uint8_t{0});
  for (int64_t k = 0; k < len; k++) {
    const bool up = err[k] >= 0.0f;
    if (up) bits[k / 8] |= uint8_t(1u << (k % 8));
    err[k] -= up ? scale : -scale;
  }
  return scale;
}

inline float sign_of(const uint8_t* bits, int64_t k) { return (bits[k / 8] >> (k % 8)) & 1 ? 1.0f : -1.0f; }

// One bucket's 1-bit compressed all-reduce (Tang et al. 2021, Algorithm 1's communication).
// Each tensor of the bucket is cut into P chunks of L_t = ceil(n_t / P) (the last shorter);
// rank j serves chunk j of every tensor. A message to or from rank j is, per tensor, the
// chunk's sign bits (padded to whole bytes, at the tensor's offset in the message) plus one
// scale per tensor. Alignment padding between tensors is neither sent nor written (it
// stays zero).
class OneBit final : public BucketCompressor {
 public:
  OneBit(const Bucket& b, const std::vector<ParamSpec>& specs, int dp) : P_(dp) {
    for (int t = b.first_tensor; t <= b.last_tensor; t++) {
      const ParamSpec& s = specs[size_t(t)];
      Segment g{s.offset - b.offset, s.numel, (s.numel + dp - 1) / dp, bytes_, served_};
      bytes_ += (g.chunk + 7) / 8;
      served_ += g.chunk;
      segs_.push_back(g);
    }
    worker_.assign(size_t(b.count), 0.0f);
    server_.assign(size_t(served_), 0.0f);
  }

  void reduce(comm::Group& dp, std::span<float> x, int64_t) override {
    LOOM_ASSERT(x.size() == worker_.size() && dp.size() == P_);
    const size_t T = segs_.size();
    // Worker: chunk j of every tensor, compressed with the worker residual, goes to rank j.
    std::vector<uint8_t> send(size_t(P_ * bytes_)), recv(size_t(P_ * bytes_));
    std::vector<float> out_scale(T * size_t(P_)), in_scale(T * size_t(P_));
    for (int j = 0; j < P_; j++)
      for (size_t t = 0; t < T; t++) {
        const Segment& g = segs_[t];
        const int64_t at = g.at + j * g.chunk;
        out_scale[size_t(j) * T + t] =
            encode(x.data() + at, worker_.data() + at, g.len(j), send.data() + j * bytes_ + g.byte);
      }
    dp.all_to_all(std::span<const uint8_t>(send), std::span<uint8_t>(recv));
    dp.all_to_all(std::span<const float>(out_scale), std::span<float>(in_scale));
    // Server: per tensor, the mean of the P decoded chunks (rank order), compressed again
    // with the server residual.
    const int me = dp.group_rank();
    std::vector<float> mean(static_cast<size_t>(served_)), my_scale(T);
    const float inv = 1.0f / float(P_);
    for (size_t t = 0; t < T; t++) {
      const Segment& g = segs_[t];
      float* m = mean.data() + g.served;
      std::fill(m, m + g.len(me), 0.0f);
      for (int i = 0; i < P_; i++) {
        const float s = in_scale[size_t(i) * T + t];
        const uint8_t* bits = recv.data() + i * bytes_ + g.byte;
        for (int64_t k = 0; k < g.len(me); k++) m[k] += s * sign_of(bits, k);
      }
      for (int64_t k = 0; k < g.len(me); k++) m[k] *= inv;
      my_scale[t] = encode(m, server_.data() + g.served, g.len(me), send.data() + g.byte);
    }
    // Every rank decodes every served chunk from the same bits and scales.
    dp.all_gather(std::span<const uint8_t>(send.data(), size_t(bytes_)), std::span<uint8_t>(recv));
    dp.all_gather(std::span<const float>(my_scale), std::span<float>(in_scale));
    for (int j = 0; j < P_; j++)
      for (size_t t = 0; t < T; t++) {
        const Segment& g = segs_[t];
        const float s = in_scale[size_t(j) * T + t];
        const uint8_t* bits = recv.data() + j * bytes_ + g.byte;
        float* out = x.data() + g.at + j * g.chunk;
        for (int64_t k = 0; k < g.len(j); k++) out[k] = s * sign_of(bits, k);
      }
  }

  std::vector<CompressorState> state() override { return {{"worker_error", &worker_}, {"server_error", &server_}}; }

 private:
  struct Segment {
    int64_t at, numel;  // the tensor's place in the bucket
    int64_t chunk;      // L_t
    int64_t byte;       // its bits' offset in a message
    int64_t served;     // its served chunk's offset in server_
    int64_t len(int j) const { return std::clamp<int64_t>(numel - j * chunk, 0, chunk); }
  };
  int P_;
  std::vector<Segment> segs_;
  int64_t bytes_ = 0, served_ = 0;  // a message's bytes of signs; server_'s floats
  std::vector<float> worker_, server_;
};

}  // namespace

std::unique_ptr<BucketCompressor> make_onebit(const Bucket& bucket, const std::vector<ParamSpec>& specs, int dp) {
  return std::make_unique<OneBit>(bucket, specs, dp);
}

}  // namespace loom::parallel
