// loom calibrate's offload tier (Note [Optimizer offload]): the disk under --offload-dir as
// an offload file meets it, O_DIRECT and through the page cache.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/sim/calibrate.h"

namespace loom {

namespace {

// Note [Page-cached offload]: the same requests through the page cache (a buffered file,
// written once so its pages are cached, then best of two passes each way), each block from or
// into its own buffer, so the buffers are as cold as the engine's rotating slots: the rates of
// the kernel's copies between the cache and the engine's buffers, which an offload file that
// fits in memory meets. Left 0 when the file cannot be made.
void measure_page_cache(const std::string& path, int64_t block, int64_t blocks, sim::OffloadTier& t) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return;
  ::unlink(path.c_str());
  std::vector<std::vector<char>> bufs(size_t(blocks), std::vector<char>(size_t(block), 1));
  auto pass = [&](bool write) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < blocks; b++) {
      char* buf = bufs[size_t(b)].data();
      if ((write ? ::pwrite(fd, buf, size_t(block), off_t(b * block)) : ::pread(fd, buf, size_t(block), off_t(b * block))) !=
          block)
        return 0.0;
    }
    return double(block * blocks) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (pass(true) > 0)
    for (int i = 0; i < 2; i++) t.cached_write_bw = std::max(t.cached_write_bw, pass(true)),
                                t.cached_read_bw = std::max(t.cached_read_bw, pass(false));
  ::close(fd);
  if (t.cached_read_bw <= 0 || t.cached_write_bw <= 0) t.cached_read_bw = t.cached_write_bw = 0;
}

}  // namespace

// The offload tier as an offload file on `dir` meets it (Note [Optimizer offload]): 16 MiB
// requests (the default sub-group) written then read back with O_DIRECT, so the disk's own
// rates, not the page cache's (a model that needs offload has no memory to cache its file);
// best of two passes over 128 MiB. Capacity: the file system's free bytes. No tier (zeros)
// when the directory cannot take a scratch file or O_DIRECT.
sim::OffloadTier measure_offload_tier(const std::string& dir) {
  sim::OffloadTier t;
  struct statvfs vfs;
  if (dir.empty() || ::statvfs(dir.c_str(), &vfs) != 0) return t;
  const std::string path = dir + "/loom-calibrate-" + std::to_string(::getpid()) + ".bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0) return t;
  ::unlink(path.c_str());
  constexpr int64_t kBlock = int64_t(16) << 20, kBlocks = 8;
  std::unique_ptr<void, void (*)(void*)> buf(std::aligned_alloc(4096, size_t(kBlock)), &std::free);
  std::memset(buf.get(), 1, size_t(kBlock));
  auto rate = [&](bool write) {
    double best = 0;
    for (int pass = 0; pass < 2; pass++) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t b = 0; b < kBlocks; b++)
        if ((write ? ::pwrite(fd, buf.get(), size_t(kBlock), off_t(b * kBlock))
                   : ::pread(fd, buf.get(), size_t(kBlock), off_t(b * kBlock))) != kBlock)
          return 0.0;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, double(kBlock * kBlocks) / s);
    }
    return best;
  };
  t.write_bw = rate(true);
  t.read_bw = t.write_bw > 0 ? rate(false) : 0;
  ::close(fd);
  if (t.read_bw <= 0 || t.write_bw <= 0) return {};
  t.capacity_bytes = double(vfs.f_bavail) * double(vfs.f_frsize);
  measure_page_cache(path, kBlock, kBlocks, t);
  return t;
}

}  // namespace loom
