#include "loom/ckpt/checkpoint.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/ckpt/run_dir.h"
#include "loom/core/safetensors.h"
#include "loom/ckpt/shard_ckpt.h"

namespace fs = std::filesystem;

namespace loom {

namespace {

StFile params_file(const ParamLayout& layout, const std::vector<float>& flat, const std::string& prefix) {
  StFile f;
  for (const ParamSpec& s : layout.specs()) f.tensors[prefix + s.name] = make_f32(s.shape, flat.data() + s.offset);
  return f;
}

void unpack_params(const StFile& f, const std::string& path, const ParamLayout& layout, const std::string& prefix,
                   std::vector<float>& flat) {
  flat.assign(layout.total_floats(), 0.0f);
  for (const ParamSpec& s : layout.specs()) {
    const StTensor& t = f.at(prefix + s.name, path);
    if (t.shape != s.shape)
      throw Error("checkpoint file '" + path + "': tensor '" + prefix + s.name + "' has shape " +
                  shape_string(t.shape) + " but the config needs " + shape_string(s.shape));
    if (t.dtype != DType::kF32)  // loom keeps fp32 masters; a narrower file lost their bits
      throw Error("checkpoint file '" + path + "': tensor '" + prefix + s.name + "' is not F32");
    const std::vector<float> v = t.as_f32();
    std::copy(v.begin(), v.end(), flat.begin() + s.offset);
  }
}

constexpr const char* kWholeFiles[] = {"state.json", "optim.safetensors", "config.toml", "model.safetensors"};

// Moves the files written into `made` into `dir`, model.safetensors (whose tag makes the
// four files a checkpoint) last; a file of the earlier whole-model checkpoint there
// (`had_whole`: proven loom's by the survey) that this one lacks is removed.
void publish_files(owned::TempDir& made, const std::string& dir, bool had_whole) {
  for (const char* f : kWholeFiles) {
    const std::string from = made.path() + "/" + f, to = dir + "/" + f;
    if (owned::kind_of(from) == owned::Kind::kFile) {
      if (::rename(from.c_str(), to.c_str()) != 0)
        throw Error("cannot move '" + from + "' to '" + to + "': " + std::strerror(errno));
    } else if (had_whole && owned::kind_of(to) == owned::Kind::kFile) {
      ::unlink(to.c_str());
    }
  }
  made.finish_empty();
  fsync_dir(dir);
}

}  // namespace

void save_checkpoint(const std::string& dir, const Config& config, const ParamLayout& layout,
                     const std::vector<float>& params, const std::vector<float>* m, const std::vector<float>* v,
                     const CheckpointState& state) {
  LOOM_CHECK(!dir.empty(), "checkpoint.dir is empty: nowhere to save");
  // Only a new, empty or whole-model checkpoint directory of loom's may receive one, and
  // never while a job holds it (Note [Checkpoint directory ownership]).
  check_new_target(dir, "checkpoint directory", true);
  const DirLock lock(dir);
  const DirSurvey before = check_new_target(dir, "checkpoint directory", true);  // again, under the lock
  remove_stale(before);
  require_free_space(dir, 4.0 * double(params.size()) * (m && v ? 3.0 : 1.0), "the checkpoint in '" + dir + "'",
                     "free space, or save it on another file system");
  owned::TempDir made(dir, "whole-checkpoint");  // removed unless every file is moved out
  const std::string tmp = made.path();
  write_file_atomic(tmp + "/config.toml", to_toml(config));
  StFile pf = params_file(layout, params, "");
  pf.metadata = {{"format", "loom-checkpoint-1"}, {"step", std::to_string(state.step)}};
  write_safetensors(tmp + "/model.safetensors", pf);
  if (m && v) {
    StFile of = params_file(layout, *m, "m.");
    StFile vf = params_file(layout, *v, "v.");
    of.tensors.merge(vf.tensors);
    write_safetensors(tmp + "/optim.safetensors", of);
  }
  nlohmann::json st = {{"step", state.step}, {"optimizer_steps", state.optimizer_steps}};
  write_file_atomic(tmp + "/state.json", st.dump(2) + "\n");
  publish_files(made, dir, before.whole);
}

CheckpointData load_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error("checkpoint '" + dir + "' is not a directory (expected one written by `loom train` or `loom import`)");
  // Sharded steps are newer than whole-model files beside them (a run resumed from an
  // imported or old-style checkpoint writes its steps into the same directory).
  if (fs::exists(dir + "/latest") || fs::exists(dir + "/manifest.json")) {
    WholeState w = load_whole(dir);
    CheckpointData out;
    out.config = std::move(w.config);
    out.params = std::move(w.params);
    out.m = std::move(w.m), out.v = std::move(w.v);
    out.state = {w.step, w.optimizer_steps};
    return out;
  }
  return load_whole_files(dir);
}

CheckpointData load_whole_files(const std::string& dir) {
  std::error_code ec;
  CheckpointData out;
  const std::string cfg_path = dir + "/config.toml";
  std::string text;
  try {
    text = read_file_bytes(cfg_path);
  } catch (const Error& e) {
    throw Error("checkpoint '" + dir + "' is unreadable: " + e.what());
  }
  try {
    out.config = config_from_toml_string(text);
  } catch (const Error& e) {
    throw Error("checkpoint config '" + cfg_path + "' is invalid: " + e.what());
  }
  const ParamLayout layout(out.config.model);
  const std::string model_path = dir + "/model.safetensors";
  unpack_params(read_safetensors(model_path), model_path, layout, "", out.params);
  const std::string optim_path = dir + "/optim.safetensors";
  if (fs::exists(optim_path, ec)) {
    const StFile of = read_safetensors(optim_path);
    out.m.emplace();
    out.v.emplace();
    unpack_params(of, optim_path, layout, "m.", *out.m);
    unpack_params(of, optim_path, layout, "v.", *out.v);
  }
  const std::string state_path = dir + "/state.json";
  if (fs::exists(state_path, ec)) {
    try {
      auto st = nlohmann::json::parse(read_file_bytes(state_path));
      out.state.step = st.at("step").get<int64_t>();
      out.state.optimizer_steps = st.at("optimizer_steps").get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw Error("checkpoint state '" + state_path + "' is malformed: " + e.what());
    }
  }
  return out;
}

}  // namespace loom
