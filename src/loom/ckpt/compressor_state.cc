// Note [Compressor state in checkpoints] (compressor_state.h).
#include "loom/ckpt/compressor_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/ckpt/shard_format.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"

namespace loom {

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'C', 'M', 'P', 'R'};
constexpr int64_t kMaxName = 256;

template <typename T>
void put(std::ofstream& f, const T& v) {
  f.write(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
T get(std::ifstream& f, const std::string& path, const char* what) {
  T v{};
  if (!f.read(reinterpret_cast<char*>(&v), sizeof v))
    throw Error("checkpoint: '" + path + "' ends inside " + what + " (truncated)");
  return v;
}

}  // namespace

std::string compressor_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "compress-%05d.bin", rank);
  return name;
}

void write_compressor_file(const std::string& dir, int rank, const std::vector<NamedBuffer>& buffers) {
  const std::string path = (std::filesystem::path(dir) / compressor_file_name(rank)).string();
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(kMagic, sizeof kMagic);
    put(f, int64_t(buffers.size()));
    for (const NamedBuffer& b : buffers) {
      put(f, int64_t(b.name.size()));
      f.write(b.name.data(), std::streamsize(b.name.size()));
      put(f, int64_t(b.data->size()));
      put(f, shard::crc_of(b.data->data(), b.data->size()));
      f.write(reinterpret_cast<const char*>(b.data->data()), std::streamsize(b.data->size() * sizeof(float)));
    }
    if (!f.flush()) throw Error("checkpoint: cannot write '" + path + "' (disk full?)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  const bool synced = fd >= 0 && ::fsync(fd) == 0;
  if (fd >= 0) ::close(fd);
  if (!synced) throw Error("checkpoint: fsync of '" + path + "' failed");
}

void read_compressor_file(const std::string& dir, int rank, const std::vector<NamedBuffer>& buffers) {
  const std::string path = (std::filesystem::path(dir) / compressor_file_name(rank)).string();
  if (owned::kind_of(path) != owned::Kind::kNone) owned::require_regular(path);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("checkpoint: '" + path + "' is missing: the manifest says this rank saved compressor state");
  char magic[8];
  if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0)
    throw Error("checkpoint: '" + path + "' is not a loom compressor state file (bad magic)");
  const int64_t n = get<int64_t>(f, path, "the buffer count");
  if (n != int64_t(buffers.size()))
    throw Error(detail::cat("checkpoint: '", path, "' holds ", n, " compressor buffers, this run has ", buffers.size()));
  for (const NamedBuffer& b : buffers) {
    const int64_t len = get<int64_t>(f, path, "a buffer name");
    if (len < 0 || len > kMaxName) throw Error(detail::cat("checkpoint: '", path, "': a buffer name of ", len, " bytes"));
    std::string name(size_t(len), '\0');
    if (!f.read(name.data(), len)) throw Error("checkpoint: '" + path + "' ends inside a buffer name (truncated)");
    const int64_t count = get<int64_t>(f, path, "a buffer size");
    const uint32_t crc = get<uint32_t>(f, path, "a buffer CRC");
    if (name != b.name || count != int64_t(b.data->size()))
      throw Error(detail::cat("checkpoint: '", path, "' holds '", name, "' of ", count, " floats where this run has '",
                              b.name, "' of ", b.data->size()));
    std::vector<float> data(static_cast<size_t>(count));
    if (!f.read(reinterpret_cast<char*>(data.data()), std::streamsize(count * 4)))
      throw Error("checkpoint: '" + path + "' ends inside '" + name + "' (truncated)");
    if (shard::crc_of(data.data(), data.size()) != crc)
      throw Error("checkpoint: '" + path + "': '" + name + "' fails its CRC-32 (the file is damaged)");
    *b.data = std::move(data);
  }
}

}  // namespace loom
