// TensorBoard event files (Note [TensorBoard events]): the run's scalars as TensorBoard
// (and anything reading its format) draws them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// Note [TensorBoard events]
// train.tensorboard = DIR: the logging rank writes DIR/events.out.tfevents.<unix seconds>.
// <host>.<pid>.<random>, a new file each run (created exclusively: nothing there is replaced),
// in TensorFlow's record framing - per record the length (uint64, little-endian), the
// masked CRC-32C of those 8 bytes, the record, the masked CRC-32C of the record, where
// mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 - each record an Event message of
// tensorflow/core/util/event.proto: the first carries file_version "brain.Event:2", the
// others wall_time (1, double), step (2, int64) and a Summary (5) of Values (tag 1, string;
// simple_value 2, float). The three messages are encoded here by their field numbers (a
// dozen lines; no protobuf runtime or generated code is needed to write them); the test
// decodes them with the protobuf library and the public message definitions. Scalars: every
// step's train/loss, train/lr, train/grad_norm, train/tokens_per_s (and train/loss_scale,
// train/padding when they apply), each validation's val/loss and val/bpb, and at the end the
// run's summary figures (memory, gradient bytes on the wire, parameter-server staleness).
class TensorBoardWriter {
 public:
  // Creates `dir` when missing. Throws loom::Error naming the path and the OS reason.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One event at `step` (1-based, as the log lines count) holding `values`; flushed.
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& bytes);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `n` bytes; the framing's checksum.
uint32_t crc32c(const void* data, size_t n);

}  // namespace loom
