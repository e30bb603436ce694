#include "loom/data/prepare.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <span>
#include <thread>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/data/corpus.h"
#include "loom/data/shards.h"

namespace fs = std::filesystem;

namespace loom::data {

std::string tokenizer_fingerprint(const Tokenizer& tok) {
  uLong c = crc32(0L, Z_NULL, 0);
  for (int32_t id = 0; id < tok.vocab_size(); id++) {
    std::string p;
    try {
      p = tok.piece(id);
    } catch (const Error&) {  // an id the vocabulary leaves unused
      p = "\x01unused";
    }
    p.push_back('\0');
    c = crc32(c, reinterpret_cast<const Bytef*>(p.data()), uInt(p.size()));
  }
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", unsigned(c));
  std::string kind = tok.kind();
  if (kind.size() > 40) kind.resize(40);
  return kind + " v" + std::to_string(tok.vocab_size()) + " " + buf;
}

namespace {

std::vector<std::string> input_files(const std::string& in) {
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_regular_file(in, ec)) return {in};
  LOOM_CONFIG_CHECK(fs::is_directory(in, ec), "--in '", in, "' does not exist: expected a UTF-8 text or .jsonl file, "
                    "or a directory of them");
  files = text_files_under(in);
  LOOM_CONFIG_CHECK(!files.empty(), "--in '", in, "' holds no files");
  return files;
}

// Our outputs, by content (Note [Ownership by content]): regular files named as the
// shards and the summary are, whose first bytes are the shard magic or whose JSON says it
// is this summary. A directory holding only these may be replaced with --overwrite.
bool is_ours(const fs::path& p) {
  const std::string n = p.filename().string();
  const bool shard = (n.rfind("train_", 0) == 0 || n.rfind("val_", 0) == 0) && p.extension() == ".bin";
  if ((!shard && n != "prepare.json") || owned::kind_of(p.string()) != owned::Kind::kFile) return false;
  if (shard) {
    char magic[8] = {};
    std::ifstream f(p, std::ios::binary);
    return f.read(magic, sizeof magic) && std::string(magic, sizeof magic) == "LOOMTOKS";
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(owned::read_regular(p.string(), 1 << 20, false), nullptr, false);
    return j.is_object() && j.contains("format") && j["format"] == "loom token shards";
  } catch (const Error&) {
    return false;
  }
}

void check_out_dir(const PrepareOptions& opt) {
  const owned::Kind kind = owned::kind_of(opt.out);
  if (kind == owned::Kind::kNone) return;
  LOOM_CONFIG_CHECK(kind == owned::Kind::kDir, "--out '", opt.out, "' exists and is ", owned::kind_text(kind),
                    ", not a directory: give a new or empty directory (nothing there was touched)");
  std::error_code ec;
  std::vector<std::string> foreign;
  bool any = false;
  for (const auto& e : fs::directory_iterator(opt.out, ec)) {
    any = true;
    if (!is_ours(e.path())) foreign.push_back(e.path().filename().string());
  }
  std::sort(foreign.begin(), foreign.end());
  if (!foreign.empty())
    throw ConfigError("--out '" + opt.out + "' holds files loom data prepare did not write (" + foreign.front() +
                      (foreign.size() > 1 ? " and " + std::to_string(foreign.size() - 1) + " more" : "") +
                      "): give a new or empty directory (nothing there was touched)");
  if (any && !opt.overwrite)
    throw ConfigError("--out '" + opt.out + "' holds shards of an earlier run: pass --overwrite to replace them, "
                      "or give another directory");
}

// --overwrite: removes the earlier run's files (each proven ours again) and the directory.
void remove_earlier(const std::string& out) {
  if (owned::kind_of(out) == owned::Kind::kNone) return;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (is_ours(e.path())) ::unlink(e.path().c_str());
  if (::rmdir(out.c_str()) != 0)
    throw Error("--out '" + out + "': cannot replace it (" + std::strerror(errno) +
                "); something was added there during the run");
}

// The documents of one file, as views into `text` (which the caller keeps alive).
std::vector<std::string_view> split_documents(const std::string& file, const std::string& text,
                                              const PrepareOptions& opt, std::vector<std::string>& owned) {
  std::vector<std::string_view> docs;
  const bool jsonl = fs::path(file).extension() == ".jsonl";
  if (!jsonl && opt.doc_separator.empty()) return {std::string_view(text)};
  size_t line_no = 0, start = 0;  // start: first byte of the current document (text files)
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    line_no++;
    if (jsonl) {
      if (!line.empty()) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          throw Error("'" + file + "' line " + std::to_string(line_no) + " (byte offset " + std::to_string(pos) +
                      ") is not JSON: " + e.what());
        }
        LOOM_CHECK(j.is_object() && j.contains(opt.text_field) && j[opt.text_field].is_string(), "'", file,
                   "' line ", line_no, " (byte offset ", pos, ") has no string field \"", opt.text_field,
                   "\" (choose the field with --text-field)");
        owned.push_back(j[opt.text_field].get<std::string>());
      }
    } else if (line == opt.doc_separator) {
      docs.emplace_back(text.data() + start, pos - start);
      start = std::min(end + 1, text.size());
    }
    pos = end + 1;
  }
  if (jsonl)
    for (const auto& s : owned) docs.emplace_back(s);
  else if (start < text.size())
    docs.emplace_back(text.data() + start, text.size() - start);
  return docs;
}

// Accumulates one split's documents into shards of about opt.shard_tokens tokens: a shard
// is written before a document that would take it past that (documents are never split).
// Tokens are kept as the shard stores them (uint16 for vocabularies up to 65,536).
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix, ShardHeader h, int64_t shard_tokens)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), h_(std::move(h)), shard_tokens_(uint64_t(shard_tokens)) {}
  // A document of `count` tokens starts; append() then gives them, in pieces.
  void begin_doc(uint64_t count) {
    if (size() > 0 && size() + count > shard_tokens_) flush();
    starts_.push_back(size());
  }
  void append(std::span<const int32_t> ids) {
    for (const int32_t id : ids)
      LOOM_CHECK(id >= 0 && uint64_t(id) < h_.vocab_size, "token ", id, " is outside the vocabulary of ", h_.vocab_size);
    if (h_.token_bytes == 2) narrow_.insert(narrow_.end(), ids.begin(), ids.end());
    else wide_.insert(wide_.end(), ids.begin(), ids.end());
  }
  void flush() {
    if (size() == 0) return;
    char name[32];
    std::snprintf(name, sizeof name, "%s_%05d.bin", prefix_.c_str(), shards_++);
    const std::string path = (fs::path(dir_) / name).string();
    if (h_.token_bytes == 2) write_shard(path, h_, std::span<const uint16_t>(narrow_), starts_);
    else write_shard(path, h_, std::span<const uint32_t>(wide_), starts_);
    std::vector<uint16_t>().swap(narrow_), std::vector<uint32_t>().swap(wide_);  // give the memory back
    starts_.clear();
  }
  int shards() const { return shards_; }

 private:
  uint64_t size() const { return h_.token_bytes == 2 ? narrow_.size() : wide_.size(); }
  std::string dir_, prefix_;
  ShardHeader h_;
  uint64_t shard_tokens_;
  std::vector<uint16_t> narrow_;
  std::vector<uint32_t> wide_;
  std::vector<uint64_t> starts_;
  int shards_ = 0;
};

// Encodes `docs` on `threads` threads (document i on thread i % threads); results in order.
std::vector<std::vector<int32_t>> encode_parallel(const Tokenizer& tok, std::span<const std::string_view> docs,
                                                  int threads) {
  std::vector<std::vector<int32_t>> out(docs.size());
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; t++)
    pool.emplace_back([&, t] {
      try {
        for (size_t i = size_t(t); i < docs.size(); i += size_t(threads)) out[i] = tok.encode(docs[i], Special::kPlain);
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

bool plain_ascii(char c) { return c > 0x20 && c < 0x7f; }

// Note [Document pieces]: a document longer than opt.piece_bytes is cut into pieces of
// about that size, each cut at a single space with printable ASCII on both sides, so the
// tokenizer only ever sees one piece (`data prepare` of one 47 MB document took 7.8 GB with
// SentencePiece before: issue 59). Byte-level BPE pre-tokenizers (GPT-2's, Llama 3's
// regexes) start a new pre-token at such a space, so "x y" encodes as "x" then " y"
// (kKeepSpace); SentencePiece with its dummy prefix encodes it as "x" then "y", the prefix
// standing for the space (kDropSpace). Which rule a tokenizer follows is probed on word
// pairs when prepare starts; one that follows neither encodes documents whole. data_test
// holds pieces equal to the whole document for bytes, GPT-2 BPE and SentencePiece.
enum class PieceRule { kWhole, kKeepSpace, kDropSpace };

PieceRule piece_rule(const Tokenizer& tok) {
  const std::pair<const char*, const char*> pairs[] = {{"the", "cat"}, {"Hello,", "world!"}, {"x", "42"},
                                                        {"it's", "(fine)."}, {"a", "b"}};
  auto joined = [&](std::string_view a, std::string_view b) {
    std::vector<int32_t> ids = tok.encode(a, Special::kPlain);
    const std::vector<int32_t> more = tok.encode(b, Special::kPlain);
    ids.insert(ids.end(), more.begin(), more.end());
    return ids;
  };
  bool keep = true, drop = true;
  for (const auto& [a, b] : pairs) {
    const std::vector<int32_t> whole = tok.encode(std::string(a) + " " + b, Special::kPlain);
    keep = keep && whole == joined(a, std::string(" ") + b);
    drop = drop && whole == joined(a, b);
  }
  return keep ? PieceRule::kKeepSpace : drop ? PieceRule::kDropSpace : PieceRule::kWhole;
}

std::vector<std::string_view> split_pieces(std::string_view doc, size_t piece_bytes, PieceRule rule) {
  std::vector<std::string_view> out;
  auto cut_at = [&](size_t i) { return doc[i] == ' ' && plain_ascii(doc[i - 1]) && plain_ascii(doc[i + 1]); };
  size_t start = 0;
  while (doc.size() - start > piece_bytes) {
    size_t cut = 0;
    for (size_t i = start + piece_bytes; i > start + 1 && !cut; --i)
      if (cut_at(i)) cut = i;
    for (size_t i = start + piece_bytes + 1; !cut && i + 1 < doc.size(); ++i)
      if (cut_at(i)) cut = i;
    if (!cut) break;  // no such space left: the rest is one piece
    out.push_back(doc.substr(start, cut - start));
    start = rule == PieceRule::kDropSpace ? cut + 1 : cut;
  }
  out.push_back(doc.substr(start));
  return out;
}

// Encodes `pieces` a window at a time (threads x 4 pieces), calling `take` with each
// piece's ids in order; holds one window's ids at once.
void encode_pieces(const Tokenizer& tok, std::span<const std::string_view> pieces, int threads,
                   const std::function<void(std::span<const int32_t>)>& take) {
  const size_t window = size_t(threads) * 4;
  for (size_t at = 0; at < pieces.size(); at += window) {
    const auto ids = encode_parallel(tok, pieces.subspan(at, std::min(window, pieces.size() - at)), threads);
    for (const std::vector<int32_t>& v : ids) take(v);
  }
}

// The tokens of a file's documents, in order, into the train or val writer (every k-th
// document to val). Small documents are encoded in batches of up to opt.piece_bytes x
// threads x 4 bytes; a long one in pieces, twice (once to count its tokens, which decides
// whether a shard ends before it, then to store them), so memory holds one window of ids.
void encode_documents(const Tokenizer& tok, PieceRule rule, const std::vector<std::string_view>& docs,
                      const PrepareOptions& opt, const ShardHeader& h, uint64_t k, ShardWriter (&writers)[2],
                      uint64_t& doc_index, PrepareStats& st) {
  const int32_t eod[1] = {int32_t(h.end_of_document)};
  const std::span<const int32_t> tail(eod, h.end_of_document >= 0 ? 1 : 0);
  auto store = [&](size_t i, uint64_t count, const std::function<void(ShardWriter&)>& give) {
    const int split = (k && doc_index % k == k - 1) ? 1 : 0;
    writers[split].begin_doc(count + tail.size());
    give(writers[split]);
    writers[split].append(tail);
    st.docs[split]++, st.tokens[split] += count + tail.size(), st.bytes[split] += docs[i].size();
    doc_index++;
  };
  const size_t batch_bytes = size_t(opt.piece_bytes) * size_t(opt.threads) * 4;
  for (size_t i = 0; i < docs.size();) {
    if (docs[i].size() > size_t(opt.piece_bytes) && rule != PieceRule::kWhole) {
      const std::vector<std::string_view> pieces = split_pieces(docs[i], size_t(opt.piece_bytes), rule);
      st.pieces += pieces.size();
      uint64_t count = 0;
      encode_pieces(tok, pieces, opt.threads, [&](std::span<const int32_t> ids) { count += ids.size(); });
      store(i++, count, [&](ShardWriter& w) {
        encode_pieces(tok, pieces, opt.threads, [&](std::span<const int32_t> ids) { w.append(ids); });
      });
      continue;
    }
    size_t end = i, bytes = 0;
    while (end < docs.size() && (docs[end].size() <= size_t(opt.piece_bytes) || rule == PieceRule::kWhole) &&
           (end == i || bytes < batch_bytes))
      bytes += docs[end++].size();
    const auto encoded = encode_parallel(tok, std::span<const std::string_view>(docs).subspan(i, end - i), opt.threads);
    for (const std::vector<int32_t>& ids : encoded) store(i++, ids.size(), [&](ShardWriter& w) { w.append(ids); });
  }
}

}  // namespace

PrepareStats prepare_shards(const Tokenizer& tok, const std::string& tokenizer_path, const PrepareOptions& opt,
                            const Progress& progress) {
  LOOM_CONFIG_CHECK(opt.shard_tokens >= 1024, "--shard-tokens ", opt.shard_tokens, " is below 1024");
  LOOM_CONFIG_CHECK(opt.val_fraction >= 0 && opt.val_fraction <= 0.5, "--val-fraction ", opt.val_fraction,
                    " is outside [0, 0.5]");
  LOOM_CONFIG_CHECK(opt.threads >= 1, "--threads ", opt.threads, " is below 1");
  LOOM_CONFIG_CHECK(opt.piece_bytes >= 64, "piece_bytes ", opt.piece_bytes, " is below 64");
  const auto files = input_files(opt.in);
  check_out_dir(opt);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t total = 0, done = 0;
  for (const auto& f : files) total += fs::file_size(f);
  ShardHeader h;
  h.vocab_size = uint64_t(tok.vocab_size());
  h.token_bytes = h.vocab_size <= 65536 ? 2 : 4;
  h.end_of_document = tok.end_of_document();
  h.tokenizer = tokenizer_fingerprint(tok);
  // Shards are written into a marked temporary directory beside --out (Note [Ownership by
  // content]); those of an earlier run of this command that was killed are removed first.
  const fs::path out_path = fs::path(opt.out).lexically_normal();
  const std::string parent = out_path.parent_path().empty() ? "." : out_path.parent_path().string();
  const std::string base = out_path.filename().string();
  LOOM_CONFIG_CHECK(!base.empty() && base != "." && base != "..", "--out '", opt.out, "': name a directory");
  fs::create_directories(parent);
  PrepareStats st;
  st.removed = owned::remove_abandoned(parent, base);
  owned::TempDir made(parent, base);  // removed unless published
  const std::string tmp = made.path();
  {
    ShardWriter writers[2] = {{tmp, "train", h, opt.shard_tokens}, {tmp, "val", h, opt.shard_tokens}};
    const uint64_t k = opt.val_fraction > 0 ? uint64_t(std::max<int64_t>(2, std::llround(1.0 / opt.val_fraction))) : 0;
    uint64_t doc_index = 0;
    const PieceRule rule = piece_rule(tok);
    for (const auto& f : files) {
      const std::string text = read_file_bytes(f);
      LOOM_CHECK(!text.empty(), "input file '", f, "' is empty: remove it or give text");
      require_utf8(text, "input file '" + f + "'");
      std::vector<std::string> owned;
      auto docs = split_documents(f, text, opt, owned);
      docs.erase(std::remove_if(docs.begin(), docs.end(), [](std::string_view d) { return d.empty(); }), docs.end());
      encode_documents(tok, rule, docs, opt, h, k, writers, doc_index, st);
      done += text.size();
      if (progress) progress(done, total);
    }
    for (int s = 0; s < 2; s++) writers[s].flush(), st.shards[s] = writers[s].shards();
    LOOM_CHECK(st.docs[0] > 0, "no training documents in '", opt.in, "'");
    LOOM_CHECK(k == 0 || st.docs[1] > 0, "'", opt.in, "' has ", st.docs[0],
               " document(s), too few for a validation split of every ", k,
               "th document: split files into documents with --doc-separator, or pass --val-fraction 0");
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nlohmann::json meta = {{"format", "loom token shards"}, {"version", 1}, {"tokenizer", tokenizer_path},
                           {"fingerprint", h.tokenizer}, {"source", opt.in}, {"doc_separator", opt.doc_separator}};
    for (int s = 0; s < 2; s++)
      meta[s ? "val" : "train"] = {{"docs", st.docs[s]}, {"tokens", st.tokens[s]}, {"bytes", st.bytes[s]},
                                   {"shards", st.shards[s]}};
    write_file_atomic((fs::path(tmp) / "prepare.json").string(), meta.dump(2) + "\n");
    check_out_dir(opt);  // again: it may have changed during the run
    remove_earlier(opt.out);  // absent, empty, or only our shards with --overwrite
    made.publish(opt.out);
    fsync_dir(parent);
  }
  return st;
}

}  // namespace loom::data
