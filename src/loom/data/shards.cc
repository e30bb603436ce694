#include "loom/data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace fs = std::filesystem;

namespace loom::data {

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', 'S'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 256;
constexpr int32_t kLlmcMagic = 20240520;

template <typename T>
void put(std::string& s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* p, size_t at) {
  T v;
  std::memcpy(&v, p + at, sizeof v);
  return v;
}
uint32_t crc(const uint8_t* p, uint64_t n) { return crc32_of(p, size_t(n)); }

}  // namespace

namespace {

// Streams the shard to disk in blocks (the body's CRC computed as it goes, then patched into
// the header), so writing holds no second copy of the tokens: `data prepare` of one huge
// document stays within a few bytes per input byte (issue 59).
template <typename Token>
void write_shard_impl(const std::string& path, const ShardHeader& h, std::span<const Token> tokens,
                      std::span<const uint64_t> doc_starts) {
  LOOM_CHECK(h.token_bytes == 2 || h.token_bytes == 4, "shard token width ", h.token_bytes, " is not 2 or 4 bytes");
  LOOM_CHECK(h.token_bytes == 4 || h.vocab_size <= 65536, "a vocabulary of ", h.vocab_size,
             " does not fit uint16 tokens");
  LOOM_CHECK(h.tokenizer.size() < 64, "tokenizer description '", h.tokenizer, "' is over 63 bytes");
  for (size_t i = 0; i < doc_starts.size(); i++)
    LOOM_CHECK((i == 0 ? doc_starts[i] == 0 : doc_starts[i] > doc_starts[i - 1]) && doc_starts[i] < tokens.size(),
               "document start ", doc_starts[i], " (document ", i, ") of shard '", path, "' is out of order");
  std::string head(kHeaderBytes, '\0');
  std::memcpy(head.data(), kMagic, 8);
  put(head, 8, kVersion);
  put(head, 12, uint32_t(h.token_bytes));
  put(head, 16, uint64_t(tokens.size()));
  put(head, 24, uint64_t(doc_starts.size()));
  put(head, 32, h.vocab_size);
  put(head, 40, h.end_of_document);
  std::memcpy(head.data() + 64, h.tokenizer.data(), h.tokenizer.size());
  AtomicWriter out(path);
  out.write(head.data(), head.size());  // CRCs patched below
  uLong body_crc = crc32(0L, Z_NULL, 0);
  std::vector<uint8_t> block(size_t(1) << 20);
  const size_t per_block = block.size() / size_t(h.token_bytes);
  for (size_t at = 0; at < tokens.size(); at += per_block) {
    const size_t n = std::min(per_block, tokens.size() - at);
    for (size_t i = 0; i < n; i++) {
      const uint32_t t = tokens[at + i];
      LOOM_CHECK(t < h.vocab_size, "token ", t, " at ", at + i, " is outside the vocabulary of ", h.vocab_size);
      if (h.token_bytes == 2) {
        const uint16_t v = uint16_t(t);
        std::memcpy(block.data() + 2 * i, &v, 2);
      } else {
        std::memcpy(block.data() + 4 * i, &t, 4);
      }
    }
    body_crc = crc32(body_crc, block.data(), uInt(n * size_t(h.token_bytes)));
    out.write(block.data(), n * size_t(h.token_bytes));
  }
  const auto* starts = reinterpret_cast<const uint8_t*>(doc_starts.data());
  body_crc = crc32(body_crc, starts, uInt(doc_starts.size() * 8));
  out.write(starts, doc_starts.size() * 8);
  put(head, 48, uint32_t(body_crc));
  put(head, 52, crc(reinterpret_cast<const uint8_t*>(head.data()), 52));
  out.write_at(48, head.data() + 48, 8);
  out.commit();
}

}  // namespace

void write_shard(const std::string& path, const ShardHeader& h, std::span<const uint32_t> tokens,
                 std::span<const uint64_t> doc_starts) {
  write_shard_impl(path, h, tokens, doc_starts);
}

void write_shard(const std::string& path, const ShardHeader& h, std::span<const uint16_t> tokens,
                 std::span<const uint64_t> doc_starts) {
  write_shard_impl(path, h, tokens, doc_starts);
}

Shard::Shard(const std::string& path) : path_(path) {
  // Without blocking: a FIFO or device in a shard's place is refused, not waited on.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open shard '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("shard '" + path + "' is not a regular file (a FIFO, socket or device); give shard files");
  }
  map_len_ = uint64_t(st.st_size);
  if (map_len_ < kHeaderBytes) {
    ::close(fd);
    throw Error("shard '" + path + "' is " + std::to_string(map_len_) + " bytes, shorter than its 256-byte header");
  }
  map_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw Error("cannot map shard '" + path + "': " + std::strerror(errno));
  }
  const auto* p = static_cast<const uint8_t*>(map_);
  try {
    if (std::memcmp(p, kMagic, 8) == 0) open_loom(p, map_len_);
    else if (get<int32_t>(p, 0) == kLlmcMagic) open_llmc(p, map_len_);
    else throw Error("'" + path + "' is not a token shard: its first bytes are neither \"LOOMTOKS\" nor llm.c's magic 20240520");
  } catch (...) {
    ::munmap(map_, map_len_);
    map_ = nullptr;
    throw;
  }
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_len_);
}

void Shard::open_loom(const uint8_t* p, uint64_t n) {
  const std::string at = "shard '" + path_ + "'";
  LOOM_CHECK(get<uint32_t>(p, 52) == crc(p, 52), at, ": header CRC mismatch (bytes 0-51 are damaged)");
  const uint32_t version = get<uint32_t>(p, 8);
  LOOM_CHECK(version == kVersion, at, " has format version ", version, "; this loom reads version ", kVersion,
             " (re-run loom data prepare)");
  h_.token_bytes = int(get<uint32_t>(p, 12));
  h_.token_count = get<uint64_t>(p, 16);
  h_.doc_count = get<uint64_t>(p, 24);
  h_.vocab_size = get<uint64_t>(p, 32);
  h_.end_of_document = get<int64_t>(p, 40);
  h_.tokenizer.assign(reinterpret_cast<const char*>(p + 64), strnlen(reinterpret_cast<const char*>(p + 64), 63));
  LOOM_CHECK(h_.token_bytes == 2 || h_.token_bytes == 4, at, ": token width ", h_.token_bytes, " at byte 12 is not 2 or 4");
  // -1 (none) or a token of the vocabulary: a wider value would be cut to 32 bits where
  // tokens are compared (issue 59 finding 16).
  LOOM_CHECK(h_.end_of_document == -1 || (h_.end_of_document >= 0 && uint64_t(h_.end_of_document) < h_.vocab_size),
             at, ": end_of_document ", h_.end_of_document, " at byte 40 is neither -1 (none) nor a token of the "
             "vocabulary of ", h_.vocab_size);
  LOOM_CHECK(h_.token_count < (uint64_t(1) << 40) && h_.doc_count <= h_.token_count, at, ": header counts ",
             h_.token_count, " tokens, ", h_.doc_count, " documents are impossible");
  const uint64_t want = kHeaderBytes + h_.token_count * uint64_t(h_.token_bytes) + h_.doc_count * 8;
  LOOM_CHECK(n == want, at, " is ", n, " bytes but its header describes ", want, " (", h_.token_count, " tokens of ",
             h_.token_bytes, " bytes + ", h_.doc_count, " document offsets): the file is ",
             n < want ? "truncated" : "longer than written");
  LOOM_CHECK(get<uint32_t>(p, 48) == crc(p + kHeaderBytes, n - kHeaderBytes), at,
             ": body CRC mismatch (the tokens or document offsets are damaged)");
  tokens_ = p + kHeaderBytes;
  docs_.resize(h_.doc_count);
  std::memcpy(docs_.data(), tokens_ + h_.token_count * uint64_t(h_.token_bytes), h_.doc_count * 8);
  for (uint64_t i = 0; i < h_.doc_count; i++)
    LOOM_CHECK((i == 0 ? docs_[i] == 0 : docs_[i] > docs_[i - 1]) && docs_[i] < h_.token_count, at,
               ": document offset ", i, " = ", docs_[i], " is out of order or past the tokens");
  for (uint64_t i = 0; i < h_.token_count; i++)
    LOOM_CHECK(token(i) < h_.vocab_size, at, ": token ", token(i), " at byte ", kHeaderBytes + i * h_.token_bytes,
               " is outside the vocabulary of ", h_.vocab_size);
}

// llm.c (dev/data/data_common.py): int32 header[256] = {20240520, version, token_count, 0...};
// version 1: uint16 GPT-2 tokens, version 2: uint32 Llama 3 tokens. No vocabulary size is
// stored, so the largest token + 1 stands for it (the model's vocab must cover it).
void Shard::open_llmc(const uint8_t* p, uint64_t n) {
  const std::string at = "llm.c shard '" + path_ + "'";
  const int32_t version = get<int32_t>(p, 4);
  LOOM_CHECK(version == 1 || version == 2, at, ": version ", version, " at byte 4 is not 1 (uint16) or 2 (uint32)");
  h_.format = "llm.c";
  h_.token_bytes = version == 1 ? 2 : 4;
  const int64_t count = get<int32_t>(p, 8);
  LOOM_CHECK(count >= 0, at, ": token count ", count, " at byte 8 is negative");
  h_.token_count = uint64_t(count);
  const uint64_t want = kHeaderBytes * 4 + h_.token_count * uint64_t(h_.token_bytes);
  LOOM_CHECK(n == want, at, " is ", n, " bytes but its header describes ", want, " (", count, " tokens): the file is ",
             n < want ? "truncated" : "longer than written");
  tokens_ = p + kHeaderBytes * 4;
  h_.end_of_document = version == 1 ? 50256 : 128000;  // GPT-2 <|endoftext|>, Llama 3 <|begin_of_text|>
  h_.tokenizer = version == 1 ? "llm.c gpt2" : "llm.c llama3";
  uint32_t top = 0;
  for (uint64_t i = 0; i < h_.token_count; i++) {
    top = std::max(top, token(i));
    if (token(i) == uint32_t(h_.end_of_document)) docs_.push_back(i);
  }
  if (docs_.empty() || docs_[0] != 0) docs_.insert(docs_.begin(), 0);
  if (h_.token_count == 0) docs_.clear();
  h_.doc_count = docs_.size();
  h_.vocab_size = std::max<uint64_t>(version == 1 ? 50257 : 128256, uint64_t(top) + 1);
}

std::vector<std::unique_ptr<Shard>> open_shards(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file() && e.path().extension() == ".bin") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    LOOM_CHECK(!files.empty(), "shard directory '", path, "' holds no *.bin shards (write them with loom data prepare)");
  } else if (fs::exists(path, ec)) {
    files.push_back(path);  // Shard refuses anything but a regular file, naming what it is
  } else {
    throw Error("shards '" + path + "' do not exist: expected a directory of *.bin shards or one shard file");
  }
  std::vector<std::unique_ptr<Shard>> shards;
  for (const auto& f : files) {
    shards.push_back(std::make_unique<Shard>(f));
    const ShardHeader &a = shards.front()->header(), &b = shards.back()->header();
    LOOM_CHECK(a.tokenizer == b.tokenizer && a.vocab_size == b.vocab_size && a.end_of_document == b.end_of_document,
               "shards '", shards.front()->path(), "' (", a.tokenizer, ", vocab ", a.vocab_size, ") and '", f, "' (",
               b.tokenizer, ", vocab ", b.vocab_size, ") were written by different tokenizers");
  }
  return shards;
}

}  // namespace loom::data
