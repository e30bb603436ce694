#include "loom/cli/elastic.h"

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>

#include "loom/cli/supervise.h"
#include "loom/core/elastic.h"
#include "loom/core/error.h"

namespace loom::cli {

// Note [Elastic launch]
// `--elastic MIN:MAX` (hosts) with `--hosts`: the job runs on the first MAX hosts of the list;
// the others are spares. When a run fails, the supervisor asks which ranks failed on their own
// account (gone without an exit code, or ended as hung, frozen or stopped: not the survivors it
// killed after them, nor ranks that exited with an error of their own, which no other host
// would mend) and drops their hosts. While MIN hosts remain (spares filling in up to MAX), it
// relaunches with no human step: the layout of Note [Elastic shapes] for the slots left, given
// as --set parallel.dp / train.grad_accum / parallel.micro_batch in place of the user's layout
// flags, and --resume auto in place of --resume and --overwrite, so the ranks reshard the
// newest complete checkpoint into the new layout. At most save_every steps are lost. A job
// with fewer than MIN hosts left stops with the failure's exit code; `--resume auto` continues it
// by hand later. Each re-forming is said on stderr with the hosts lost, the new layout and the
// seconds from the failure being seen to the relaunch.

namespace {

// argv less the options a relaunch sets itself (each with its value), then those.
std::vector<std::string> relaunch_args(int argc, char** argv, const ElasticShape& s) {
  const std::vector<std::string> with_value = {"--dp", "--grad-accum", "--micro-batch", "--resume"};
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (std::find(with_value.begin(), with_value.end(), a) != with_value.end()) {
      ++i;
      continue;
    }
    const bool joined = std::any_of(with_value.begin(), with_value.end(),
                                    [&](const std::string& f) { return a.rfind(f + "=", 0) == 0; });
    if (joined || a == "--overwrite") continue;
    out.push_back(a);
  }
  out.insert(out.end(), {"--resume", "auto", "--set", "parallel.dp=" + std::to_string(s.dp),
                         "train.grad_accum=" + std::to_string(s.grad_accum),
                         "parallel.micro_batch=" + std::to_string(s.micro_batch)});
  return out;
}

int launch(const std::vector<std::string>& args, const std::vector<HostSlots>& hosts, const Config& cfg,
           std::vector<int>* faulty) {
  std::vector<std::string> copy = args;
  std::vector<char*> cargs;
  for (std::string& a : copy) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  return launch_under_mpirun(total_slots(hosts), int(copy.size()), cargs.data(), cfg.comm.timeout_s, cfg.comm.hang_s,
                             hosts, faulty);
}

std::string describe(const std::vector<HostSlots>& hosts) {
  return std::to_string(hosts.size()) + (hosts.size() == 1 ? " host (" : " hosts (") + host_arg(hosts) + ")";
}

}  // namespace

int run_elastic(const std::vector<HostSlots>& hosts, const std::string& elastic, const Config& cfg, int argc,
                char** argv) {
  const ElasticRange range = parse_elastic(elastic);
  if (cfg.checkpoint.dir.empty() || cfg.checkpoint.save_every <= 0)
    throw ConfigError("--elastic re-forms a job from its newest checkpoint: set checkpoint.dir and --save-every N "
                      "(at most N steps are lost when a host fails)");
  if (int(hosts.size()) < range.min_hosts)
    throw ConfigError("--elastic " + elastic + ": --hosts " + host_arg(hosts) + " gives " + std::to_string(hosts.size()) +
                      " hosts, fewer than MIN " + std::to_string(range.min_hosts));
  std::vector<HostSlots> active(hosts.begin(), hosts.begin() + std::min<size_t>(hosts.size(), size_t(range.max_hosts)));
  std::vector<HostSlots> spares(hosts.begin() + ptrdiff_t(active.size()), hosts.end());
  if (total_slots(active) != cfg.parallel.ranks())
    throw ConfigError("--elastic: the first " + describe(active) + " give " + std::to_string(total_slots(active)) +
                      " slots but the layout " + cfg.parallel.shape_text() + " needs " +
                      std::to_string(cfg.parallel.ranks()) + " ranks");
  std::vector<std::string> args(argv, argv + argc);
  std::vector<HostSlots> running = active;  // the slots the job uses (a smaller dp takes the first)
  for (int round = 0;; ++round) {
    std::vector<int> faulty;
    const int rc = launch(args, running, cfg, &faulty);
    if (rc == 0 || faulty.empty()) return rc;  // done, or a failure no other host would mend
    const auto seen = std::chrono::steady_clock::now();
    const std::vector<std::string> of_rank = host_of_ranks(running);
    std::vector<std::string> lost;
    for (int r : faulty)
      if (std::find(lost.begin(), lost.end(), of_rank[size_t(r)]) == lost.end()) lost.push_back(of_rank[size_t(r)]);
    std::erase_if(active, [&](const HostSlots& h) { return std::count(lost.begin(), lost.end(), h.host) > 0; });
    while (int(active.size()) < range.max_hosts && !spares.empty()) active.push_back(spares.front()), spares.erase(spares.begin());
    std::string names;
    for (const std::string& h : lost) names += (names.empty() ? "" : ", ") + h;
    const ElasticShape shape = elastic_shape(cfg, total_slots(active));
    if (int(active.size()) < range.min_hosts || !shape.problem.empty()) {
      std::cerr << "loom: --elastic " << elastic << ": lost " << names << "; " << describe(active) << " left, "
                << (shape.problem.empty() ? "fewer than MIN " + std::to_string(range.min_hosts) : shape.problem)
                << ": stopping (continue later with --resume auto)\n";
      return rc;
    }
    running.clear();
    for (int64_t left = shape.ranks; const HostSlots& h : active)
      if (left > 0) running.push_back({h.host, int(std::min<int64_t>(h.slots, left))}), left -= running.back().slots;
    args = relaunch_args(argc, argv, shape);
    std::cerr << "loom: --elastic " << elastic << " (re-forming " << round + 1 << "): lost " << names
              << "; going on with " << describe(running) << ": dp " << shape.dp << ", grad_accum " << shape.grad_accum
              << ", micro-batch " << shape.micro_batch << ", from the newest checkpoint ("
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count()
              << " s after the failure was seen)\n";
  }
}

}  // namespace loom::cli
