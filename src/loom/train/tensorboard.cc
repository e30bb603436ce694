#include "loom/train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/owned.h"

namespace loom {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0x82f63b78u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Protocol-buffer wire format: a field's key is (number << 3) | wire type.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) out.push_back(char(uint8_t(v) | 0x80)), v >>= 7;
  out.push_back(char(v));
}

template <class T>
void fixed(std::string& out, T v) {  // little-endian, as x86 stores it
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  varint(out, uint64_t(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
std::string event(int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  varint(e, 1 << 3 | 1);
  fixed(e, unix_seconds());
  varint(e, 2 << 3 | 0);
  varint(e, uint64_t(step));
  if (file_version) bytes_field(e, 3, *file_version);
  if (summary) bytes_field(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  LOOM_CHECK(!ec, "train.tensorboard = '", dir, "': cannot create the directory (", ec.message(), ")");
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(int64_t(unix_seconds())) + "." +
                                         host + "." + std::to_string(getpid()) + "." + owned::new_token().substr(0, 8)))
              .string();
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  LOOM_CHECK(fd >= 0, "train.tensorboard: cannot create '", path_, "' (", std::strerror(errno),
             "); name a directory you can write");
  f_ = ::fdopen(fd, "wb");
  LOOM_CHECK(f_ != nullptr, "train.tensorboard: cannot open '", path_, "'");
  const std::string version = "brain.Event:2";
  record(event(0, &version, nullptr));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::record(const std::string& bytes) {
  std::string r;
  fixed(r, uint64_t(bytes.size()));
  fixed(r, masked_crc(r.data(), 8));
  r += bytes;
  fixed(r, masked_crc(bytes.data(), bytes.size()));
  LOOM_CHECK(std::fwrite(r.data(), 1, r.size(), f_) == r.size() && std::fflush(f_) == 0,
             "train.tensorboard: writing '", path_, "' failed (", std::strerror(errno), ")");
}

// Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; }
void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    varint(value, 2 << 3 | 5);
    fixed(value, float(v));
    bytes_field(summary, 1, value);
  }
  record(event(step, nullptr, &summary));
}

}  // namespace loom
