#include "loom/cli/commands.h"

#include <unistd.h>

#include <iostream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/run_dir.h"
#include "loom/train/sampler.h"
#include "loom/ckpt/shard_ckpt.h"

namespace loom::cli {

void require_path(const std::string& path, const std::string& flag) {
  if (owned::kind_of(path) == owned::Kind::kNone)
    throw ConfigError(flag + " '" + path + "' does not exist");
}

int run_sample(const SampleArgs& a) {
  require_path(a.checkpoint, "--checkpoint");
  SampleOptions o;
  o.prompt = a.prompt;
  o.tokens = a.tokens;
  o.temperature = a.temperature;
  o.seed = a.seed;
  o.tokenizer = a.tokenizer;
  // Each piece as it is sampled (Note [Streaming decode]), so a long --tokens shows progress.
  sample(a.checkpoint, o, [](std::string_view piece) { std::cout << piece << std::flush; });
  std::cout << std::endl;
  return 0;
}

int run_export(const std::string& checkpoint, const std::string& format, const std::string& out,
               const std::string& dtype, bool overwrite) {
  if (format != "safetensors") throw ConfigError("--format '" + format + "': the only export format is safetensors");
  require_path(checkpoint, "--checkpoint");
  check_output_file(out, "export --out", overwrite, owned::marks::kSafetensors);
  export_safetensors(checkpoint, out, dtype);
  std::cerr << "exported " << checkpoint << " to " << out << " (" << dtype << ")\n";
  return 0;
}

int run_import(const std::string& format, const std::string& in, const std::string& checkpoint,
               const std::string& config_path, const std::vector<std::string>& sets, const std::string& tokenizer) {
  if (format != "safetensors") throw ConfigError("--format '" + format + "': the only import format is safetensors");
  require_path(in, "--in");
  check_new_target(checkpoint, "import --checkpoint", true);  // before reading a large file
  const bool base_given = !config_path.empty() || !sets.empty();
  // Without a config, import starts from a "custom" model whose keys come from the file.
  const Config base = base_given ? load_config(config_path, sets) : Config{};
  import_safetensors(in, checkpoint, base, base_given, tokenizer);
  std::cerr << "imported " << in << " into checkpoint " << checkpoint << "\n";
  return 0;
}

int run_ckpt_inspect(const std::string& dir, bool verify) {
  std::cout << describe_shards(dir, verify);
  return 0;
}

int run_ckpt_convert(const std::string& in, const std::string& out, const std::vector<std::string>& sets) {
  const std::string dir = convert_shards(in, out, sets);
  std::cerr << "converted " << in << " to " << dir << " (" << shard_layout(dir) << ")\n";
  return 0;
}

}  // namespace loom::cli
