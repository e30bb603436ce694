// `loom data prepare | inspect`: token shards from text, and what a shard holds.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "loom/cli/commands.h"
#include "loom/core/error.h"
#include "loom/data/prepare.h"
#include "loom/data/shards.h"

namespace loom::cli {

namespace {

int prepare(const DataArgs& a) {
  const auto tok = data::load_tokenizer(a.tokenizer);
  data::PrepareOptions opt;
  opt.in = a.in;
  opt.out = a.out;
  opt.shard_tokens = a.shard_tokens;
  opt.val_fraction = a.val_fraction;
  opt.text_field = a.text_field;
  opt.doc_separator = a.doc_separator;
  opt.threads = a.threads;
  opt.overwrite = a.overwrite;
  const bool tty = ::isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](uint64_t done, uint64_t total) {
    if (!tty) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = done / std::max(s, 1e-9);
    std::fprintf(stderr, "\rprepare: %.1f / %.1f MB (%.0f%%), %.2f MB/s, ETA %.0f s   ", done / 1e6, total / 1e6,
                 100.0 * double(done) / double(std::max<uint64_t>(total, 1)), rate / 1e6,
                 double(total - done) / std::max(rate, 1.0));
  };
  const auto st = data::prepare_shards(*tok, a.tokenizer, opt, progress);
  if (tty) std::fprintf(stderr, "\n");
  const double mb = double(st.bytes[0] + st.bytes[1]) / 1e6;
  std::printf("wrote %s: train %llu docs, %llu tokens in %d shard(s); val %llu docs, %llu tokens in %d shard(s); "
              "%.2f MB of text in %.2f s (%.2f MB/s, %.2f bytes/token)\n",
              a.out.c_str(), (unsigned long long)st.docs[0], (unsigned long long)st.tokens[0], st.shards[0],
              (unsigned long long)st.docs[1], (unsigned long long)st.tokens[1], st.shards[1], mb, st.seconds,
              mb / std::max(st.seconds, 1e-9),
              double(st.bytes[0] + st.bytes[1]) / double(std::max<uint64_t>(st.tokens[0] + st.tokens[1], 1)));
  return 0;
}

int inspect(const DataArgs& a) {
  const auto shards = data::open_shards(a.in);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : shards) {
    const auto& h = s->header();
    out.push_back({{"path", s->path()}, {"format", h.format}, {"tokenizer", h.tokenizer}, {"tokens", h.token_count},
                   {"docs", h.doc_count}, {"vocab_size", h.vocab_size}, {"token_bytes", h.token_bytes},
                   {"end_of_document", h.end_of_document}});
  }
  if (a.json) {
    std::cout << out.dump() << "\n";
    return 0;
  }
  for (const auto& r : out)
    std::cout << r["path"].get<std::string>() << ": " << r["format"].get<std::string>() << ", "
              << r["tokens"] << " tokens, " << r["docs"] << " docs, vocab " << r["vocab_size"] << ", tokenizer "
              << r["tokenizer"].get<std::string>() << "\n";
  return 0;
}

}  // namespace

DataCommands add_data_commands(CLI::App& app, DataArgs& a) {
  auto* d = app.add_subcommand("data", "Prepare and inspect token shards");
  d->require_subcommand(1);
  DataCommands c;
  c.prepare = d->add_subcommand("prepare", "Tokenize text (files, directories, .jsonl) into train_/val_ shards");
  c.prepare->add_option("--tokenizer", a.tokenizer, "byte | tokenizer.json | .model | a directory holding one")->required();
  c.prepare->add_option("--in", a.in, "UTF-8 text or .jsonl file, or a directory of them")->required();
  c.prepare->add_option("--out", a.out, "Directory to write (new, empty, or an earlier prepare's with --overwrite)")
      ->required();
  c.prepare->add_option("--shard-tokens", a.shard_tokens, "Tokens per shard (documents are never split)")
      ->capture_default_str();
  c.prepare->add_option("--val-fraction", a.val_fraction, "Every round(1/F)-th document goes to validation")
      ->capture_default_str();
  c.prepare->add_option("--doc-separator", a.doc_separator, "A line equal to this ends a document in text files "
                                                           "(fortunes: %); default: one document per file");
  c.prepare->add_option("--text-field", a.text_field, "Field of each .jsonl line holding the text")->capture_default_str();
  c.prepare->add_option("--threads", a.threads, "Encoding threads")->capture_default_str();
  c.prepare->add_flag("--overwrite", a.overwrite, "Replace the shards of an earlier prepare in --out");
  c.inspect = d->add_subcommand("inspect", "Check and summarise shards (loom's or llm.c's .bin)");
  c.inspect->add_option("PATH", a.in, "A shard file or a directory of *.bin shards")->required();
  c.inspect->add_flag("--json", a.json, "One JSON array");
  return c;
}

int run_data(const DataCommands& c, const DataArgs& a) { return *c.prepare ? prepare(a) : inspect(a); }

}  // namespace loom::cli
