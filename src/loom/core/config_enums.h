// The enum-valued keys outside [parallel] (train.device, train.precision, train.gemm_format, optim.name,
// optim.moments, comm.grad_dtype / param_dtype / p2p_dtype, offload.optimizer / params /
// grads, ps.mode; parallel.cp_mode / cp_split): parsed once from their text when a config is read, printed back as
// written. Nothing outside core/ compares their text (issue 52).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class Device { kCpu, kCuda };                // "cpu" | "cuda"
enum class Precision { kFp32, kBf16, kFp16 };     // "fp32" | "bf16" | "fp16"
enum class OptimizerKind { kAdamW, kSgd };        // "adamw" | "sgd"
enum class FloatFormat { kFp32, kBf16 };          // "fp32" | "bf16": stored moments, wire payloads
enum class OffloadTier { kNone, kDisk };          // "none" | "disk"
enum class PsMode { kSync, kAsync, kSsp };        // "sync" | "async" | "ssp"
// The format of the transformer blocks' linear-layer GEMMs: bf16 (or fp16), fp8 with
// per-tensor delayed scaling (Transformer Engine's recipe), fp8 with per-tensor current
// scaling (an amax pass before each cast), MXFP8 (one E8M0 scale per 32 values, Blackwell),
// or NVFP4 (4-bit values, one E4M3 scale per 16 and an fp32 scale per tensor, Blackwell).
// The simulator prices all five (Note [fp8 GEMMs], Note [NVFP4 GEMMs] in sim/costs.cc);
// loom's engine runs bf16, and fp8 on the GPU (Note [CUDA fp8 linear layers]).
enum class GemmFormat { kBf16, kFp8, kFp8Current, kMxfp8, kNvfp4 };  // "bf16" | "fp8" | "fp8-current" | "mxfp8" | "nvfp4"
// parallel.cp_mode / cp_split (Note [Context-parallel attention], Note [Context-parallel
// chunks] in rank/cp_chunks.h).
enum class CpMode { kAllGather, kRing, kUlysses };  // "allgather" | "ring" | "ulysses"
enum class CpSplit { kZigZag, kPlain };              // "zigzag" | "plain"
// Equal chunks a sequence splits into over cp ranks: two a rank zig-zagged, one plain
// (Note [Context-parallel chunks] in rank/cp_chunks.h).
inline int64_t cp_pieces(int64_t cp, CpSplit s) { return s == CpSplit::kZigZag ? 2 * cp : cp; }

// train.loss_scale (Note [Dynamic loss scaling]) is text: a word or a number. Its kind, for
// text the config check accepted: "auto", "dynamic", "none", else a static scale.
enum class LossScaleKind { kAuto, kDynamic, kNone, kStatic };
LossScaleKind loss_scale_kind(const std::string& text);

const char* name_of(Device d);
const char* name_of(Precision p);
const char* name_of(OptimizerKind o);
const char* name_of(FloatFormat f);
const char* name_of(OffloadTier t);
const char* name_of(PsMode m);
const char* name_of(GemmFormat f);
const char* name_of(CpMode m);
const char* name_of(CpSplit s);

// Each throws ConfigError "<key> = '<text>': expected a, b or c" for any other text.
Device parse_device(const std::string& key, const std::string& text);
Precision parse_precision(const std::string& key, const std::string& text);
GemmFormat parse_gemm_format(const std::string& key, const std::string& text);
OptimizerKind parse_optimizer(const std::string& key, const std::string& text);
// `what`, when given, follows the choices in parentheses.
FloatFormat parse_float_format(const std::string& key, const std::string& text, const std::string& what = "");
OffloadTier parse_offload_tier(const std::string& key, const std::string& text);
PsMode parse_ps_mode(const std::string& key, const std::string& text);
CpMode parse_cp_mode(const std::string& key, const std::string& text);
CpSplit parse_cp_split(const std::string& key, const std::string& text);

}  // namespace loom
