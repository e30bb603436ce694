#include "loom/core/config_enums.h"

#include <initializer_list>
#include <utility>

#include "loom/core/error.h"

namespace loom {

namespace {

// The value whose name is `text`, else ConfigError listing the names ("a, b or c"), or
// `expected` when given.
template <typename E>
E parse_named(const std::string& key, const std::string& text, std::initializer_list<E> values,
              std::string expected = "") {
  const bool listed = !expected.empty();
  size_t i = 0;
  for (E v : values) {
    if (text == name_of(v)) return v;
    if (!listed) expected += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::string(name_of(v));
    ++i;
  }
  throw ConfigError(key + " = '" + text + "': expected " + expected);
}

}  // namespace

LossScaleKind loss_scale_kind(const std::string& text) {
  if (text == "auto") return LossScaleKind::kAuto;
  if (text == "dynamic") return LossScaleKind::kDynamic;
  if (text == "none") return LossScaleKind::kNone;
  return LossScaleKind::kStatic;
}

const char* name_of(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

const char* name_of(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

const char* name_of(GemmFormat f) {
  switch (f) {
    case GemmFormat::kBf16: return "bf16";
    case GemmFormat::kFp8: return "fp8";
    case GemmFormat::kFp8Current: return "fp8-current";
    case GemmFormat::kMxfp8: return "mxfp8";
    case GemmFormat::kNvfp4: return "nvfp4";
  }
  return "?";
}

const char* name_of(OptimizerKind o) { return o == OptimizerKind::kSgd ? "sgd" : "adamw"; }
const char* name_of(FloatFormat f) { return f == FloatFormat::kBf16 ? "bf16" : "fp32"; }
const char* name_of(OffloadTier t) { return t == OffloadTier::kDisk ? "disk" : "none"; }

const char* name_of(PsMode m) {
  switch (m) {
    case PsMode::kSync: return "sync";
    case PsMode::kAsync: return "async";
    case PsMode::kSsp: return "ssp";
  }
  return "?";
}

const char* name_of(CpMode m) {
  switch (m) {
    case CpMode::kAllGather: return "allgather";
    case CpMode::kRing: return "ring";
    case CpMode::kUlysses: return "ulysses";
  }
  return "?";
}

const char* name_of(CpSplit s) { return s == CpSplit::kPlain ? "plain" : "zigzag"; }

Device parse_device(const std::string& key, const std::string& text) {
  return parse_named(key, text, {Device::kCpu, Device::kCuda});
}
Precision parse_precision(const std::string& key, const std::string& text) {
  return parse_named(key, text, {Precision::kFp32, Precision::kBf16, Precision::kFp16});
}
GemmFormat parse_gemm_format(const std::string& key, const std::string& text) {
  return parse_named(key, text,
                     {GemmFormat::kBf16, GemmFormat::kFp8, GemmFormat::kFp8Current, GemmFormat::kMxfp8, GemmFormat::kNvfp4},
                     "bf16, fp8 (delayed scaling), fp8-current (current scaling), mxfp8 or nvfp4");
}
OptimizerKind parse_optimizer(const std::string& key, const std::string& text) {
  return parse_named(key, text, {OptimizerKind::kAdamW, OptimizerKind::kSgd});
}
FloatFormat parse_float_format(const std::string& key, const std::string& text, const std::string& what) {
  return parse_named(key, text, {FloatFormat::kFp32, FloatFormat::kBf16},
                     what.empty() ? "" : "fp32 or bf16 (" + what + ")");
}
OffloadTier parse_offload_tier(const std::string& key, const std::string& text) {
  return parse_named(key, text, {OffloadTier::kNone, OffloadTier::kDisk});
}
PsMode parse_ps_mode(const std::string& key, const std::string& text) {
  return parse_named(key, text, {PsMode::kSync, PsMode::kAsync, PsMode::kSsp},
                     "sync (bulk synchronous), async (each push applied on arrival) or ssp (stale synchronous, "
                     "bound ps.staleness)");
}

CpMode parse_cp_mode(const std::string& key, const std::string& text) {
  return parse_named(key, text, {CpMode::kAllGather, CpMode::kRing, CpMode::kUlysses},
                     "allgather (K and V gathered once per layer), ring (K / V blocks passed around the cp ring) or "
                     "ulysses (all-to-all to heads)");
}

CpSplit parse_cp_split(const std::string& key, const std::string& text) {
  return parse_named(key, text, {CpSplit::kZigZag, CpSplit::kPlain},
                     "zigzag (rank r: chunks r and 2 cp - 1 - r, equal causal work) or plain (one chunk each)");
}

}  // namespace loom
