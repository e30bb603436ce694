#include "loom/data/spm.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom::data {

namespace {

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(const std::string& path) : path_(path) {
    // Read by loom (a regular file, never a FIFO or device), then handed over as bytes.
    const auto st = sp_.LoadFromSerializedProto(read_file_bytes(path));
    if (!st.ok()) throw Error("cannot load SentencePiece model '" + path + "': " + st.ToString());
  }
  // SentencePiece has no "special tokens in text" pass: control symbols (<s>, </s>) are
  // never produced from text, user-defined symbols always are. `special` does not apply.
  std::vector<int32_t> encode(std::string_view text, Special) const override {
    require_utf8(text, "text to encode");
    std::vector<int> ids;
    const auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw Error("SentencePiece '" + path_ + "' cannot encode: " + st.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    for (int id : v)
      LOOM_CHECK(id >= 0 && id < sp_.GetPieceSize(), "token id ", id, " is not in the vocabulary of '", path_,
                 "' (size ", sp_.GetPieceSize(), ")");
    std::string out;
    const auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw Error("SentencePiece '" + path_ + "' cannot decode: " + st.ToString());
    return out;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t end_of_document() const override { return sp_.eos_id(); }
  std::string kind() const override { return "sentencepiece"; }
  std::string piece(int32_t id) const override {
    LOOM_CHECK(id >= 0 && id < sp_.GetPieceSize(), "token id ", id, " is not in the vocabulary of '", path_, "'");
    return sp_.IdToPiece(id);
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

// Feeds SentencePiece's trainer the non-empty lines of each file, one file in memory at a time.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& files) : files_(files) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (true) {
      while (pos_ < text_.size()) {
        size_t end = text_.find('\n', pos_);
        if (end == std::string::npos) end = text_.size();
        line_.assign(text_, pos_, end - pos_);
        pos_ = end + 1;
        if (!line_.empty()) return;
      }
      if (next_file_ == files_.size()) {
        done_ = true;
        return;
      }
      const std::string& f = files_[next_file_++];
      text_ = read_file_bytes(f);
      require_utf8(text_, "corpus file '" + f + "'");
      pos_ = 0;
    }
  }
  const std::vector<std::string>& files_;
  size_t next_file_ = 0, pos_ = 0;
  std::string text_, line_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
  return std::make_unique<SpmTokenizer>(model_path);
}

void train_sentencepiece(const std::vector<std::string>& files, const std::string& out, const SpmTrainOptions& opt) {
  LOOM_CONFIG_CHECK(opt.type == "bpe" || opt.type == "unigram", "tokenizer type '", opt.type, "' is not one of bpe | unigram");
  LOOM_CONFIG_CHECK(opt.vocab >= 260 && opt.vocab <= 1'000'000, "--vocab ", opt.vocab,
             " is outside [260, 1000000] (a lossless vocabulary holds the 256 bytes and <unk>, <s>, </s>)");
  LOOM_CHECK(!files.empty(), "no corpus files to train a tokenizer on");
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opt.type},
      {"vocab_size", std::to_string(opt.vocab)},
      {"normalization_rule_name", "identity"},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "0.9995"},
      {"input_sentence_size", std::to_string(opt.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(opt.threads)},
      {"minloglevel", "2"},
  };
  LineIterator lines(files);
  std::string proto;
  const auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  if (!st.ok())
    throw Error("SentencePiece training (" + opt.type + ", vocab " + std::to_string(opt.vocab) +
                ") failed: " + st.ToString() +
                " (--vocab must hold every character the corpus uses, and a small corpus cannot yield a large one)");
  write_file_atomic(out, proto);
}

}  // namespace loom::data
