// Gradient compressors' state in sharded checkpoints (Note [Compressor state in checkpoints]).
#pragma once

#include <string>
#include <vector>

namespace loom {

// Note [Compressor state in checkpoints]
// Error feedback residuals, DGC's momentum and PowerSGD's warm-started Q (Note [Gradient
// compressors]) belong to one rank, one bucket plan and one compressor: they are saved
// beside the rank's shard as compress-RRRRR.bin (magic LOOMCMPR, the buffer count, then
// per buffer its name, float count, CRC-32 and floats) and the manifest records the
// signature they were made under (compressor and its parameters, layout, bucket cap).
// A resume with the same signature reads them back, so it continues bit for bit; any other
// layout or compressor starts them at zero and says so: a residual is what one rank's
// gradient has not yet sent, and summing or splitting it over another dp group's ranks
// and buckets has no meaning the algorithms define.
struct NamedBuffer {
  std::string name;           // "bucket 3 residual"
  std::vector<float>* data;   // sized by the compressor; load fills it in place
};

std::string compressor_file_name(int rank);  // "compress-00003.bin"
// Writes `buffers` to dir/compressor_file_name(rank) and fsyncs it. Throws loom::Error.
void write_compressor_file(const std::string& dir, int rank, const std::vector<NamedBuffer>& buffers);
// Fills `buffers` from that file. Throws loom::Error naming the file and the buffer when it
// is missing, damaged (CRC) or holds other names or sizes.
void read_compressor_file(const std::string& dir, int rank, const std::vector<NamedBuffer>& buffers);

}  // namespace loom
