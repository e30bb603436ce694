// Physical memory of big buffers: returning pages to the OS and measuring what is resident.
//
// Note [Resident memory]
// ZeRO keeps only a rank's shard of some flat buffers. The buffers stay whole in address
// space (so every tensor keeps its offset); the pages of the parts a rank does not own
// are handed back with madvise(MADV_DONTNEED), which makes them read as zero until
// written again. Memory reports count resident pages with mincore(), so they measure
// what the process really holds, not what a formula says it should.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom {

// Makes [p, p + bytes) read as zero and hands its whole pages back to the OS (the partial
// pages at either end are zeroed in place).
void release_pages(void* p, int64_t bytes);
// Note [Huge pages]
// This machine's kernel backs anonymous memory with 2 MiB pages only where a process asks
// (transparent_hugepage = madvise). loom's big buffers (parameters, gradients, moments,
// activations, kernel scratch) span hundreds of MiB that the GEMMs and the optimizer walk
// cold, and on 4 KiB pages their TLB misses cost 4-7% of GPT-2 small's bf16 step (config C,
// glibc's hugetlb tunable on against off, alternating runs). advise_huge_pages asks for huge
// pages on the 2 MiB-aligned interior of a buffer of 64 MiB or more (smaller ones may sit in
// malloc's heaps, where the advice would outlive them) before its first touch; a hint: where
// the kernel has none the call does nothing. Pages handed back (release_pages) split as before.
// own_mapping: the caller saw malloc map the block for itself (malloc_mapped_bytes grew by its
// size), so the advice goes with it from 2 MiB up: config B's 60 MB stage buffers under
// parallel.pp_vocab sat on 4 KiB pages, the first stage's AdamW 3-6x slower than the last's.
void advise_huge_pages(void* p, int64_t bytes, bool own_mapping = false);
int64_t malloc_mapped_bytes();  // what malloc holds in mappings of their own (mallinfo2's hblkhd)
// v with room for n elements, advised (above) before anything touches them, then resized to n.
template <typename T>
void huge_resize(std::vector<T>& v, size_t n, const T& value = T()) {
  if (v.capacity() < n) {
    std::vector<T> fresh;
    const int64_t mapped = malloc_mapped_bytes(), bytes = int64_t(n * sizeof(T));
    fresh.reserve(n);
    advise_huge_pages(fresh.data(), bytes, malloc_mapped_bytes() - mapped >= bytes);
    fresh.assign(v.begin(), v.end());
    v.swap(fresh);
  }
  v.resize(n, value);
}

// Bytes of the whole pages of [p, p + bytes) that are resident.
int64_t resident_bytes(const void* p, int64_t bytes);
// The OS page size.
int64_t page_bytes();

// Per-category peaks of resident memory, sampled at the caller's chosen moments.
class MemoryTracker {
 public:
  int category(const std::string& name);  // index of `name`, added on first use
  void track(int category, const void* p, int64_t bytes);  // a buffer that belongs to it
  // Measures every tracked buffer now and updates the peaks.
  void sample();
  struct Row {
    std::string name;
    int64_t peak_bytes = 0, now_bytes = 0;
  };
  std::vector<Row> rows() const;
  // The largest sum over all categories at one sample (what the rank held at once).
  int64_t peak_total() const { return peak_total_; }
  // Note [Chunk manager]: buffers (inside tracked ones) whose pages an owner keeps within a
  // budget; peak_rest() is the largest sum at one sample less their resident pages - what
  // the rank held besides them, measured at every sample.
  void manage(const void* p, int64_t bytes);
  int64_t peak_rest() const { return peak_rest_; }
  // Called after every sample (traces draw memory counters from it).
  void set_listener(std::function<void(const MemoryTracker&)> fn) { listener_ = std::move(fn); }

 private:
  struct Range {
    int category;
    const void* p;
    int64_t bytes;
  };
  std::vector<std::string> names_;
  std::vector<int64_t> peak_, now_;
  int64_t peak_total_ = 0, peak_rest_ = 0;
  std::vector<Range> ranges_, managed_;
  std::function<void(const MemoryTracker&)> listener_;
};

}  // namespace loom
