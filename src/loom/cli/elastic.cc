#include "loom/cli/elastic.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "loom/cli/supervise.h"
#include "loom/core/elastic.h"
#include "loom/core/error.h"
#include "loom/train/memory_budget.h"

namespace loom::cli {

// Note [Elastic launch]
// `--elastic MIN:MAX` (hosts) with `--hosts`: the job runs on the first MAX hosts of the list;
// the others are spares. When a run fails, the supervisor asks which ranks failed on their own
// account (gone without an exit code, or ended as hung, frozen or stopped: not the survivors it
// killed after them, nor a rank on its own host gone after another's failure, or just before
// one on another host is seen gone (Note [Survivors] in core/survivors.h: MPI's own abort
// ends such a survivor at times; that host is up), nor ranks that exited with an error of their
// own, which no other host would mend) and drops their hosts. While MIN hosts remain (spares
// filling in up to MAX), it relaunches with no human step: the layout of Note [Elastic shapes]
// for the slots left, given as --set parallel.dp / train.grad_accum / parallel.micro_batch in
// place of the user's layout flags, and --resume auto in place of --resume and --overwrite, so
// the ranks reshard the newest complete checkpoint into the new layout: the hosts' in-memory
// one when it is whole and newer (Note [In-memory checkpoints]), else the disk's. At most
// save_every (memory_every) steps are lost. A job with fewer than MIN hosts left stops with the
// failure's exit code; `--resume auto` continues it by hand later. Each re-forming is said on
// stderr with the hosts lost, the new layout and the seconds from the failure being seen to the
// relaunch.
//
// Note [Elastic growth]
// A lost host is tried again comm.rejoin_s after its loss, and a host the hostfile gains
// (--hosts FILE is read again) at once. While the job runs the supervisor looks every 2 s:
// when the hosts that answer a probe (`mpirun --host H:1 -np 1 true`, within 20 s) would give
// a larger layout (Note [Elastic shapes]) within MAX hosts, it asks every rank to stop after its
// next checkpoint (a file for the ranks on its host, a line over TCP for the others; the ranks
// agree after each save with one all-reduce, so all stop after the same step, and exit 75) and
// relaunches on the larger set from that checkpoint: the job grows at a checkpoint boundary,
// losing no step.

namespace {

// argv less the options a relaunch sets itself (each with its value; a re-planned split's
// too), then those.
std::vector<std::string> relaunch_args(int argc, char** argv, const ElasticShape& s) {
  std::vector<std::string> with_value = {"--dp", "--grad-accum", "--micro-batch", "--resume"}, bare = {"--overwrite"};
  if (s.replanned) {
    with_value.insert(with_value.end(), {"--tp", "--pp", "--vpp", "--pp-layers", "--schedule", "--zero"});
    bare.push_back("--sp");
  }
  std::vector<std::string> out = without_options(argc, argv, 0, with_value, bare);
  out.insert(out.end(), {"--resume", "auto", "--set"});
  for (const std::string& set : s.sets()) out.push_back(set);
  return out;
}

int launch(const std::vector<std::string>& args, const std::vector<HostSlots>& hosts, const Config& cfg,
           std::vector<int>* faulty, const std::function<bool()>& want_stop) {
  std::vector<std::string> copy = args;
  std::vector<char*> cargs;
  for (std::string& a : copy) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  return launch_under_mpirun(total_slots(hosts), int(copy.size()), cargs.data(), cfg.comm.timeout_s, cfg.comm.hang_s,
                             hosts, faulty, want_stop);
}

std::string describe(const std::vector<HostSlots>& hosts) {
  return std::to_string(hosts.size()) + (hosts.size() == 1 ? " host (" : " hosts (") + host_arg(hosts) + ")";
}

// Note [In-memory checkpoints]: one rank a host of `hosts` makes their stores whole (gather:
// before a job that runs on fewer of the survivors than hold the copies) or removes them (drop:
// the hosts a finished job no longer ran on). A failure is said and the job goes on: its ranks
// fall back to what their hosts hold, then to the disk.
void memory_stores(const char* what, const std::vector<HostSlots>& hosts, const std::vector<std::string>& args,
                   const Config& cfg) {
  if (cfg.checkpoint.memory_every <= 0 || hosts.empty()) return;
  std::vector<HostSlots> one;
  for (const HostSlots& h : hosts) one.push_back({h.host, 1});
  ::setenv("LOOM_MEMORY_STORES", what, 1);
  const int rc = launch(args, one, cfg, nullptr, {});
  ::unsetenv("LOOM_MEMORY_STORES");
  if (rc != 0)
    std::cerr << "loom: --elastic: the in-memory stores' " << what << " on " << describe(one) << " exited " << rc
              << "; going on\n";
}

bool contains(const std::vector<HostSlots>& hosts, const std::string& h) {
  return std::any_of(hosts.begin(), hosts.end(), [&](const HostSlots& x) { return x.host == h; });
}

// The first `ranks` slots of `active`.
std::vector<HostSlots> first_slots(const std::vector<HostSlots>& active, int64_t ranks) {
  std::vector<HostSlots> out;
  for (int64_t left = ranks; const HostSlots& h : active)
    if (left > 0) out.push_back({h.host, int(std::min<int64_t>(h.slots, left))}), left -= out.back().slots;
  return out;
}

// Note [Elastic shapes]: the first shape for the slots of `active` whose ranks fit memory on
// the hosts they would run on (each host taken to have what this one has available now).
ElasticShape fitting_shape(const Config& cfg, const std::vector<HostSlots>& active) {
  const int64_t available = host_available_bytes();
  return elastic_shape(cfg, total_slots(active), [&](const ElasticShape& s) {
    return layout_memory_problem(with_shape(cfg, s), host_of_ranks(first_slots(active, s.ranks)), available);
  });
}

// Whether `host` takes a launch now (its name is checked by parse_hosts: no shell syntax).
bool answers(const std::string& host) {
  const std::string cmd = "timeout 20 mpirun --host " + host + ":1 -np 1 true >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Note [Elastic growth]: the hosts the job may grow onto now, each probed (in the background:
// the supervisor's loop goes on watching the job meanwhile).
class Growth {
 public:
  Growth(std::string spec, std::vector<HostSlots> known, double rejoin_s)
      : spec_(std::move(spec)), known_(std::move(known)),
        rejoin_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(rejoin_s))) {}
  void lost(const std::string& h) { retry_at_[h] = Clock::now() + rejoin_, answered_.erase(h); }
  // Polled while the job runs (`active`: the hosts it holds, `running_ranks` the ranks it runs):
  // true when answering hosts would give a larger layout; they are then in grown().
  bool ready(const Config& cfg, const std::vector<HostSlots>& active, int64_t running_ranks, int max_hosts) {
    if (Clock::now() < next_look_) return false;
    next_look_ = Clock::now() + std::chrono::seconds(2);
    if (std::ifstream(spec_)) try {
        known_ = parse_hosts(spec_);  // a hostfile may have gained hosts
      } catch (const Error&) {
      }
    std::vector<HostSlots> more = active;
    for (const HostSlots& h : known_) {
      if (contains(active, h.host)) continue;
      if (const auto retry = retry_at_.find(h.host); retry != retry_at_.end() && Clock::now() < retry->second) continue;
      if (answered_.count(h.host)) {
        if (int(more.size()) < max_hosts) more.push_back(h);
        continue;
      }
      auto& probe = probes_[h.host];
      if (!probe.valid()) {
        probe = std::async(std::launch::async, answers, h.host);
      } else if (probe.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        if (probe.get()) answered_.insert(h.host);
        else retry_at_[h.host] = Clock::now() + rejoin_;
      }
    }
    if (more.size() == active.size() || fitting_shape(cfg, more).ranks <= running_ranks) return false;
    grown_ = more;
    return true;
  }
  const std::vector<HostSlots>& grown() const { return grown_; }

 private:
  using Clock = std::chrono::steady_clock;
  std::string spec_;
  std::vector<HostSlots> known_, grown_;
  Clock::duration rejoin_;
  std::map<std::string, Clock::time_point> retry_at_;
  std::map<std::string, std::future<bool>> probes_;
  std::set<std::string> answered_;
  Clock::time_point next_look_{};
};

}  // namespace

namespace {

// Drops the hosts of `faulty` ranks (of `running`) from `active`, fills in from `spares`;
// returns the hosts dropped, for the log.
std::string drop_lost(const std::vector<int>& faulty, const std::vector<HostSlots>& running,
                      std::vector<HostSlots>& active, std::vector<HostSlots>& spares, int max_hosts, Growth& growth) {
  const std::vector<std::string> of_rank = host_of_ranks(running);
  std::string names;
  for (int r : faulty) {
    const std::string& h = of_rank[size_t(r)];
    if (!contains(active, h)) continue;
    std::erase_if(active, [&](const HostSlots& x) { return x.host == h; });
    growth.lost(h);
    names += (names.empty() ? "" : ", ") + h;
  }
  while (int(active.size()) < max_hosts && !spares.empty()) active.push_back(spares.front()), spares.erase(spares.begin());
  return names;
}

}  // namespace

int run_elastic(const std::string& spec, const std::vector<HostSlots>& hosts, const std::string& elastic,
                const Config& cfg, int argc, char** argv) {
  const ElasticRange range = parse_elastic(elastic);
  if (cfg.checkpoint.dir.empty() || (cfg.checkpoint.save_every <= 0 && cfg.checkpoint.memory_every <= 0))
    throw ConfigError("--elastic re-forms a job from its newest checkpoint: set checkpoint.dir and --save-every N, "
                      "or checkpoint.memory_every = N (at most N steps are lost when a host fails; Note [In-memory "
                      "checkpoints])");
  if (int(hosts.size()) < range.min_hosts)
    throw ConfigError("--elastic " + elastic + ": --hosts " + host_arg(hosts) + " gives " + std::to_string(hosts.size()) +
                      " hosts, fewer than MIN " + std::to_string(range.min_hosts));
  std::vector<HostSlots> active(hosts.begin(), hosts.begin() + std::min<size_t>(hosts.size(), size_t(range.max_hosts)));
  std::vector<HostSlots> spares(hosts.begin() + ptrdiff_t(active.size()), hosts.end());
  if (total_slots(active) != cfg.parallel.ranks())
    throw ConfigError("--elastic: the first " + describe(active) + " give " + std::to_string(total_slots(active)) +
                      " slots but the layout " + cfg.parallel.shape_text() + " needs " +
                      std::to_string(cfg.parallel.ranks()) + " ranks");
  Growth growth(spec, hosts, cfg.comm.rejoin_s);
  ::setenv("LOOM_ELASTIC", "1", 1);  // the ranks heed a request to stop (Note [Elastic growth])
  std::vector<std::string> args(argv, argv + argc);
  std::vector<HostSlots> running = active;  // the slots the job uses (a smaller dp takes the first)
  for (int round = 1;; ++round) {
    std::vector<int> faulty;
    const int64_t ranks = total_slots(running);
    const int rc = launch(args, running, cfg, &faulty, [&] { return growth.ready(cfg, active, ranks, range.max_hosts); });
    const auto seen = std::chrono::steady_clock::now();
    std::string why;
    if (rc == kStopToReform) {  // Note [Elastic growth]: stopped at a checkpoint to grow
      for (const HostSlots& h : growth.grown())
        if (!contains(active, h.host)) why += (why.empty() ? "grew onto " : ", ") + h.host;
      active = growth.grown();
    } else {
      if (rc == 0) {  // done: the stores of the hosts it no longer ran on go too
        std::vector<HostSlots> idle;
        for (const HostSlots& h : active)
          if (!contains(running, h.host)) idle.push_back(h);
        memory_stores("drop", idle, args, cfg);
      }
      if (rc == 0 || faulty.empty()) return rc;  // done, or a failure no other host would mend
      why = "lost " + drop_lost(faulty, running, active, spares, range.max_hosts, growth);
    }
    const ElasticShape shape = fitting_shape(cfg, active);
    if (int(active.size()) < range.min_hosts || !shape.problem.empty()) {
      std::cerr << "loom: --elastic " << elastic << ": " << why << "; " << describe(active) << " left, "
                << (shape.problem.empty() ? "fewer than MIN " + std::to_string(range.min_hosts) : shape.problem)
                << ": stopping (continue later with --resume auto)\n";
      return rc;
    }
    running = first_slots(active, shape.ranks);
    args = relaunch_args(argc, argv, shape);
    if (rc != kStopToReform) memory_stores("gather", active, args, cfg);
    std::cerr << "loom: --elastic " << elastic << " (re-forming " << round << "): " << why << "; going on with "
              << describe(running) << ": " << (shape.replanned ? "re-planned to " + shape.split_text() + ", " : "")
              << "dp " << shape.dp << ", grad_accum " << shape.grad_accum << ", micro-batch "
              << shape.micro_batch << ", from the newest checkpoint ("
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - seen).count()
              << " s after the job ended)\n";
  }
}

}  // namespace loom::cli
