// `loom tokenizer encode | decode | train | info`.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "loom/cli/commands.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/data/spm.h"
#include "loom/data/tokenizer.h"
#include "loom/data/loader.h"
#include "loom/ckpt/run_dir.h"

namespace loom::cli {

namespace {

// The text to encode: --text S or the file --in names (exactly one of them).
std::string input_text(const TokenizerArgs& a) {
  if (!a.text.empty() && !a.in.empty()) throw ConfigError("give --text or --in, not both");
  if (!a.in.empty()) require_path(a.in, "--in");
  if (!a.in.empty()) return read_file_bytes(a.in);
  if (a.text.empty()) throw ConfigError("give the text with --text S or --in FILE");
  return a.text;
}

// "1 2 3", "1,2,3" or "[1, 2, 3]": integers separated by spaces, commas or brackets.
std::vector<int32_t> parse_ids(const std::string& s, const std::string& where) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(uint8_t(c)) || c == ',' || c == '[' || c == ']') {
      i++;
      continue;
    }
    size_t end = i;
    while (end < s.size() && (std::isdigit(uint8_t(s[end])) || (end == i && s[end] == '-'))) end++;
    if (end == i || (end == i + 1 && s[i] == '-'))
      throw ConfigError(where + ": '" + s.substr(i, 20) + "' at offset " + std::to_string(i) +
                        " is not a token id (expected integers separated by spaces or commas, or a JSON array)");
    const long long v = std::stoll(s.substr(i, end - i));
    if (v < INT32_MIN || v > INT32_MAX) throw ConfigError(where + ": token id " + s.substr(i, end - i) + " is out of range");
    ids.push_back(int32_t(v));
    i = end;
  }
  return ids;
}

// "1 2 3": the ids separated by single spaces.
std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); i++) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

int encode(const TokenizerArgs& a) {
  const auto tok = data::load_tokenizer(a.tokenizer);
  const std::string text = input_text(a);
  const auto special = a.plain ? data::Special::kPlain : data::Special::kRecognize;
  if (a.lines) {  // one line of ids per line of text, newlines not encoded (as spm_encode does)
    if (a.json) throw ConfigError("--lines prints plain ids; drop --json");
    std::string out;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      out += join_ids(tok->encode(std::string_view(text).substr(pos, end - pos), special)) + "\n";
      pos = end + 1;
    }
    std::cout << out;
    return 0;
  }
  const auto ids = tok->encode(text, special);
  if (a.json) {
    std::cout << nlohmann::json(ids).dump() << "\n";
  } else {
    std::cout << join_ids(ids) << "\n";
  }
  return 0;
}

int decode(const TokenizerArgs& a) {
  const auto tok = data::load_tokenizer(a.tokenizer);
  if (!a.ids.empty() && !a.in.empty()) throw ConfigError("give --ids or --in, not both");
  if (a.ids.empty() && a.in.empty()) throw ConfigError("give the token ids with --ids \"1 2 3\" or --in FILE");
  if (!a.in.empty()) require_path(a.in, "--in");
  const auto ids = parse_ids(a.in.empty() ? a.ids : read_file_bytes(a.in), a.in.empty() ? "--ids" : a.in);
  std::cout << tok->decode(ids);
  std::cout.flush();
  return 0;
}

int train(const TokenizerArgs& a) {
  if (a.out.empty()) throw ConfigError("give the model file to write with --out FILE (e.g. tok.model)");
  if (std::filesystem::path(a.out).extension() != ".model")
    throw ConfigError("--out '" + a.out + "' must end in .model (a SentencePiece model file)");
  std::error_code ec;
  if (std::filesystem::exists(a.out, ec) && !a.overwrite)
    throw ConfigError("--out '" + a.out + "' exists: pass --overwrite to replace it, or another path");
  check_output_file(a.out, "--out", a.overwrite);
  const auto files = corpus_files(a.in);
  data::SpmTrainOptions opt;
  opt.vocab = a.vocab;
  opt.type = a.type;
  data::train_sentencepiece(files, a.out, opt);
  const auto tok = data::load_tokenizer(a.out);
  std::cout << "wrote " << a.out << ": sentencepiece " << a.type << ", vocab " << tok->vocab_size() << ", from "
            << files.size() << " file(s) under " << (a.in.empty() ? kDefaultCorpusDir : a.in) << "\n";
  return 0;
}

int info(const TokenizerArgs& a) {
  const auto tok = data::load_tokenizer(a.tokenizer);
  const int32_t eod = tok->end_of_document();
  nlohmann::json j = {{"kind", tok->kind()}, {"vocab_size", tok->vocab_size()}, {"end_of_document", eod}};
  if (eod >= 0) j["end_of_document_text"] = tok->piece(eod);
  if (a.json) std::cout << j.dump() << "\n";
  else
    std::cout << "kind " << tok->kind() << "\nvocab_size " << tok->vocab_size() << "\nend_of_document "
              << (eod >= 0 ? std::to_string(eod) + " " + tok->piece(eod) : "none") << "\n";
  return 0;
}

}  // namespace

TokenizerCommands add_tokenizer_commands(CLI::App& app, TokenizerArgs& a) {
  auto* t = app.add_subcommand("tokenizer", "Encode, decode and train tokenizers (byte, BPE tokenizer.json or "
                                            "vocab.json + merges.txt, SentencePiece .model)");
  t->require_subcommand(1);
  const std::string tok_help = "byte | tokenizer.json | SentencePiece .model | a directory holding one "
                               "(or vocab.json + merges.txt)";
  TokenizerCommands c;
  c.encode = t->add_subcommand("encode", "Print the token ids of a text");
  c.encode->add_option("--tokenizer", a.tokenizer, tok_help)->required();
  c.encode->add_option("--text", a.text, "Text to encode");
  c.encode->add_option("--in", a.in, "File to encode (UTF-8)");
  c.encode->add_flag("--json", a.json, "Print a JSON array");
  c.encode->add_flag("--lines", a.lines, "Encode each line on its own and print one line of ids per line (as spm_encode)");
  c.encode->add_flag("--plain", a.plain, "Special tokens written in the text stay text (as loom data prepare reads it)");
  c.decode = t->add_subcommand("decode", "Print the text of token ids");
  c.decode->add_option("--tokenizer", a.tokenizer, tok_help)->required();
  c.decode->add_option("--ids", a.ids, "Ids: \"1 2 3\", \"1,2,3\" or a JSON array");
  c.decode->add_option("--in", a.in, "File of ids in the same forms");
  c.train = t->add_subcommand("train", "Train a SentencePiece vocabulary (byte fallback, no normalization: lossless except U+2581, read as a space)");
  c.train->add_option("--vocab", a.vocab, "Vocabulary size")->capture_default_str();
  c.train->add_option("--type", a.type, "bpe | unigram")->capture_default_str()->check(CLI::IsMember({"bpe", "unigram"}));
  c.train->add_option("--in", a.in, "UTF-8 text file or directory (default: the default corpus, Debian's fortunes)");
  c.train->add_option("--out", a.out, "Model file to write (*.model)")->required();
  c.train->add_flag("--overwrite", a.overwrite, "Replace --out if it exists");
  c.info = t->add_subcommand("info", "Print a tokenizer's kind, vocabulary size and end-of-document token");
  c.info->add_option("--tokenizer", a.tokenizer, tok_help)->required();
  c.info->add_flag("--json", a.json, "One JSON object");
  return c;
}

int run_tokenizer(const TokenizerCommands& c, const TokenizerArgs& a) {
  if (*c.encode) return encode(a);
  if (*c.decode) return decode(a);
  if (*c.train) return train(a);
  return info(a);
}

}  // namespace loom::cli
