// `loom train` (single process, under mpirun, or relaunching itself with --nproc) and
// `loom verify`.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/cli/commands.h"
#include "loom/cli/elastic.h"
#include "loom/cli/supervise.h"
#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"
#include "loom/train/preflight.h"
#include "loom/core/hosts.h"
#include "loom/core/liveness.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/core/owned.h"
#include "loom/ckpt/memory_ckpt.h"
#include "loom/ckpt/run_dir.h"
#include "loom/train/trainer.h"
#if LOOM_CUDA
#include "loom/cuda/train.h"
#endif
#include "loom/train/verify.h"

namespace loom::cli {

std::vector<std::string> LayoutFlags::as_sets() const {
  std::vector<std::string> out;
  auto num = [&](const char* key, int64_t v) {
    if (v >= 0) out.push_back(std::string(key) + "=" + std::to_string(v));
  };
  num("parallel.dp", dp), num("parallel.tp", tp), num("parallel.pp", pp), num("parallel.vpp", vpp);
  num("parallel.zero", zero), num("parallel.micro_batch", micro_batch), num("train.grad_accum", grad_accum);
  if (sp) out.push_back("parallel.sp=true");
  if (!schedule.empty()) out.push_back("parallel.schedule=" + schedule);
  if (!recompute.empty()) out.push_back("parallel.recompute=" + recompute);
  if (!pp_layers.empty()) out.push_back("parallel.pp_layers=" + pp_layers);
  return out;
}

namespace {

// world: a data-parallel GPU run's ranks (nullptr: one process).
TrainSummary train_on_device(const Config& cfg, const TrainOptions& opt, comm::World* world) {
#if LOOM_CUDA
  return cuda::train(cfg, opt, world);
#else
  (void)opt, (void)world;
  throw ConfigError(std::string("train.device = ") + name_of(cfg.train.device) + ": this loom was built without CUDA; rebuild with "
                    "`cmake --preset cuda && cmake --build --preset cuda` (needs nvcc), or use train.device = cpu");
#endif
}

// Note [In-memory checkpoints]: a launch of one rank a host by the --elastic supervisor that
// makes the hosts' stores whole (gather) or removes them (drop), and trains nothing.
int memory_stores(const Config& cfg, comm::World& world, const std::string& what) {
  if (what != "gather" && what != "drop") throw ConfigError("LOOM_MEMORY_STORES = '" + what + "': expected gather or drop");
  if (what == "drop") {
    drop_memory(cfg, &world.world_group());
  } else if (const std::optional<MemoryStep> m = restore_memory(cfg, &world.world_group()); m && world.global_rank() == 0) {
    std::cerr << "loom: in-memory checkpoint of step " << m->step << " made whole on " << world.world_size()
              << " hosts\n";
  }
  record_exit(0);
  return 0;
}

// Note [Start deadline]
// MPI_Init waits for every rank of the job (OpenMPI's PMIx fence). When a rank's host is lost
// while the job starts (an --elastic job re-forming loses another host), the ranks already in
// MPI_Init can wait there for good: loom's collectives, bounded by comm.timeout_s, have not
// begun, and a spinning rank uses CPU time, so its heartbeats do not call it hung. So the
// world's start-up runs under a deadline of max(comm.timeout_s, 30 s): past it the rank says
// so on stderr, records exit code 1 for its supervisor and leaves. The supervisor then ends
// the job as after any failure, and counts a rank that never beat (it never started: its host
// is gone) as failed on its own account, so an --elastic job re-forms without that host.
double start_deadline_s(const Config& cfg) { return std::max(cfg.comm.timeout_s, 30.0); }

void start_overdue() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  std::fprintf(stderr,
               "loom: rank %s: MPI start-up did not finish within max(comm.timeout_s, 30) s: a rank of the job did "
               "not start or its host is unreachable; stopping this rank\n",
               rank ? rank : "?");
  std::fflush(stderr);
  record_exit(1);
  ::_exit(1);
}

int train_this_rank(const TrainArgs& a, const Config& cfg) {
  TrainOptions opt;
  opt.json = a.json, opt.csv = a.csv;
  opt.progress = !a.json && !a.csv && ::isatty(STDERR_FILENO) && ::isatty(STDOUT_FILENO);
  opt.out = &std::cout;
  opt.err = &std::cerr;
  opt.trace_path = a.trace;
  opt.resume = a.resume;
  opt.overwrite = a.overwrite;
  TrainSummary s;
  bool logging = true;
  const bool gpu = cfg.train.device == Device::kCuda;
  if (comm::launched_by_mpi()) {
    join_supervisor();
    if (std::getenv("LOOM_ELASTIC")) opt.stop_requested = stop_requested;  // Note [Elastic growth]
    comm::CommOptions co;
    co.timeout = std::chrono::milliseconds(int64_t(cfg.comm.timeout_s * 1000));
    co.check_desync = cfg.comm.check_desync;
    std::optional<liveness::Deadline> deadline(std::in_place, start_deadline_s(cfg), start_overdue);
    comm::World world(comm::make_mpi_backend(), co);
    deadline.reset();
    if (const char* stores = std::getenv("LOOM_MEMORY_STORES")) return memory_stores(cfg, world, stores);
    if (world.world_size() > 1) preflight(world, cfg);  // Note [Preflight]
    logging = world.global_rank() == 0;
    comm::World* many = world.world_size() > 1 ? &world : nullptr;
    s = gpu ? train_on_device(cfg, opt, many) : many ? train(cfg, opt, world) : train(cfg, opt);
    // The work is done: said before MPI_Finalize, which waits on mpirun (Note [Supervised launch]).
    record_exit(s.stopped_at > 0 ? kStopToReform : 0);
  } else {
    s = gpu ? train_on_device(cfg, opt, nullptr) : train(cfg, opt);
  }
  if (!a.json && !a.csv && logging && s.losses.empty())  // resumed at its last step: no figures to give
    std::cerr << "done: nothing to train (the checkpoint is at train.steps = " << cfg.train.steps
              << "; raise train.steps to continue)\n";
  else if (!a.json && !a.csv && logging && s.stopped_at == 0)
    std::cerr << "done: final val_loss " << s.final_val_loss << " nats (unigram entropy " << s.unigram_entropy
              << "), " << int64_t(s.tokens_per_s) << " tokens/s\n";
  return s.stopped_at > 0 ? kStopToReform : 0;
}

}  // namespace

int run_train(const TrainArgs& a, int argc, char** argv) {
  std::vector<std::string> sets = a.sets;
  for (auto& s : a.layout.as_sets()) sets.push_back(s);
  if (a.save_every >= 0) sets.push_back("checkpoint.save_every=" + std::to_string(a.save_every));
  if (!a.precision.empty()) sets.push_back("train.precision=" + a.precision);
  if (!a.device.empty()) sets.push_back("train.device=" + a.device);
  const Config cfg = load_config(a.config_path, sets);  // config errors surface before any launch
  if (!comm::launched_by_mpi()) {  // refused before any launch; rank 0 checks again under the lock
    check_output_file(a.trace, "--trace", a.overwrite, owned::marks::kTrace);
    check_run_dir(cfg.checkpoint.dir, !a.resume.empty(), a.overwrite);
  }
  if (a.nproc > 0 || !a.hosts.empty() || !a.elastic.empty()) {
    const std::string flag = a.hosts.empty() ? "--nproc" : "--hosts";
    if (comm::launched_by_mpi()) throw ConfigError(flag + " under mpirun: use one");
    const std::vector<HostSlots> hosts = a.hosts.empty() ? std::vector<HostSlots>{} : parse_hosts(a.hosts);
    if (!a.elastic.empty()) {
      if (hosts.empty()) throw ConfigError("--elastic " + a.elastic + " needs --hosts (the hosts it may run on)");
      if (a.nproc > 0) throw ConfigError("--elastic: drop --nproc (the hosts' slots are the ranks)");
      return run_elastic(a.hosts, hosts, a.elastic, cfg, argc, argv);
    }
    const int nproc = hosts.empty() ? a.nproc : total_slots(hosts);
    if (!hosts.empty() && a.nproc > 0 && a.nproc != nproc)
      throw ConfigError("--nproc " + std::to_string(a.nproc) + " but --hosts " + host_arg(hosts) + " gives " +
                        std::to_string(nproc) + " slots; drop --nproc (the slots are the ranks) or change the slots");
    const ParallelConfig& p = cfg.parallel;
    const std::string what = hosts.empty() ? "--nproc " + std::to_string(nproc)
                                           : "--hosts " + host_arg(hosts) + " (" + std::to_string(nproc) + " slots)";
    if (nproc != p.ranks())
      throw ConfigError(what + " but the layout " + p.shape_text() + " needs " + std::to_string(p.ranks()) +
                        " ranks; pass " + (p.dp_for(nproc) > 0 ? "--dp " + std::to_string(p.dp_for(nproc)) + " or " : "") +
                        (hosts.empty() ? "--nproc " + std::to_string(p.ranks()) : std::string("hosts with that many slots")));
    if (nproc > 1 || !hosts.empty()) {
      if (hosts.empty() && nproc > int(::sysconf(_SC_NPROCESSORS_ONLN)))
        std::cerr << "loom: warning: --nproc " << nproc << " starts " << nproc << " ranks on "
                  << ::sysconf(_SC_NPROCESSORS_ONLN) << " cores: they will take turns on them, and every step waits "
                  << "for the slowest (set train.threads = 1, or use fewer ranks)\n";
      return launch_under_mpirun(nproc, argc, argv, cfg.comm.timeout_s, cfg.comm.hang_s, hosts);
    }
  }
  int code = 0;
  try {
    code = train_this_rank(a, cfg);
  } catch (const Error& e) {
    record_exit(e.kind() == Error::Kind::kConfig ? 2 : 1);
    throw;
  } catch (...) {
    record_exit(1);
    throw;
  }
  record_exit(code);
  return code;
}

int run_verify(const VerifyArgs& a) {
  std::string list = a.configs;
  if (std::ifstream f(a.configs); f && a.configs.find('=') == std::string::npos) {
    std::string line;
    list.clear();
    while (std::getline(f, line))
      if (!line.empty() && line[0] != '#') list += line + ";";
  }
  const auto layouts = parse_layout_list(list);
  std::vector<std::string> sets = {"train.steps=" + std::to_string(a.steps), "train.threads=1", "train.val_every=0",
                                   "checkpoint.dir="};
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  const Config base = load_config(a.config_path, sets);
  for (const auto& layout : layouts) {  // an invalid layout is a usage error, refused before any run
    std::string named;
    for (const std::string& kv : layout) named += (named.empty() ? "" : ",") + kv;
    try {
      const Config c = config_from_toml_string(to_toml(base), layout);
      if (c.train.batch != base.train.batch)
        throw ConfigError("it changes train.batch from " + std::to_string(base.train.batch) + " to " +
                          std::to_string(c.train.batch) + ": compare layouts at one global batch");
    } catch (const ConfigError& e) {
      throw ConfigError("verify: layout '" + named + "': " + e.what());
    }
  }
  std::cerr << "loom verify: " << layouts.size() << " layouts x " << base.train.steps << " steps of '"
            << base.model.preset << "' (global batch " << base.train.batch
            << ") against the single-process run (2bw, pipedream and pipemare: their own references, named below "
               "the table); ranks run as threads\n";
  const std::vector<VerifyRow> rows = verify_layouts(base, layouts);
  int bad = 0;
  if (!a.json)
    std::cout << std::left << std::setw(36) << "layout" << std::right << std::setw(16) << "max loss rel"
              << std::setw(16) << "max weight abs" << std::setw(20) << "bound (loss, w)" << "  result\n";
  for (const VerifyRow& r : rows) {
    bad += !r.ok;
    if (a.json) {
      std::cout << nlohmann::json{{"layout", r.layout}, {"max_loss_rel", r.max_loss_rel},
                                  {"max_weight_abs", r.max_weight_abs}, {"loss_rel_bound", r.tolerance.loss_rel},
                                  {"weight_abs_bound", std::isfinite(r.tolerance.weight_abs) ? nlohmann::json(r.tolerance.weight_abs)
                                                                                             : nlohmann::json(nullptr)},
                                  {"reference", r.reference}, {"ok", r.ok}, {"error", r.error}}
                       .dump()
                << "\n";
      continue;
    }
    std::ostringstream l, w, b;
    l << std::scientific << std::setprecision(2) << r.max_loss_rel;
    w << std::scientific << std::setprecision(2) << r.max_weight_abs;
    b << std::setprecision(2) << r.tolerance.loss_rel << ", "
      << (std::isfinite(r.tolerance.weight_abs) ? (std::ostringstream() << r.tolerance.weight_abs).str() : "-");
    std::cout << std::left << std::setw(36) << r.layout << std::right << std::setw(16) << (r.error.empty() ? l.str() : "-")
              << std::setw(16) << (r.error.empty() ? w.str() : "-") << std::setw(20) << b.str() << "  "
              << (r.ok ? "ok" : r.error.empty() ? "MISMATCH" : "FAILED: " + r.error) << "\n";
  }
  for (const VerifyRow& r : rows)  // Note [Verify references]
    if (!a.json && r.reference != VerifyRow{}.reference)
      std::cout << "  " << r.layout << ": against " << r.reference << "\n";
  if (bad)
    std::cerr << "loom verify: " << bad << " of " << rows.size()
              << " layouts do not match (exact layouts: loss rel <= 1e-5, weights <= 1e-4; compressed gradients: the bound "
                 "shown per layout, Note [Verify tolerances])\n";
  return bad ? 1 : 0;
}

}  // namespace loom::cli
