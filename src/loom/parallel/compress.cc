// Note [Gradient compressors] (compress.h): the spec, top-k and TernGrad. PowerSGD is in
// powersgd.cc.
#include "loom/parallel/compress.h"

#include <algorithm>
#include <cmath>

#include "loom/core/error.h"

namespace loom::parallel {

std::unique_ptr<BucketCompressor> make_powersgd(const CompressSpec& spec, const Bucket& bucket, uint64_t key,
                                                const std::vector<ParamSpec>& specs);
std::unique_ptr<BucketCompressor> make_adasum(const Bucket& bucket, const std::vector<ParamSpec>& specs);
std::unique_ptr<BucketCompressor> make_onebit(const Bucket& bucket, const std::vector<ParamSpec>& specs, int dp);

namespace {

// DGC top-k with error feedback (and optional momentum correction).
class TopK final : public BucketCompressor {
 public:
  static int64_t k_of(double ratio, int64_t count) {
    return std::clamp<int64_t>(int64_t(std::ceil(ratio * double(count))), 1, count);
  }
  TopK(const CompressSpec& spec, int64_t count)
      : momentum_(float(spec.momentum)), k_light_(k_of(spec.ratio, count)), k_heavy_(k_of(spec.heavy_ratio, count)),
        k_(k_light_), v_(size_t(count), 0.0f), u_(spec.momentum > 0 ? size_t(count) : 0, 0.0f) {
    LOOM_CHECK(count < (int64_t{1} << 31), "top-k indexes a bucket with int32; bucket of ", count,
               " floats: lower parallel.bucket_mb");
  }

  void reduce(comm::Group& dp, std::span<float> g, int64_t) override {
    const int64_t n = int64_t(g.size());
    LOOM_ASSERT(n == int64_t(v_.size()));
    if (u_.empty()) {
      for (int64_t i = 0; i < n; i++) v_[size_t(i)] += g[size_t(i)];
    } else {  // DGC's momentum correction: u <- m u + g; v <- v + u
      for (int64_t i = 0; i < n; i++) {
        u_[size_t(i)] = momentum_ * u_[size_t(i)] + g[size_t(i)];
        v_[size_t(i)] += u_[size_t(i)];
      }
    }
    select();
    std::vector<float> values(static_cast<size_t>(k_));
    for (int64_t j = 0; j < k_; j++) {
      const size_t i = size_t(index_[size_t(j)]);
      values[size_t(j)] = v_[i];
      v_[i] = 0.0f;  // sent: the residual keeps the rest (sent + new v == old v + g, exactly)
      if (!u_.empty()) u_[i] = 0.0f;  // DGC's momentum factor masking
    }
    const int P = dp.size();
    std::vector<int32_t> all_index(size_t(k_ * P));
    std::vector<float> all_values(size_t(k_ * P));
    dp.all_gather(std::span<const int32_t>(index_), std::span<int32_t>(all_index));
    dp.all_gather(std::span<const float>(values), std::span<float>(all_values));
    std::fill(g.begin(), g.end(), 0.0f);
    for (size_t j = 0; j < all_index.size(); j++) g[size_t(all_index[j])] += all_values[j];  // rank order
    const float inv = 1.0f / float(P);
    for (float& x : g) x *= inv;
  }

  std::vector<CompressorState> state() override {
    std::vector<CompressorState> s = {{"residual", &v_}};
    if (!u_.empty()) s.push_back({"momentum", &u_});
    return s;
  }

 private:
  // index_ = the k_ entries of largest |v| (NaN counts as largest, so a non-finite
  // gradient reaches the optimizer's check), ties broken by lower index; ascending.
  //
  // Note [Top-k by a sampled threshold]
  // A full nth_element over the bucket (30M floats for config B's one bucket) cost ~18% of a
  // top-k step. Instead: t0 = a magnitude that a strided sample of kSample entries says at
  // least ~2k entries reach; one pass keeps the candidates (every entry with |v| >= t0, in
  // index order); if they are fewer than k, t0 drops (a deeper sample rank, at last -inf).
  // The k-th largest of the candidates is then the k-th largest of all (whatever is left out
  // is below t0, which the k-th largest candidate is not), and every entry above or tied
  // with it is a candidate, so the selection below - same threshold, same ties by index - is
  // exactly the full sort's, bit for bit. Deterministic: the sample is fixed by n alone.
  void select() {
    static constexpr int64_t kSample = int64_t(1) << 14;
    auto key = [](float x) { return std::isnan(x) ? INFINITY : std::fabs(x); };
    const int64_t n = int64_t(v_.size()), s = std::min(n, kSample), stride = n / s;
    std::vector<float>& sample = mags_;
    sample.resize(size_t(s));
    for (int64_t j = 0; j < s; j++) sample[size_t(j)] = key(v_[size_t(j * stride)]);
    std::sort(sample.begin(), sample.end(), std::greater<float>());
    int64_t rank = std::min(s - 1, 2 * (k_ * s + n - 1) / n + 8);  // ~2k entries expected at or above
    for (;;) {
      const float t0 = rank >= s - 1 ? -INFINITY : sample[size_t(rank)];
      cand_.clear();
      for (int64_t i = 0; i < n; i++)
        if (key(v_[size_t(i)]) >= t0) cand_.push_back(int32_t(i));
      if (int64_t(cand_.size()) >= k_) break;
      LOOM_ASSERT(t0 != -INFINITY);
      rank = std::min(s - 1, 4 * rank);
    }
    sample.resize(cand_.size());
    for (size_t j = 0; j < cand_.size(); j++) sample[j] = key(v_[size_t(cand_[j])]);
    std::nth_element(sample.begin(), sample.begin() + (k_ - 1), sample.end(), std::greater<float>());
    const float threshold = sample[size_t(k_ - 1)];
    int64_t above = 0;
    for (const int32_t i : cand_) above += key(v_[size_t(i)]) > threshold;
    int64_t ties = k_ - above;  // entries equal to the threshold still to take
    index_.clear();
    for (const int32_t i : cand_) {
      const float m = key(v_[size_t(i)]);
      if (m > threshold || (m == threshold && ties-- > 0)) index_.push_back(i);
    }
    LOOM_ASSERT(int64_t(index_.size()) == k_);
  }

  void on_setting(bool heavy) override { k_ = heavy ? k_heavy_ : k_light_; }

  float momentum_;
  int64_t k_light_, k_heavy_, k_;
  std::vector<float> v_, u_, mags_;
  std::vector<int32_t> index_, cand_;
};

// splitmix64 (Steele, Lea, Flood 2014): the finaliser of a counter-based stream.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// TernGrad: stochastic ternary values with one scale shared by the dp group.
class TernGrad final : public BucketCompressor {
 public:
  static constexpr double kClipSigmas = 2.5;  // TernGrad's gradient clipping at c = 2.5
  TernGrad(const CompressSpec& spec, uint64_t key) : seed_(spec.seed), key_(key) {}

  void reduce(comm::Group& dp, std::span<float> g, int64_t step) override {
    const int64_t n = int64_t(g.size());
    clip(g);
    float s[1] = {0.0f};
    for (float x : g) s[0] = std::max(s[0], std::fabs(x));
    // A non-finite gradient on any rank must reach every rank's optimizer check: +inf
    // survives a max whichever order the ranks' values meet in (a NaN need not).
    if (std::any_of(g.begin(), g.end(), [](float x) { return !std::isfinite(x); })) s[0] = INFINITY;
    dp.all_reduce(std::span<float>(s, 1), comm::ReduceOp::kMax);
    const int P = dp.size();
    if (!std::isfinite(s[0]) || s[0] == 0.0f) {  // every rank sees the same s
      std::fill(g.begin(), g.end(), s[0] == 0.0f ? 0.0f : NAN);
      return;
    }
    // t_i in {-1, 0, 1}, as int8 (the sums fit: |sum| <= dp <= 127).
    std::vector<int8_t> t(size_t(n), 0);
    const uint64_t stream = mix(seed_ ^ mix(uint64_t(step) ^ mix(key_ ^ mix(uint64_t(dp.group_rank())))));
    for (int64_t i = 0; i < n; i++) {
      const float p = std::fabs(g[size_t(i)]) / s[0];
      const float u = float(mix(stream + uint64_t(i)) >> 40) * 0x1p-24f;  // uniform in [0, 1)
      if (u < p) t[size_t(i)] = g[size_t(i)] > 0 ? 1 : -1;
    }
    if (terngrad_gathers(P)) gather_sums(dp, t);
    else dp.all_reduce(std::span<int8_t>(t), comm::ReduceOp::kSum);  // exact integer sums
    const float unit = s[0] / float(P);  // one rounding; the integer sums are exact
    for (int64_t i = 0; i < n; i++) g[size_t(i)] = float(t[size_t(i)]) * unit;
  }

 private:
  // t <- the sum over ranks of every rank's t, sent as 2-bit codes (0, +1, -1) in one
  // all-gather and summed in rank order.
  static void gather_sums(comm::Group& dp, std::vector<int8_t>& t) {
    const int64_t n = int64_t(t.size()), nb = (n + 3) / 4, P = dp.size();
    std::vector<uint8_t> packed(size_t(nb), 0), all(size_t(nb * P));
    for (int64_t i = 0; i < n; i++)
      if (t[size_t(i)] != 0) packed[size_t(i / 4)] |= uint8_t((t[size_t(i)] > 0 ? 1 : 2) << (2 * (i % 4)));
    dp.all_gather(std::span<const uint8_t>(packed), std::span<uint8_t>(all));
    for (int64_t i = 0; i < n; i++) {
      int sum = 0;
      for (int64_t r = 0; r < P; r++) {
        const int code = (all[size_t(r * nb + i / 4)] >> (2 * (i % 4))) & 3;
        sum += code == 1 ? 1 : code == 2 ? -1 : 0;
      }
      t[size_t(i)] = int8_t(sum);
    }
  }

  // g <- clamp(g, -c sigma, c sigma), sigma the bucket's standard deviation (fp64).
  static void clip(std::span<float> g) {
    double s1 = 0, s2 = 0;
    for (float x : g) s1 += x, s2 += double(x) * x;
    const double n = double(g.size()), mean = s1 / n;
    const double sigma = std::sqrt(std::max(0.0, s2 / n - mean * mean));
    if (!(sigma > 0) || !std::isfinite(sigma)) return;
    const float c = float(kClipSigmas * sigma);
    for (float& x : g) x = std::clamp(x, -c, c);
  }

  uint64_t seed_, key_;
};

}  // namespace

comm::Compression ring_codec(const CompressSpec& spec) {
  const CompressKind kind = spec.kind;
  return kind == CompressKind::kBf16 ? comm::Compression::kBF16
         : kind == CompressKind::kInt8 ? comm::Compression::kInt8
                                       : comm::Compression::kNone;
}

std::unique_ptr<BucketCompressor> make_compressor(const CompressSpec& spec, const Bucket& bucket,
                                                  const std::vector<ParamSpec>& specs, int dp) {
  uint64_t key = 0xcbf29ce484222325ull;  // FNV-1a of the first tensor's name
  for (char ch : specs[size_t(bucket.first_tensor)].name) key = (key ^ uint8_t(ch)) * 0x100000001b3ull;
  std::unique_ptr<BucketCompressor> c;
  if (spec.adasum) {
    LOOM_CHECK(spec.kind == CompressKind::kNone, "parallel.reduce = adasum with parallel.compress = ",
               compress_name(spec.kind), ": Adasum combines exact gradients");
    c = make_adasum(bucket, specs);
    c->traffic_[0] = c->traffic_[1] = adasum_traffic(bucket.first_tensor, bucket.last_tensor, bucket.count, dp);
    c->dp_ = dp;
    return c;
  }
  switch (spec.kind) {
    case CompressKind::kTopK:
    case CompressKind::kTopKAdam: c = std::make_unique<TopK>(spec, bucket.count); break;  // Note [Top-k Adam]
    case CompressKind::kTernGrad: c = std::make_unique<TernGrad>(spec, key); break;
    case CompressKind::kPowerSgd: c = make_powersgd(spec, bucket, key, specs); break;
    case CompressKind::kOneBitAdam:
    case CompressKind::kZeroOneAdam: c = make_onebit(bucket, specs, dp); break;
    default: LOOM_CHECK(false, "parallel.compress = ", compress_name(spec.kind), " has no bucket compressor");
  }
  c->traffic_[0] = bucket_traffic(spec.kind, spec.ratio, spec.rank, specs, bucket.first_tensor, bucket.last_tensor,
                                  bucket.count, dp);
  c->traffic_[1] = spec.accordion ? bucket_traffic(spec.kind, spec.heavy_ratio, spec.heavy_rank, specs,
                                                   bucket.first_tensor, bucket.last_tensor, bucket.count, dp)
                                  : c->traffic_[0];
  c->dp_ = dp;
  return c;
}

}  // namespace loom::parallel
