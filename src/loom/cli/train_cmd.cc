// `loom train` (single process, under mpirun, or relaunching itself with --nproc) and
// `loom verify`.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/cli/commands.h"
#include "loom/comm/mpi_backend.h"
#include "loom/comm/world.h"
#include "loom/core/config.h"
#include "loom/core/error.h"
#include "loom/train/trainer.h"
#include "loom/train/verify.h"

#ifndef LOOM_MPIEXEC
#define LOOM_MPIEXEC "mpirun"
#endif

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

// Note [Supervised launch]
// `loom train --nproc N` runs `mpirun -np N <this binary> <args without --nproc>` as a
// child and waits for it. OpenMPI's mpirun kills every rank as soon as one dies, before
// the survivors can say which rank and which collective; with recovery enabled it lets
// them diagnose, but then exits 0 whatever the ranks did. So each rank writes its exit
// code to LOOM_STATUS_DIR/rank-R as it leaves, and the launcher exits non-zero naming any
// rank that failed or left no code at all (killed).
int launch_under_mpirun(int nproc, int argc, char** argv) {
  std::vector<std::string> args = {LOOM_MPIEXEC, "-np", std::to_string(nproc)};
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, size_t(n)) : std::string(argv[0]));
  for (int i = 1; i < argc; i++) {
    const std::string s = argv[i];
    if (s == "--nproc") {
      i++;
      continue;
    }
    if (s.rfind("--nproc=", 0) == 0) continue;
    args.push_back(s);
  }
  // OpenMPI refuses more ranks than cores and running as root unless told; --nproc is the
  // convenience path, so it asks for both (MPICH ignores these variables).
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  if (::geteuid() == 0) ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0), ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("OMPI_MCA_orte_enable_recovery", "1", 0);
  char tmpl[] = "/tmp/loom-status-XXXXXX";
  if (!::mkdtemp(tmpl)) throw Error(std::string("--nproc: cannot make a status directory: ") + std::strerror(errno));
  const std::string status_dir = tmpl;
  ::setenv("LOOM_STATUS_DIR", status_dir.c_str(), 1);
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  std::cerr.flush();
  const pid_t child = ::fork();
  if (child == 0) {
    ::execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "loom: error: --nproc: cannot run '%s' (%s); install OpenMPI (scripts/setup.sh) or launch "
                 "with mpirun yourself\n", LOOM_MPIEXEC, std::strerror(errno));
    ::_exit(127);
  }
  if (child < 0) throw Error(std::string("--nproc: fork failed: ") + std::strerror(errno));
  int wstatus = 0;
  while (::waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
  }
  const int launcher_rc = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  if (launcher_rc == 127) return 127;
  int rc = 0;
  std::string failed;
  for (int r = 0; r < nproc; ++r) {
    std::ifstream f(status_dir + "/rank-" + std::to_string(r));
    int code = -1;
    if (!(f >> code)) failed += "\n  rank " + std::to_string(r) + ": left no exit code (killed, or died in a signal)";
    else if (code != 0) failed += "\n  rank " + std::to_string(r) + ": exited " + std::to_string(code);
    if (code != 0 && rc == 0) rc = code > 0 ? code : 1;
    ::unlink((status_dir + "/rank-" + std::to_string(r)).c_str());
  }
  ::rmdir(status_dir.c_str());
  if (rc == 0 && launcher_rc != 0) rc = launcher_rc;
  if (!failed.empty()) std::cerr << "loom: --nproc " << nproc << ": the job failed:" << failed << "\n";
  return rc;
}

// Under a supervised launch, records this rank's exit code (Note [Supervised launch]).
void record_exit(int code) {
  const char* dir = std::getenv("LOOM_STATUS_DIR");
  if (!dir || !comm::launched_by_mpi()) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank) rank = std::getenv("PMI_RANK");
  if (!rank) return;
  std::ofstream(std::string(dir) + "/rank-" + rank) << code << "\n";
}

int train_this_rank(const TrainArgs& a, const Config& cfg) {
  TrainOptions opt;
  opt.json = a.json;
  opt.progress = !a.json && ::isatty(STDERR_FILENO) && ::isatty(STDOUT_FILENO);
  opt.out = &std::cout;
  opt.err = &std::cerr;
  opt.trace_path = a.trace;
  opt.resume = a.resume;
  TrainSummary s;
  bool logging = true;
  if (comm::launched_by_mpi()) {
    comm::CommOptions co;
    co.timeout = std::chrono::milliseconds(int64_t(cfg.comm.timeout_s * 1000));
    co.check_desync = cfg.comm.check_desync;
    comm::World world(comm::make_mpi_backend(), co);
    logging = world.global_rank() == 0;
    s = world.world_size() > 1 ? train(cfg, opt, world) : train(cfg, opt);
  } else {
    s = train(cfg, opt);
  }
  if (!a.json && logging)
    std::cerr << "done: final val_loss " << s.final_val_loss << " nats (unigram entropy " << s.unigram_entropy
              << "), " << int64_t(s.tokens_per_s) << " tokens/s\n";
  return 0;
}

}  // namespace

int run_train(const TrainArgs& a, int argc, char** argv) {
  std::vector<std::string> sets = a.sets;
  for (auto& s : a.layout.as_sets()) sets.push_back(s);
  if (a.save_every >= 0) sets.push_back("checkpoint.save_every=" + std::to_string(a.save_every));
  const Config cfg = load_config(a.config_path, sets);  // config errors surface before any launch
  if (a.nproc > 0) {
    if (comm::launched_by_mpi()) throw ConfigError("--nproc " + std::to_string(a.nproc) + " under mpirun: use one");
    if (a.nproc != cfg.parallel.world())
      throw ConfigError("--nproc " + std::to_string(a.nproc) + " but the layout dp x tp x pp = " +
                        std::to_string(cfg.parallel.dp) + " x " + std::to_string(cfg.parallel.tp) + " x " +
                        std::to_string(cfg.parallel.pp) + " needs " + std::to_string(cfg.parallel.world()) +
                        " ranks; pass --dp " + std::to_string(a.nproc) + " or --nproc " +
                        std::to_string(cfg.parallel.world()));
    if (a.nproc > 1) return launch_under_mpirun(a.nproc, argc, argv);
  }
  try {
    train_this_rank(a, cfg);
  } catch (const Error& e) {
    record_exit(e.kind() == Error::Kind::kConfig ? 2 : 1);
    throw;
  } catch (...) {
    record_exit(1);
    throw;
  }
  record_exit(0);
  return 0;
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
  std::cerr << "loom verify: " << layouts.size() << " layouts x " << base.train.steps << " steps of '"
            << base.model.preset << "' (global batch " << base.train.batch
            << ") against the single-process run; ranks run as threads\n";
  const std::vector<VerifyRow> rows = verify_layouts(base, layouts);
  int bad = 0;
  if (!a.json)
    std::cout << std::left << std::setw(36) << "layout" << std::right << std::setw(16) << "max loss rel"
              << std::setw(16) << "max weight abs" << "  result\n";
  for (const VerifyRow& r : rows) {
    bad += !r.ok;
    if (a.json) {
      std::cout << nlohmann::json{{"layout", r.layout}, {"max_loss_rel", r.max_loss_rel},
                                  {"max_weight_abs", r.max_weight_abs}, {"ok", r.ok}, {"error", r.error}}
                       .dump()
                << "\n";
      continue;
    }
    std::ostringstream l, w;
    l << std::scientific << std::setprecision(2) << r.max_loss_rel;
    w << std::scientific << std::setprecision(2) << r.max_weight_abs;
    std::cout << std::left << std::setw(36) << r.layout << std::right << std::setw(16) << (r.error.empty() ? l.str() : "-")
              << std::setw(16) << (r.error.empty() ? w.str() : "-") << "  "
              << (r.ok ? "ok" : r.error.empty() ? "MISMATCH" : "FAILED: " + r.error) << "\n";
  }
  if (bad) std::cerr << "loom verify: " << bad << " of " << rows.size() << " layouts do not match (loss rel <= 1e-5, weights <= 1e-4)\n";
  return bad ? 1 : 0;
}

}  // namespace loom::cli
