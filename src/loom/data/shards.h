// Token shards: what `loom data prepare` writes and the loader memory-maps.
//
// Note [Token shard format] (version 1, little-endian):
//   header, 256 bytes: magic "LOOMTOKS", u32 version = 1, u32 token_bytes (2 or 4),
//     u64 token_count, u64 doc_count, u64 vocab_size, i64 end_of_document (-1: none),
//     u32 crc32 of the body, u32 crc32 of bytes [0, 52) of the header, then zeros;
//     followed by a 64-byte tokenizer description (kind, NUL-padded) at offset 64;
//   body: token_count tokens (uint16 when the vocabulary fits, else uint32), then
//     doc_count u64 document start offsets (ascending, the first 0).
// A document is its tokens followed by end_of_document when the tokenizer has one. llm.c's
// shards (magic 20240520; 256 int32 header; version 1 uint16, version 2 uint32 tokens;
// documents start at each end-of-text token) are read as well, so existing shards serve.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace loom::data {

struct ShardHeader {
  int token_bytes = 2;  // 2 or 4
  uint64_t token_count = 0, doc_count = 0, vocab_size = 0;
  int64_t end_of_document = -1;
  std::string tokenizer;  // kind, <= 63 bytes
  std::string format = "loom";  // "loom" | "llm.c"
};

// Writes one shard atomically (tmp + fsync + rename): tokens and document starts.
// Throws loom::Error when a token does not fit the vocabulary or the offsets are not
// ascending from 0.
void write_shard(const std::string& path, const ShardHeader& h, std::span<const uint32_t> tokens,
                 std::span<const uint64_t> doc_starts);
// The same from uint16 tokens (h.token_bytes = 2), as `data prepare` keeps them.
void write_shard(const std::string& path, const ShardHeader& h, std::span<const uint16_t> tokens,
                 std::span<const uint64_t> doc_starts);

// A read-only, memory-mapped shard. Opening checks the header, the sizes against the file
// length, the CRCs (loom format) and that every token is below vocab_size; a failure names
// the file, the byte offset and what was expected.
class Shard {
 public:
  explicit Shard(const std::string& path);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const ShardHeader& header() const { return h_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return h_.token_count; }
  uint32_t token(uint64_t i) const {
    return h_.token_bytes == 2 ? uint32_t(reinterpret_cast<const uint16_t*>(tokens_)[i])
                               : reinterpret_cast<const uint32_t*>(tokens_)[i];
  }
  // Document start offsets (loom: stored; llm.c: each end-of-text token, found at open).
  const std::vector<uint64_t>& doc_starts() const { return docs_; }

 private:
  void open_loom(const uint8_t* p, uint64_t n);
  void open_llmc(const uint8_t* p, uint64_t n);
  std::string path_;
  ShardHeader h_;
  void* map_ = nullptr;
  uint64_t map_len_ = 0;
  const uint8_t* tokens_ = nullptr;
  std::vector<uint64_t> docs_;
};

// The shards of a directory (*.bin, sorted by name) or one file. Throws naming the path
// when there are none or they disagree on the tokenizer or vocabulary.
std::vector<std::unique_ptr<Shard>> open_shards(const std::string& path);

}  // namespace loom::data
