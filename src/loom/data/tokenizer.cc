#include "loom/data/tokenizer.h"

#include <filesystem>

#include "loom/core/error.h"
#include "loom/data/bpe.h"
#include "loom/data/spm.h"

namespace fs = std::filesystem;

namespace loom::data {

int64_t first_invalid_utf8(const uint8_t* s, int64_t n) {
  int64_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    int len;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    }
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return i;
    if (i + len > n) return i;
    for (int k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return -1;
}

void require_utf8(std::string_view text, const std::string& what) {
  const int64_t bad = first_invalid_utf8(reinterpret_cast<const uint8_t*>(text.data()), int64_t(text.size()));
  if (bad >= 0) throw Error(what + " is not valid UTF-8 at byte offset " + std::to_string(bad));
}

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, Special) const override {
    require_utf8(text, "text to encode");
    return std::vector<int32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (int32_t id : ids) {
      LOOM_CHECK(id >= 0 && id < 256, "token id ", id, " is not a byte (the byte tokenizer's vocabulary is 0..255)");
      out.push_back(char(id));
    }
    return out;
  }
  int64_t vocab_size() const override { return 256; }
  int32_t end_of_document() const override { return -1; }
  std::string kind() const override { return "byte"; }
  std::string piece(int32_t id) const override { return decode(std::span<const int32_t>(&id, 1)); }
};

std::unique_ptr<Tokenizer> load_from_dir(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::is_regular_file(d / "tokenizer.json", ec)) return load_hf_tokenizer_json((d / "tokenizer.json").string());
  const bool vocab = fs::is_regular_file(d / "vocab.json", ec), merges = fs::is_regular_file(d / "merges.txt", ec);
  if (vocab && merges) return load_vocab_merges((d / "vocab.json").string(), (d / "merges.txt").string());
  std::vector<std::string> models;
  for (const auto& e : fs::directory_iterator(d, ec))
    if (e.path().extension() == ".model") models.push_back(e.path().string());
  if (models.size() == 1) return load_sentencepiece(models[0]);
  std::string why = vocab    ? "vocab.json without merges.txt"
                    : merges ? "merges.txt without vocab.json"
                    : models.size() > 1 ? std::to_string(models.size()) + " .model files (name one)"
                                        : "no tokenizer.json, vocab.json + merges.txt or .model file";
  throw Error("tokenizer directory '" + dir + "' holds " + why);
}

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty() || path == "byte") return make_byte_tokenizer();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw ConfigError("tokenizer '" + path + "' does not exist: expected \"byte\", a tokenizer.json, a SentencePiece "
                ".model, or a directory holding one (or vocab.json + merges.txt)");
  if (fs::is_directory(path, ec)) return load_from_dir(path);
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".json") return load_hf_tokenizer_json(path);
  if (ext == ".model") return load_sentencepiece(path);
  throw Error("tokenizer '" + path + "' is neither a .json (Hugging Face tokenizer.json) nor a .model "
              "(SentencePiece) file");
}

}  // namespace loom::data
