#include "loom/data/bpe.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/regex.h"

namespace loom::data {

namespace {

using json = nlohmann::json;

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
// bytes for code points 256, 257, ... in byte order. Returns code point -> byte (-1: none).
const std::vector<int>& unicode_to_byte() {
  static const std::vector<int> table = [] {
    std::vector<int> t(256 + 68, -1);
    int n = 0;
    for (int b = 0; b < 256; b++) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[printable ? b : 256 + n++] = b;
    }
    return t;
  }();
  return table;
}

// A vocabulary entry spelled in bytes_to_unicode code points -> its bytes; false if some
// code point is not in the table (the vocabulary is not byte-level).
bool unmap_bytes(const std::string& s, std::string& out) {
  const auto& table = unicode_to_byte();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    uint32_t cp;
    int len;
    if (c < 0x80) cp = c, len = 1;
    else if ((c & 0xE0) == 0xC0) cp = c & 0x1F, len = 2;
    else if ((c & 0xF0) == 0xE0) cp = c & 0x0F, len = 3;
    else cp = c & 0x07, len = 4;
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; k++) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    if (cp >= table.size() || table[cp] < 0) return false;
    out.push_back(char(table[cp]));
    i += len;
  }
  return true;
}

// Everything a byte-level BPE tokenizer is made of, in bytes.
struct BpeSpec {
  std::string source;  // the file(s), for messages
  std::string kind;
  std::vector<std::pair<std::string, int32_t>> vocab;  // token bytes, id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order, token bytes
  std::vector<std::string> merge_text;                      // as the file spells them
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added;
  std::string pattern = kGpt2Pattern;
  bool ignore_merges = false;
};

std::atomic<uint64_t> next_serial{1};
constexpr int64_t kMaxVocab = int64_t(1) << 24;  // ids past this are a corrupt file, not a vocabulary

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec);
  std::vector<int32_t> encode(std::string_view text, Special special) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return int64_t(pieces_.size()); }
  int32_t end_of_document() const override { return eod_; }
  std::string kind() const override { return kind_; }
  std::string piece(int32_t id) const override;

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::string kind_, source_;
  std::vector<std::string> pieces_;  // id -> bytes
  std::vector<bool> present_;        // ids the files define (holes decode to an error)
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a, b) -> (rank, merged id)
  std::array<int32_t, 256> byte_id_{};
  std::vector<BpeSpec::Added> added_;  // longest content first
  std::array<bool, 256> added_first_{};
  SplitRegex regex_;
  bool ignore_merges_;
  int32_t eod_ = -1;
  uint64_t serial_;  // identifies this tokenizer to the per-thread word caches
};

BpeTokenizer::BpeTokenizer(BpeSpec spec)
    : kind_(spec.kind), source_(spec.source), regex_(spec.pattern), ignore_merges_(spec.ignore_merges),
      serial_(next_serial++) {
  int32_t max_id = -1;
  for (const auto& [bytes, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const auto& a : spec.added) max_id = std::max(max_id, a.id);
  LOOM_CHECK(max_id >= 0, source_, " defines no tokens");
  pieces_.resize(size_t(max_id) + 1);
  present_.resize(size_t(max_id) + 1);
  for (auto& [bytes, id] : spec.vocab) {
    LOOM_CHECK(id >= 0, source_, ": token '", bytes, "' has negative id ", id);
    LOOM_CHECK(vocab_.emplace(bytes, id).second, source_, ": token '", bytes, "' appears twice in the vocabulary");
    LOOM_CHECK(!present_[size_t(id)], source_, ": tokens '", pieces_[size_t(id)], "' and '", bytes, "' share id ", id);
    pieces_[size_t(id)] = bytes;
    present_[size_t(id)] = true;
  }
  for (int b = 0; b < 256; b++) {
    auto it = vocab_.find(std::string(1, char(b)));
    LOOM_CHECK(it != vocab_.end(), source_, ": the vocabulary has no token for byte ", b,
               ", so it is not a byte-level BPE vocabulary (every one of the 256 bytes needs a token)");
    byte_id_[size_t(b)] = it->second;
  }
  merges_.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); r++) {
    const auto& [a, b] = spec.merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    LOOM_CHECK(ia != vocab_.end() && ib != vocab_.end() && im != vocab_.end(), source_, ": merge ", r + 1,
               " ('", spec.merge_text[r], "') names a token missing from the vocabulary");
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(int32_t(r), im->second));
  }
  for (const auto& a : spec.added) {
    LOOM_CHECK(a.id >= 0 && !a.content.empty(), source_, ": added token '", a.content, "' (id ", a.id, ") is invalid");
    if (present_[size_t(a.id)] && pieces_[size_t(a.id)] != a.content)
      throw Error(source_ + ": added token '" + a.content + "' reuses id " + std::to_string(a.id) + " of '" +
                  pieces_[size_t(a.id)] + "'");
    pieces_[size_t(a.id)] = a.content;
    present_[size_t(a.id)] = true;
    added_.push_back(a);
    added_first_[uint8_t(a.content[0])] = true;
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& x, const auto& y) { return x.content.size() > y.content.size(); });
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    for (const auto& a : added_)
      if (a.content == name && eod_ < 0) eod_ = a.id;
  }
}

// The pieces' merge result depends only on the piece, and text repeats its words, so each
// thread keeps the last ~256k words' tokens (Hugging Face's tokenizers cache the same way).
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id_[uint8_t(word[0])]);
    return;
  }
  if (ignore_merges_) {  // Llama 3: a piece that is itself a token is emitted whole
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local WordCache cache;
  if (cache.owner != serial_ || cache.words.size() > (1u << 18)) {
    cache.words.clear();
    cache.owner = serial_;
  }
  std::string key(word);
  auto it = cache.words.find(key);
  if (it == cache.words.end()) {
    std::vector<int32_t> ids;
    merge_word(word, ids);
    it = cache.words.emplace(std::move(key), std::move(ids)).first;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
}

// Note [Byte-level BPE]: a heap of candidate pairs ordered by (rank, position) over a linked
// list of symbols, so a piece of n bytes costs O(n log n); a popped candidate whose symbols
// have since changed is stale and skipped.
void BpeTokenizer::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = int32_t(word.size());
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; i++) s[size_t(i)] = {byte_id_[uint8_t(word[size_t(i)])], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0 || s[size_t(pos)].next < 0) return;
    const int32_t l = s[size_t(pos)].id, r = s[size_t(s[size_t(pos)].next)].id;
    auto m = merges_.find(pair_key(l, r));
    if (m != merges_.end()) heap.push({m->second.first, pos, l, r});
  };
  for (int32_t i = 0; i + 1 < n; i++) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& a = s[size_t(c.pos)];
    if (!a.alive || a.id != c.left || a.next < 0 || s[size_t(a.next)].id != c.right) continue;
    Sym& b = s[size_t(a.next)];
    a.id = merges_.at(pair_key(c.left, c.right)).second;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) s[size_t(b.next)].prev = c.pos;
    consider(a.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = s[size_t(i)].next) out.push_back(s[size_t(i)].id);
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::vector<std::pair<uint32_t, uint32_t>> pieces;
  pieces.clear();
  regex_.split(text, pieces);
  for (const auto& [off, len] : pieces) encode_word(text.substr(off, len), out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, Special special) const {
  require_utf8(text, "text to encode");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (special == Special::kPlain || added_.empty()) {
    encode_plain(text, out);
    return out;
  }
  size_t seg = 0;  // start of text not yet encoded
  for (size_t i = 0; i < text.size(); i++) {
    if (!added_first_[uint8_t(text[i])]) continue;
    for (const auto& a : added_) {
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      encode_plain(text.substr(seg, i - seg), out);
      out.push_back(a.id);
      i += a.content.size() - 1;
      seg = i + 1;
      break;
    }
  }
  encode_plain(text.substr(seg), out);
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= int32_t(pieces_.size()) || !present_[size_t(id)])
      throw Error("token id " + std::to_string(id) + " is not in the vocabulary of " + source_ + " (size " +
                  std::to_string(pieces_.size()) + ")");
    out += pieces_[size_t(id)];
  }
  return out;
}

std::string BpeTokenizer::piece(int32_t id) const {
  return decode(std::span<const int32_t>(&id, 1));
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error("'" + source + "' is not valid JSON: " + e.what());
  }
}

void read_vocab(const json& v, const std::string& where, BpeSpec& spec) {
  LOOM_CHECK(v.is_object(), where, " must be an object of token -> id");
  spec.vocab.reserve(v.size());
  std::string bytes;
  for (const auto& [tok, id] : v.items()) {
    LOOM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < kMaxVocab, where, ": token '",
               tok, "' has id ", id.dump(), ", not an integer in [0, ", kMaxVocab, ")");
    if (!unmap_bytes(tok, bytes))
      throw Error(where + ": token '" + tok + "' is not spelled in byte-level code points (GPT-2's bytes_to_unicode); "
                  "only byte-level BPE vocabularies are supported (for SentencePiece-style BPE pass the tokenizer.model)");
    spec.vocab.emplace_back(bytes, id.get<int32_t>());
  }
}

void add_merge(const std::string& a, const std::string& b, const std::string& where, size_t line, BpeSpec& spec) {
  std::string ab, bb;
  if (!unmap_bytes(a, ab) || !unmap_bytes(b, bb))
    throw Error(where + ": merge " + std::to_string(line) + " ('" + a + " " + b + "') is not byte-level");
  spec.merges.emplace_back(std::move(ab), std::move(bb));
  spec.merge_text.push_back(a + " " + b);
}

void read_merges_json(const json& m, const std::string& where, BpeSpec& spec) {
  LOOM_CHECK(m.is_array(), where, " must be an array");
  spec.merges.reserve(m.size());
  for (size_t i = 0; i < m.size(); i++) {
    const json& e = m[i];
    if (e.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size(), where, "[", i, "] = '", s,
                 "' is not 'left right'");
      add_merge(s.substr(0, sp), s.substr(sp + 1), where, i + 1, spec);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      add_merge(e[0].get<std::string>(), e[1].get<std::string>(), where, i + 1, spec);
    } else {
      throw Error(where + "[" + std::to_string(i) + "] is neither \"left right\" nor [\"left\", \"right\"]");
    }
  }
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].dump() : j.dump(); }

// pre_tokenizer: ByteLevel, or Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)].
void read_pre_tokenizer(const json& p, const std::string& path, BpeSpec& spec) {
  auto byte_level = [&](const json& b, bool regex_expected) {
    if (b.value("add_prefix_space", false))
      throw Error(path + ": pre_tokenizer ByteLevel with add_prefix_space = true is not supported (GPT-2 and "
                  "Llama 3 use false)");
    const bool use_regex = b.value("use_regex", true);
    if (use_regex != regex_expected)
      throw Error(path + ": pre_tokenizer ByteLevel use_regex = " + (use_regex ? "true" : "false") +
                  (regex_expected ? " without a Split before it leaves the text unsplit" : " after a Split splits twice"));
  };
  if (p.is_object() && p.value("type", "") == "ByteLevel") return byte_level(p, true);
  const bool seq = p.is_object() && p.value("type", "") == "Sequence" && p.contains("pretokenizers") &&
                   p["pretokenizers"].is_array() && p["pretokenizers"].size() == 2;
  if (seq) {
    const json& split = p["pretokenizers"][0];
    const json& bl = p["pretokenizers"][1];
    if (split.value("type", "") == "Split" && bl.value("type", "") == "ByteLevel") {
      if (split.value("behavior", "") != "Isolated" || split.value("invert", false))
        throw Error(path + ": pre_tokenizer Split with behavior " + split.value("behavior", "?") +
                    (split.value("invert", false) ? ", invert = true" : "") + " is not supported (Isolated only)");
      const json& pat = split.at("pattern");  // at(): a missing key throws, [] on a const json is undefined
      if (pat.contains("Regex")) spec.pattern = pat["Regex"].get<std::string>();
      else throw Error(path + ": pre_tokenizer Split pattern " + pat.dump() + " is not supported (Regex only)");
      return byte_level(bl, false);
    }
  }
  throw Error(path + ": pre_tokenizer " + type_of(p) + " is not supported: loom reads byte-level BPE (ByteLevel, "
              "or Sequence[Split, ByteLevel]); for SentencePiece-style tokenizers (Metaspace) pass the tokenizer.model");
}

std::unique_ptr<Tokenizer> tokenizer_from_parsed(const json& j, const std::string& path) {
  LOOM_CHECK(j.is_object() && j.contains("model"), "'", path, "' has no \"model\": not a Hugging Face tokenizer.json");
  const json& m = j["model"];
  if (m.value("type", "BPE") != "BPE")
    throw Error(path + ": model type " + m.value("type", "") + " is not supported (byte-level BPE only; "
                "SentencePiece models load from their .model file)");
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    throw Error(path + ": normalizer " + type_of(j["normalizer"]) + " is not supported (byte-level BPE tokenizers "
                "have none)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      throw Error(path + ": model." + k + " = '" + m[k].get<std::string>() + "' is not supported");
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    throw Error(path + ": BPE dropout " + m["dropout"].dump() + " is not supported (it makes encoding random)");
  BpeSpec spec;
  spec.source = "'" + path + "'";
  spec.kind = "bpe (tokenizer.json)";
  read_pre_tokenizer(j.value("pre_tokenizer", json()), path, spec);
  spec.ignore_merges = m.value("ignore_merges", false);
  LOOM_CHECK(m.contains("vocab") && m.contains("merges"), path, ": model needs \"vocab\" and \"merges\"");
  read_vocab(m["vocab"], path + ": model.vocab", spec);
  read_merges_json(m["merges"], path + ": model.merges", spec);
  for (const auto& a : j.value("added_tokens", json::array())) {
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (a.value(flag, false))
        throw Error(path + ": added token " + a.value("content", "?") + " has " + flag +
                    " = true, which loom does not implement");
    LOOM_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id") &&
                   a["id"].is_number_integer(),
               path, ": added token ", a.dump(), " needs a string \"content\" and an integer \"id\"");
    LOOM_CHECK(a["id"].get<int64_t>() >= 0 && a["id"].get<int64_t>() < kMaxVocab, path, ": added token id ",
               a["id"].dump(), " is not in [0, ", kMaxVocab, ")");
    spec.added.push_back({a["content"].get<std::string>(), a["id"].get<int32_t>()});
  }
  return std::make_unique<BpeTokenizer>(std::move(spec));
}


}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  return tokenizer_from_json(read_file_bytes(path), path);
}

std::unique_ptr<Tokenizer> tokenizer_from_json(const std::string& text, const std::string& path) {
  try {
    return tokenizer_from_parsed(parse_json(text, path), path);
  } catch (const json::exception& e) {  // a field of the wrong type
    throw Error("'" + path + "' is not a tokenizer.json loom can read: " + e.what());
  }
}


std::unique_ptr<Tokenizer> load_vocab_merges(const std::string& vocab_json, const std::string& merges_txt) {
  BpeSpec spec;
  spec.source = "'" + vocab_json + "' + '" + merges_txt + "'";
  spec.kind = "bpe (vocab.json + merges.txt)";
  read_vocab(parse_json(read_file_bytes(vocab_json), vocab_json), vocab_json, spec);
  const std::string text = read_file_bytes(merges_txt);
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    LOOM_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               merges_txt, ":", line_no, ": '", line, "' is not 'left right'");
    add_merge(line.substr(0, sp), line.substr(sp + 1), merges_txt, line_no, spec);
  }
  for (const auto& [bytes, id] : spec.vocab)
    if (bytes == "<|endoftext|>") spec.added.push_back({bytes, id});
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace loom::data
