#include "loom/cli/commands.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/run_dir.h"
#include "loom/train/plot.h"
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
  if (a.logits) {  // {"step": i, "logits": [...]} per token, %.9g: every float's bits survive
    o.on_logits = [](int64_t step, std::span<const float> logits) {
      std::string line = "{\"step\": " + std::to_string(step) + ", \"logits\": [";
      char buf[32];
      for (size_t j = 0; j < logits.size(); j++) {
        std::snprintf(buf, sizeof buf, j ? ", %.9g" : "%.9g", double(logits[j]));
        line += buf;
      }
      std::cout << line << "]}\n";
    };
    sample(a.checkpoint, o, [](std::string_view) {});
    return 0;
  }
  // Each piece as it is sampled (Note [Streaming decode]), so a long --tokens shows progress.
  sample(a.checkpoint, o, [](std::string_view piece) { std::cout << piece << std::flush; });
  std::cout << std::endl;
  return 0;
}

int run_export(const std::string& checkpoint, const std::string& format, const std::string& out,
               const std::string& dtype, bool overwrite, double max_shard_mb) {
  if (format != "auto" && format != "safetensors" && format != "hf")
    throw ConfigError("--format '" + format + "': expected hf (a model directory), safetensors (one file) or auto");
  require_path(checkpoint, "--checkpoint");
  const bool file_name = out.size() >= 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
  if (format == "hf" || (format == "auto" && !file_name)) {  // Note [Hugging Face directories]
    LOOM_CONFIG_CHECK(!overwrite, "export --overwrite with a directory --out '", out,
                      "': a model directory is written only at a new path or into an empty directory");
    const std::string what = export_hf_dir(checkpoint, out, dtype, max_shard_mb);
    std::cerr << "exported " << checkpoint << " to the model directory " << out << " (" << dtype << "; " << what << ")\n";
    return 0;
  }
  check_output_file(out, "export --out", overwrite, owned::marks::kSafetensors);
  export_safetensors(checkpoint, out, dtype);
  std::cerr << "exported " << checkpoint << " to " << out << " (" << dtype << ")\n";
  return 0;
}

int run_import(const std::string& format, const std::string& in, const std::string& checkpoint,
               const std::string& config_path, const std::vector<std::string>& sets, const std::string& tokenizer) {
  if (format != "auto" && format != "safetensors" && format != "hf")
    throw ConfigError("--format '" + format + "': expected hf (a model directory), safetensors (one file) or auto");
  require_path(in, "--in");
  const bool dir = owned::kind_of(in) == owned::Kind::kDir;
  if (dir != (format != "safetensors") && format != "auto")
    throw ConfigError("import --in '" + in + "' is " + (dir ? "a directory" : "not a directory") + " but --format is " +
                      format + "; drop --format (the kind of --in decides)");
  check_new_target(checkpoint, "import --checkpoint", true);  // before reading a large file
  const bool base_given = !config_path.empty() || !sets.empty();
  // Without a config, import starts from a "custom" model whose keys come from the file.
  const Config base = base_given ? load_config(config_path, sets) : Config{};
  if (dir) import_hf_dir(in, checkpoint, base, base_given, tokenizer);
  else import_safetensors(in, checkpoint, base, base_given, tokenizer);
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

int run_plot(const std::vector<std::string>& runs, const std::string& out, const std::string& metrics, bool overwrite) {
  const auto ends = [&](const char* ext) { return out.size() > 4 && out.compare(out.size() - 4, 4, ext) == 0; };
  LOOM_CONFIG_CHECK(ends(".svg") || ends(".png"), "plot --out '", out, "': name FILE.svg or FILE.png");
  const bool png = ends(".png");
  check_output_file(out, "plot --out", overwrite, png ? owned::marks::kPng : owned::marks::kSvg);  // before any work
  std::vector<std::string> names;
  for (std::string rest = metrics; !rest.empty();) {
    const size_t comma = rest.find(',');
    if (const std::string m = rest.substr(0, comma); !m.empty()) names.push_back(m);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  LOOM_CONFIG_CHECK(!names.empty(), "plot --metrics '", metrics, "': name at least one (e.g. loss,val_loss)");
  std::vector<RunSeries> series;
  for (const std::string& r : runs) {
    require_path(r, "plot RUN");
    std::string label = std::filesystem::path(r).stem().string();
    for (const std::string& other : runs)  // two runs of one name: their paths tell them apart
      if (other != r && std::filesystem::path(other).stem() == label) label = r;
    series.push_back(read_run_log(r, label));
  }
  const std::string svg = plot_svg(series, names);
  write_file_atomic(out, png ? svg_to_png(svg) : svg);  // Note [User-named outputs]
  std::cerr << "wrote " << out << " (" << names.size() << " panels, " << runs.size() << " runs)\n";
  return 0;
}

}  // namespace loom::cli
