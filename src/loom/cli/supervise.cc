// Note [Supervised launch]
// `loom train --nproc N` runs `mpirun -np N <this binary> <args without --nproc>` as a
// child and supervises it:
//  - OpenMPI's mpirun kills every rank as soon as one dies, before the survivors can say
//    which rank and which collective; with recovery enabled it lets them diagnose, but
//    then exits 0 whatever the ranks did. So each rank writes its pid to
//    LOOM_STATUS_DIR/pid-R when it starts and its exit code to LOOM_STATUS_DIR/rank-R as it
//    leaves, and the supervisor exits non-zero naming any rank that failed or left no code.
//  - A rank that fails starts a grace period of min(comm.timeout_s, 10 s) for the others to
//    diagnose and leave; ranks still alive after it (hung, or stopped with SIGSTOP) are
//    SIGKILLed and named. A survivor that diagnoses a dead same-host peer leaves in
//    about 0.5 s, and one that waits on a hung peer leaves within comm.timeout_s, which
//    starts before the first failure; so the grace never cuts a diagnosis short.
//  - The job dies with its supervisor: SIGINT, SIGTERM or SIGHUP to the supervisor
//    SIGKILLs mpirun and every rank; if the supervisor itself is SIGKILLed, mpirun gets
//    SIGKILL from the kernel (PR_SET_PDEATHSIG) and each rank's watcher thread sees the
//    supervisor gone within 0.1 s and ends the rank. The checkpoint directory's lock
//    (Note [Checkpoint directory ownership]) dies with rank 0, so a restart can go on.
//  - Each rank records its exit code as soon as its work is done, before MPI_Finalize
//    (which waits on mpirun), and again after it. mpirun that outlives every rank's record
//    by 5 s, or mpirun or a rank that stays stopped (SIGSTOP, state T) for 10 s while the
//    job runs, ends the job: mpirun and every rank still there are SIGKILLed and the cause
//    named; the job's exit code is then the ranks' (0 when they all finished their work,
//    non-zero when one was killed before it had). A stopped rank would otherwise hold every
//    collective until comm.timeout_s (300 s by default).
//  - A rank that hangs while it runs ends the job within comm.hang_s (Note [Heartbeats]).
//  - `--hosts` runs the ranks across hosts under the same checks: a rank on another host than
//    the supervisor's reports over TCP instead of the status files and is named with its host
//    (Note [Status over TCP] in core/status_link.h); the ranks that failed on their own account
//    are told apart from the survivors killed after them, for --elastic (Note [Elastic launch]).
//
// Note [Heartbeats]
// Each rank of a supervised job writes LOOM_STATUS_DIR/beat-R once a second from a thread of
// its own: a sequence number, the process's CPU time, and how many waits it has in flight
// (liveness::waits_in_flight: collective and point-to-point calls from issue to completion,
// file syncs). The supervisor reads them: a rank whose beats stop for 15 s is frozen (its
// threads cannot run; a SIGSTOPped one is named as stopped after 10 s) and ends the job; a rank whose
// beats go on but whose CPU time stays flat (under 50 ms a beat) with no wait in flight for
// comm.hang_s (25 s, so the job ends within 30 s; 0: off) is hung (blocked in its own code: a deadlock, a read that never
// returns) and ends the job, named with its last step. A long collective is never taken for
// a hang: a rank in one has a wait in flight, and its peers are either in it too or
// computing (CPU time); the collective's own bound is comm.timeout_s. A rank that spins
// without progress uses CPU time and is found by that timeout instead.
#include "loom/cli/supervise.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/mpi_backend.h"
#include "loom/core/error.h"
#include "loom/core/liveness.h"
#include "loom/core/status_link.h"
#include "loom/core/survivors.h"

#ifndef LOOM_MPIEXEC
#define LOOM_MPIEXEC "mpirun"
#endif

namespace loom::cli {

std::vector<std::string> without_options(int argc, char** argv, int first, const std::vector<std::string>& with_value,
                                         const std::vector<std::string>& bare) {
  auto among = [](const std::vector<std::string>& names, const std::string& a) {
    return std::find(names.begin(), names.end(), a) != names.end();
  };
  std::vector<std::string> out;
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (among(with_value, a)) {
      ++i;
      continue;
    }
    const bool joined = std::any_of(with_value.begin(), with_value.end(),
                                    [&](const std::string& f) { return a.rfind(f + "=", 0) == 0; });
    if (!joined && !among(bare, a)) out.push_back(a);
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_signal = 0;  // async-signal-safe flag only; not a process group
void on_signal(int sig) { g_signal = sig; }

// A process that exists and is not a zombie.
bool alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

int read_int(const std::string& path, int missing) {
  std::ifstream f(path);
  int v = missing;
  if (!(f >> v)) return missing;
  return v;
}

// `hosts` (--hosts): mpirun's --host, and the variables ranks on other hosts need (mpirun
// passes its environment only to the ranks on its own host; -x forwards the named ones).
std::vector<std::string> mpirun_args(int nproc, int argc, char** argv, const std::vector<HostSlots>& hosts) {
  std::vector<std::string> args = {LOOM_MPIEXEC, "-np", std::to_string(nproc)};
  if (!hosts.empty()) {
    args.insert(args.end(), {"--host", host_arg(hosts)});
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e, name = kv.substr(0, kv.find('='));
      const bool omp = name == "OMP_NUM_THREADS" || name == "OMP_WAIT_POLICY" || name == "GOMP_SPINCOUNT";
      if (name.rfind("LOOM_", 0) == 0 || name.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) == 0 || omp)
        args.insert(args.end(), {"-x", name});
    }
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  args.push_back(n > 0 ? std::string(self, size_t(n)) : std::string(argv[0]));
  for (std::string& a : without_options(argc, argv, 1, {"--nproc", "--hosts", "--elastic"})) args.push_back(std::move(a));
  return args;
}

// mpirun's stderr passes through the supervisor line by line, less the "PMIX ERROR:
// BAD-PARAM ... pmix_event_notification.c" line OpenMPI 4.1 prints whenever a job with
// recovery enabled loses a rank (noise: the ranks' own diagnoses say what happened).
class StderrRelay {
 public:
  explicit StderrRelay(int fd) : fd_(fd) {}
  // Relays what arrives within `wait_ms`; false once mpirun's side is closed.
  bool pump(int wait_ms) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, wait_ms) <= 0) return true;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) {
      flush(true);
      ::close(fd_);
      fd_ = -1;
      return false;
    }
    pending_.append(buf, size_t(n));
    flush(false);
    return true;
  }

 private:
  void flush(bool all) {
    size_t start = 0;
    for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) emit(pending_.substr(start, nl + 1 - start));
    pending_.erase(0, start);
    if (all && !pending_.empty()) emit(pending_ + "\n"), pending_.clear();
  }
  static void emit(const std::string& line) {
    if (line.find("PMIX ERROR: BAD-PARAM") != std::string::npos && line.find("pmix_event_notification.c") != std::string::npos)
      return;
    for (size_t done = 0; done < line.size();) {
      const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
      if (n <= 0) return;
      done += size_t(n);
    }
  }
  int fd_;
  std::string pending_;
};

pid_t start_mpirun(std::vector<std::string> args, int stderr_fd) {
  std::vector<char*> cargs;
  for (auto& s : args) cargs.push_back(s.data());
  cargs.push_back(nullptr);
  std::cerr.flush();
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);     // the job dies with its supervisor
    if (::getppid() != parent) ::_exit(1);  // it already did
    if (stderr_fd >= 0) ::dup2(stderr_fd, STDERR_FILENO);
    ::execvp(cargs[0], cargs.data());
    std::fprintf(stderr, "loom: error: --nproc: cannot run '%s' (%s); install OpenMPI (scripts/setup.sh) or launch "
                 "with mpirun yourself\n", LOOM_MPIEXEC, std::strerror(errno));
    ::_exit(127);
  }
  if (child < 0) throw Error(std::string("--nproc: fork failed: ") + std::strerror(errno));
  return child;
}

// Where the ranks run (Note [Status over TCP]): their hosts as --hosts names them, and the
// channel to those on other hosts (null under --nproc: every rank is local).
struct Placement {
  StatusServer* server = nullptr;
  std::vector<std::string> hosts;  // per rank (empty: --nproc)
  // "rank R on host H (pid P)"; the pid of a local rank only.
  std::string name(size_t r, pid_t pid) const {
    std::string s = "rank " + std::to_string(r);
    if (r < hosts.size()) s += " on host " + hosts[r];
    return pid > 0 ? s + " (pid " + std::to_string(pid) + ")" : s;
  }
  bool lost(size_t r) const { return server && server->lost(int(r)); }
  // SIGKILL to a local rank; "kill" to a remote one.
  void kill(size_t r, pid_t pid) const {
    if (pid > 0 && alive(pid)) ::kill(pid, SIGKILL);
    else if (server) server->kill(int(r));
  }
  // Note [Elastic growth]: asks every rank to stop after its next checkpoint (local ranks read
  // the file `stop`, remote ones are told).
  void request_stop(const std::string& status_dir, int nproc) const {
    std::ofstream(status_dir + "/stop") << "stop\n";
    for (int r = 0; server && r < nproc; ++r) server->send(r, "stop");
  }
};

// What the supervisor saw of the job while it ran.
struct Watch {
  std::string killed;  // lines naming the ranks it had to kill
  // Ranks that failed on their own account (Note [Survivors] in core/survivors.h): gone
  // without an exit code before the supervisor killed anything, or ended as stuck (hung,
  // frozen, stopped); not the survivors it killed.
  std::vector<char> faulty;
  int signal = 0;      // the signal that stopped the supervisor, if any
  bool launcher_stuck = false;  // the job was ended as stuck (check_stuck)
};

// How long mpirun may outlive the last of its ranks (it normally exits within a second;
// a stopped or wedged mpirun never does: issue 59 finding 20), and how long it or a rank
// may stay stopped while the job runs (a stopped rank holds every collective until
// comm.timeout_s, 300 s by default; a stopped mpirun holds MPI_Finalize and the output).
constexpr auto kLauncherGrace = std::chrono::seconds(5);
constexpr auto kStopped = std::chrono::seconds(10);
constexpr int kStoppedPolls = 100;  // and seen stopped this many polls in a row (~5 s of them)

// A process stopped by a signal (state T: SIGSTOP, SIGTSTP). Not state t, a debugger's stop.
bool stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'T';
}

// How long a process has been seen stopped on consecutive polls of the supervisor (which
// counts only while it runs itself, so job control stopping the whole job is no alarm).
struct StoppedFor {
  int polls = 0;
  Clock::time_point since;
  bool too_long(pid_t pid, Clock::time_point now) {
    polls = pid > 0 && stopped(pid) ? polls + 1 : 0;
    if (polls == 1) since = now;
    return polls >= kStoppedPolls && now - since > kStopped;
  }
};

// Note [Heartbeats]: a rank's beats as the supervisor reads them (every kBeatPoll).
constexpr auto kBeatPeriod = std::chrono::seconds(1);
constexpr auto kBeatPoll = std::chrono::milliseconds(500);
constexpr int64_t kActiveCpuMs = 50;  // CPU time per beat that counts as work
constexpr auto kFrozen = std::chrono::seconds(15);  // after kStopped: a stopped rank is named as such
constexpr auto kStalled = std::chrono::seconds(4);  // beats this old when a failure's grace ends: not running

struct Heartbeat {
  bool seen = false;
  uint64_t seq = 0;
  int64_t cpu_ms = 0, step = -1;
  int same_polls = 0, idle_beats = 0;
  Clock::time_point changed, active;
  // Reads beat-R; returns why the rank must end the job ("" when it need not).
  std::string check(const std::string& path, double hang_s, Clock::time_point now) {
    std::ifstream f(path);
    uint64_t q = 0;
    int64_t cpu = 0, waits = 0;
    if (!(f >> q >> cpu >> waits >> step)) return "";  // not started yet
    if (!seen || q != seq) {
      const bool busy = !seen || waits > 0 || cpu - cpu_ms >= kActiveCpuMs * int64_t(q - seq);
      if (busy) active = now, idle_beats = 0;
      else idle_beats += int(q - seq);
      seen = true, seq = q, cpu_ms = cpu, changed = now, same_polls = 0;
    } else {
      ++same_polls;
    }
    // Poll counts guard against the supervisor's own clock jumping (the whole job stopped).
    if (same_polls * kBeatPoll >= kFrozen && now - changed > kFrozen)
      return "no heartbeat for " + std::to_string(kFrozen.count()) + " s (frozen: its threads do not run)";
    const auto hang = std::chrono::duration<double>(hang_s);
    if (hang_s > 0 && now - active > hang && idle_beats * kBeatPeriod >= hang * 0.8)
      return "hung in step " + std::to_string(step + 1) + ": no CPU time and no collective for " +
             std::to_string(int(hang_s)) + " s (comm.hang_s; raise it if this rank legitimately blocks longer)";
    return "";
  }
};

// Ends a stuck job: SIGKILL to every rank still there and to mpirun; `what` names why.
// `culprit`: the rank found stuck (-1: mpirun).
void end_stuck_job(pid_t child, const std::vector<pid_t>& pids, const Placement& at, int culprit,
                   const std::string& what, Watch& w) {
  if (culprit >= 0 && size_t(culprit) < w.faulty.size()) w.faulty[size_t(culprit)] = 1;
  for (size_t r = 0; r < pids.size(); ++r) at.kill(r, pids[r]);
  ::kill(child, SIGKILL);  // a stopped process takes SIGKILL too
  w.launcher_stuck = true;
  w.killed += "\n  " + what + "; killed with mpirun (pid " + std::to_string(child) + ") and every rank still there";
}

// Note [Supervised launch]: a launcher that outlives its ranks, or a launcher or rank that
// stays stopped, ends the job.
void check_stuck(pid_t child, const std::vector<pid_t>& pids, const Placement& at, const std::vector<char>& done,
                 bool all_done_long, StoppedFor& launcher, std::vector<StoppedFor>& ranks, Clock::time_point now,
                 Watch& w) {
  if (w.launcher_stuck) return;
  const std::string secs = std::to_string(kStopped.count());
  if (all_done_long)
    return end_stuck_job(child, pids, at, -1, "mpirun: still running " + std::to_string(kLauncherGrace.count()) +
                                          " s after every rank had recorded its exit (stopped or hung)", w);
  if (launcher.too_long(child, now))
    return end_stuck_job(child, pids, at, -1, "mpirun: stopped (SIGSTOP) for " + secs + " s", w);
  for (size_t r = 0; r < pids.size(); ++r)
    if (!done[r] && ranks[r].too_long(pids[r], now))
      return end_stuck_job(child, pids, at, int(r), at.name(r, pids[r]) + ": stopped (SIGSTOP) for " + secs + " s", w);
}

// Note [Heartbeats]: a frozen or hung rank ends the job.
void check_beats(pid_t child, const std::vector<pid_t>& pids, const Placement& at, const std::vector<char>& done,
                 const std::string& status_dir, double hang_s, std::vector<Heartbeat>& beats, Clock::time_point now,
                 Watch& w) {
  for (size_t r = 0; r < pids.size(); ++r) {
    if (done[r]) continue;
    const std::string why = beats[r].check(status_dir + "/beat-" + std::to_string(r), hang_s, now);
    if (!why.empty())
      return end_stuck_job(child, pids, at, int(r), at.name(r, pids[r]) + ": " + why, w);
  }
}

// Waits for mpirun, killing what outlives a failure's grace or a signal (see the Note).
Watch supervise(pid_t child, int nproc, const std::string& status_dir, double timeout_s, double hang_s,
                const Placement& at, const std::function<bool()>& want_stop, StderrRelay& relay, int& wstatus) {
  const auto grace = std::chrono::duration<double>(std::min(timeout_s, 10.0));
  Watch w;
  w.faulty.assign(size_t(nproc), 0);
  Survivors survivors(nproc);  // the ranks gone without an exit code, judged (Note [Survivors])
  std::vector<pid_t> pids(size_t(nproc), 0);
  std::vector<char> done(size_t(nproc), 0);
  std::optional<Clock::time_point> first_failure, kill_time, all_done;
  StoppedFor launcher;
  std::vector<StoppedFor> stopped_ranks = std::vector<StoppedFor>(size_t(nproc));
  std::vector<Heartbeat> beats(static_cast<size_t>(nproc));
  Clock::time_point beats_read;
  int failed_rank = -1;
  bool stop_asked = false;
  for (;;) {
    const pid_t got = ::waitpid(child, &wstatus, WNOHANG);
    if (got == child) {
      for (int i = 0; i < 20 && relay.pump(50);) ++i;  // what mpirun wrote last, for up to 1 s
      survivors.finish();
      for (size_t r = 0; r < size_t(nproc); ++r) w.faulty[r] |= survivors.faulty()[r];
      return w;
    }
    const auto now = Clock::now();
    const bool failure_seen = first_failure.has_value();  // in an earlier poll: ranks gone in this one went after
    for (int r = 0; r < nproc; ++r) {
      const std::string rs = std::to_string(r);
      if (!pids[size_t(r)]) pids[size_t(r)] = read_int(status_dir + "/pid-" + rs, 0);
      if (done[size_t(r)]) continue;
      const int code = read_int(status_dir + "/rank-" + rs, -1);
      const bool gone = code >= 0 || (pids[size_t(r)] > 0 && !alive(pids[size_t(r)])) || at.lost(size_t(r));
      if (!gone) continue;
      done[size_t(r)] = 1;
      const bool local = pids[size_t(r)] > 0;  // (only ranks on the supervisor's host write a pid file)
      if (code < 0 && !(failure_seen && local) && !kill_time && !w.launcher_stuck) survivors.gone(r, local, now);
      if (code != 0 && code != kStopToReform && !first_failure) first_failure = now, failed_rank = r;
    }
    survivors.judge(now);
    if (!all_done && std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) all_done = now;
    if (want_stop && !stop_asked && !first_failure && want_stop()) at.request_stop(status_dir, nproc), stop_asked = true;
    check_stuck(child, pids, at, done, all_done && now - *all_done > kLauncherGrace, launcher, stopped_ranks, now, w);
    if (now - beats_read >= kBeatPoll && !w.launcher_stuck && !kill_time) {
      beats_read = now;
      check_beats(child, pids, at, done, status_dir, hang_s, beats, now, w);
    }
    const bool expired = first_failure && now - *first_failure > grace;
    if ((g_signal || expired) && !kill_time) {
      if (g_signal) w.signal = g_signal;
      for (size_t r = 0; r < size_t(nproc); ++r)
        if (!done[r] && (at.server || (pids[r] > 0 && alive(pids[r])))) {
          // One that cannot run (stopped, or its beats stalled) failed on its own account.
          const bool frozen = (pids[r] > 0 && stopped(pids[r])) || (beats[r].seen && now - beats[r].changed > kStalled);
          if ((frozen || !beats[r].seen) && !w.signal) w.faulty[r] = 1;  // or never started (Note [Start deadline] in train_cmd.cc)
          at.kill(r, pids[r]);
          w.killed += "\n  " + at.name(r, pids[r]) + ": killed, " +
                      (w.signal ? std::string("the supervisor got signal ") + std::to_string(w.signal)
                                : "still running " + std::to_string(int(grace.count())) + " s after rank " +
                                      std::to_string(failed_rank) + " failed") +
                      (frozen ? " (it was not running: stopped, or no heartbeat)"
                              : beats[r].seen ? "" : " (it never started: no heartbeat)");
        }
      kill_time = now;
      if (w.signal) ::kill(child, SIGKILL);
    }
    // mpirun itself gets 2 s to notice its ranks are gone.
    if (kill_time && now - *kill_time > std::chrono::seconds(2)) ::kill(child, SIGKILL);
    if (!relay.pump(50)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

const char* status_dir_env() { return comm::launched_by_mpi() ? std::getenv("LOOM_STATUS_DIR") : nullptr; }

const char* rank_env() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  return rank ? rank : std::getenv("PMI_RANK");
}

// Note [Status over TCP]: a rank on another host than its supervisor's reports over this link
// (set once by join_supervisor, before any thread reads it; null for a local rank).
StatusLink* g_link = nullptr;
std::atomic<bool> g_stop_asked{false};  // a remote rank was told "stop" (Note [Elastic growth])

// Note [Heartbeats]: the rank's side, written whole and renamed into place once a second (or
// sent over the link).
[[noreturn]] void beat_loop(const std::string& path) {
  const std::string next = path + ".next";
  for (uint64_t seq = 1;; ++seq) {
    timespec cpu{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    const std::string beat = std::to_string(seq) + " " + std::to_string(int64_t(cpu.tv_sec) * 1000 + cpu.tv_nsec / 1000000) +
                             " " + std::to_string(liveness::waits_in_flight()) + " " +
                             std::to_string(liveness::current_step());
    if (g_link) {
      g_link->send("beat " + beat);
    } else {
      std::ofstream(next, std::ios::trunc) << beat << "\n";
      ::rename(next.c_str(), path.c_str());
    }
    std::this_thread::sleep_for(kBeatPeriod);
  }
}

// Note [Status over TCP]: a random token for the ranks' hello (hex of 16 bytes of urandom).
std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char b[16] = {};
  urandom.read(reinterpret_cast<char*>(b), sizeof b);
  std::string s;
  char hex[3];
  for (unsigned char c : b) std::snprintf(hex, sizeof hex, "%02x", c), s += hex;
  return s;
}

}  // namespace

int launch_under_mpirun(int nproc, int argc, char** argv, double timeout_s, double hang_s,
                        const std::vector<HostSlots>& hosts, std::vector<int>* faulty,
                        const std::function<bool()>& want_stop) {
  // OpenMPI refuses more ranks than cores and running as root unless told; --nproc is the
  // convenience path, so it asks for both (MPICH ignores these variables).
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  if (::geteuid() == 0) ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0), ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("OMPI_MCA_orte_enable_recovery", "1", 0);
  char tmpl[] = "/tmp/loom-status-XXXXXX";
  if (!::mkdtemp(tmpl)) throw Error(std::string("--nproc: cannot make a status directory: ") + std::strerror(errno));
  const std::string status_dir = tmpl;
  ::setenv("LOOM_STATUS_DIR", status_dir.c_str(), 1);
  ::setenv("LOOM_SUPERVISOR_PID", std::to_string(::getpid()).c_str(), 1);
  std::unique_ptr<StatusServer> server;
  Placement at;
  if (!hosts.empty()) {  // Note [Status over TCP]
    const std::string token = random_token();
    server = std::make_unique<StatusServer>(status_dir, nproc, token);
    at.server = server.get(), at.hosts = host_of_ranks(hosts);
    ::setenv("LOOM_SUPERVISOR_ADDR", server->addresses().c_str(), 1);
    ::setenv("LOOM_SUPERVISOR_HOST", this_host().c_str(), 1);
    ::setenv("LOOM_SUPERVISOR_TOKEN", token.c_str(), 1);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  int err_pipe[2] = {-1, -1};
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) err_pipe[0] = err_pipe[1] = -1;  // then mpirun writes to ours directly
  const pid_t child = start_mpirun(mpirun_args(nproc, argc, argv, hosts), err_pipe[1]);
  if (err_pipe[1] >= 0) ::close(err_pipe[1]);
  StderrRelay relay(err_pipe[0]);
  int wstatus = 0;
  const Watch w = supervise(child, nproc, status_dir, timeout_s, hang_s, at, want_stop, relay, wstatus);
  if (faulty)
    for (int r = 0; r < nproc; ++r)
      if (w.faulty[size_t(r)]) faulty->push_back(r);
  const int launcher_rc = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  int rc = 0;
  std::string failed;
  for (int r = 0; r < nproc; ++r) {
    const std::string rs = std::to_string(r);
    const int code = read_int(status_dir + "/rank-" + rs, -1);
    const std::string who = at.name(size_t(r), 0);
    if (code < 0) failed += "\n  " + who + ": left no exit code (killed, died in a signal" +
                            (at.lost(size_t(r)) ? ", or its host was lost: its connection closed)" : ")");
    else if (code != 0 && code != kStopToReform) failed += "\n  " + who + ": exited " + std::to_string(code);
    if (code != 0 && rc == 0) rc = code > 0 ? code : 1;
    ::unlink((status_dir + "/rank-" + rs).c_str());
    ::unlink((status_dir + "/pid-" + rs).c_str());
    ::unlink((status_dir + "/beat-" + rs).c_str());
    ::unlink((status_dir + "/beat-" + rs + ".next").c_str());
    ::unlink((status_dir + "/rank-" + rs + ".next").c_str());
  }
  at.server = nullptr;
  server.reset();  // no more files written into the status directory
  ::unlink((status_dir + "/stop").c_str());
  ::rmdir(status_dir.c_str());
  if (launcher_rc == 127 && failed.find("exited") == std::string::npos) return 127;
  // A launcher killed after every rank had ended says nothing about the ranks' work.
  if (rc == 0 && launcher_rc != 0 && !(w.launcher_stuck && failed.empty())) rc = launcher_rc;
  if (w.signal) rc = 128 + w.signal;
  const std::string flag = hosts.empty() ? "--nproc " + std::to_string(nproc) : "--hosts " + host_arg(hosts);
  if (!failed.empty()) std::cerr << "loom: " << flag << ": the job failed:" << failed << "\n";
  if (!w.killed.empty()) std::cerr << "loom: " << flag << ": the supervisor killed:" << w.killed << "\n";
  return rc;
}

void join_supervisor() {
  const char* dir = status_dir_env();
  const char* rank = rank_env();
  const char* sup = std::getenv("LOOM_SUPERVISOR_PID");
  if (!dir || !rank || !sup) return;
  const pid_t supervisor = pid_t(std::atol(sup));
  const char* addr = std::getenv("LOOM_SUPERVISOR_ADDR");
  const char* sup_host = std::getenv("LOOM_SUPERVISOR_HOST");
  const char* token = std::getenv("LOOM_SUPERVISOR_TOKEN");
  if (addr && sup_host && token && this_host() != sup_host) {  // Note [Status over TCP]
    g_link = new StatusLink(addr, std::atoi(rank), this_host(), token);  // lives as long as the process
    std::thread(beat_loop, std::string()).detach();
    std::thread([r = std::string(rank)] {
      if (g_link->wait_for_kill(&g_stop_asked)) ::raise(SIGKILL);
      std::fprintf(stderr, "loom: rank %s: the --hosts supervisor is gone (its connection closed); stopping this rank\n",
                   r.c_str());
      std::fflush(stderr);
      ::_exit(1);
    }).detach();
    return;
  }
  std::ofstream(std::string(dir) + "/pid-" + rank) << ::getpid() << "\n";
  std::thread(beat_loop, std::string(dir) + "/beat-" + rank).detach();
  std::thread([supervisor, r = std::string(rank)] {
    while (alive(supervisor)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::fprintf(stderr, "loom: rank %s: the --nproc supervisor (pid %d) is gone; stopping this rank\n", r.c_str(),
                 int(supervisor));
    std::fflush(stderr);
    ::_exit(1);
  }).detach();
}

bool stop_requested() {
  if (g_link) return g_stop_asked;
  const char* dir = status_dir_env();
  return dir && ::access((std::string(dir) + "/stop").c_str(), F_OK) == 0;
}

void record_exit(int code) {
  const char* dir = status_dir_env();
  const char* rank = rank_env();
  if (!dir || !rank) return;
  if (g_link) {
    g_link->send("exit " + std::to_string(code));
    return;
  }
  std::ofstream(std::string(dir) + "/rank-" + rank) << code << "\n";
}

}  // namespace loom::cli
