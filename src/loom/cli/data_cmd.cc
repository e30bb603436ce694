// `loom data prepare | inspect | batches`: token shards from text, what a shard holds, and
// the exact token batches a training run reads (to feed another framework the same data).
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include <fstream>

#include "loom/cli/commands.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"
#include "loom/ckpt/run_dir.h"
#include "loom/data/loader.h"
#include "loom/data/prepare.h"
#include "loom/data/shards.h"

namespace loom::cli {

namespace {

namespace fs = std::filesystem;

int prepare(const DataArgs& a) {
  const auto tok = data::load_tokenizer(a.tokenizer);
  data::PrepareOptions opt;
  opt.in = a.in;
  opt.out = a.out;
  opt.shard_tokens = a.shard_tokens;
  opt.piece_bytes = a.piece_bytes;
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
  for (const std::string& n : st.removed)
    std::fprintf(stderr, "removed %s, left by a prepare that was killed\n", n.c_str());
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
  require_path(a.in, "data inspect");
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

// int32 little-endian: global batch B and seq T, then per step the tokens (B,T) and the
// targets (B,T) the run's data-parallel ranks read, rank-major, micro-batches in order.
// The size is known before a byte is written and checked against the free space; the
// file is written in a marked temporary directory beside --out and renamed into place, so
// a killed run leaves no partial file, and the next run on --out removes what it left
// (Note [Ownership by content]).
int batches(const DataArgs& a) {
  const Config cfg = load_config(a.config_path, a.sets);
  LOOM_CONFIG_CHECK(!cfg.data.bucketing, "data.bucketing: its micro-batches have their own lengths; `loom data "
                                         "batches` writes fixed-length batches only (set data.bucketing = false)");
  const int64_t T = cfg.seq_len(), steps = a.steps > 0 ? a.steps : cfg.train.steps, dp = cfg.parallel.dp;
  const int64_t accum = cfg.train.grad_accum, rows = cfg.micro_batch();
  const double bytes = 8.0 + double(steps) * 2.0 * double(cfg.train.batch) * double(T) * 4.0;
  check_output_file(a.out, "--out", a.overwrite);
  const std::string parent = fs::absolute(a.out).parent_path().string();
  if (struct statvfs v {}; ::statvfs(parent.c_str(), &v) == 0 && bytes > double(v.f_bavail) * double(v.f_frsize))
    throw ConfigError(detail::cat("--out '", a.out, "': ", steps, " steps of ", cfg.train.batch, " x ", T,
                                  " tokens and targets take ", bytes / 1e9, " GB, and '", parent, "' has ",
                                  double(v.f_bavail) * double(v.f_frsize) / 1e9, " GB free: lower --steps"));
  const auto data = load_train_data(cfg, T);
  const std::vector<std::string> removed = owned::write_through_temp(a.out, [&](const std::string& tmp) {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw Error("cannot write '" + tmp + "'");
    const int32_t head[2] = {int32_t(cfg.train.batch), int32_t(T)};
    f.write(reinterpret_cast<const char*>(head), sizeof head);
    std::vector<int32_t> tok(size_t(cfg.train.batch * T)), tgt(tok.size());
    for (int64_t step = 0; step < steps; step++) {
      int64_t at = 0;
      for (int64_t r = 0; r < dp; r++) {
        const DataLoader loader(*data->train, T, uint64_t(cfg.train.seed), int(r), int(dp), data->order);
        for (int64_t m = 0; m < accum; m++, at += rows * T)
          loader.train_batch(step, m, accum, cfg.train.batch, tok.data() + at, tgt.data() + at);
      }
      f.write(reinterpret_cast<const char*>(tok.data()), std::streamsize(tok.size() * 4));
      f.write(reinterpret_cast<const char*>(tgt.data()), std::streamsize(tgt.size() * 4));
    }
    if (!f.flush()) throw Error("writing '" + tmp + "' failed (disk full?)");
  });
  for (const std::string& n : removed) std::fprintf(stderr, "removed %s, left by a run that was killed\n", n.c_str());
  std::printf("wrote %s: %lld steps of %lld x %lld tokens and targets\n", a.out.c_str(), (long long)steps,
              (long long)cfg.train.batch, (long long)T);
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
  c.prepare->add_option("--piece-bytes", a.piece_bytes, "Encode a document longer than this in pieces of about "
                                                        "this many bytes, cut at spaces (the same tokens, bounded memory)")
      ->capture_default_str();
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
  c.batches = d->add_subcommand("batches", "Write the token batches a training run reads (int32: B, T, then per step "
                                           "tokens and targets)");
  c.batches->add_option("--config", a.config_path, "TOML config file, as for loom train");
  c.batches->add_option("--set", a.sets, "Config override section.key=value (repeatable)")->take_all();
  c.batches->add_option("--steps", a.steps, "Steps to write (default train.steps)")->check(CLI::PositiveNumber);
  c.batches->add_option("--out", a.out, "Output file")->required();
  c.batches->add_flag("--overwrite", a.overwrite, "Replace --out if a file is there");
  return c;
}

int run_data(const DataCommands& c, const DataArgs& a) {
  if (*c.batches) return batches(a);
  return *c.prepare ? prepare(a) : inspect(a);
}

}  // namespace loom::cli
