// `loom train --nproc N`: the supervisor and its ranks' side of it (Note [Supervised launch]).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "loom/core/hosts.h"

namespace loom::cli {

// Runs `mpirun -np nproc <this binary> <argv without --nproc / --hosts>` and supervises it;
// returns the exit code. `timeout_s` is comm.timeout_s (it bounds the grace given to
// survivors), `hang_s` comm.hang_s (Note [Heartbeats]; 0: no hang check). `hosts` (--hosts;
// empty: this host) go to mpirun's --host, and the ranks on other hosts report over TCP (Note
// [Status over TCP]). `faulty` (when given) receives the ranks that failed on their own
// account: gone without an exit code, or ended as hung, frozen or stopped (not the survivors
// the supervisor killed after them).
// `want_stop` (polled while the job runs): once it says true, every rank is asked to stop after
// its next checkpoint (Note [Elastic growth]); ranks that do exit kStopToReform.
int launch_under_mpirun(int nproc, int argc, char** argv, double timeout_s, double hang_s,
                        const std::vector<HostSlots>& hosts = {}, std::vector<int>* faulty = nullptr,
                        const std::function<bool()>& want_stop = {});

// argv[first..argc) less the options `with_value` (each with its value, given as "--x V" or
// "--x=V") and the flags `bare`: what a relaunch keeps of a command line.
std::vector<std::string> without_options(int argc, char** argv, int first, const std::vector<std::string>& with_value,
                                         const std::vector<std::string>& bare = {});

// A rank's exit code when it stopped after a checkpoint as its supervisor asked (EX_TEMPFAIL).
inline constexpr int kStopToReform = 75;

// In a rank under an --elastic supervisor: whether it asked the job to stop at its next
// checkpoint (Note [Elastic growth]); false otherwise.
bool stop_requested();

// In a rank under a supervised launch: records its pid for the supervisor, starts its
// heartbeat (Note [Heartbeats]) and a watcher that ends the rank when the supervisor is
// gone. No-op otherwise.
void join_supervisor();

// Under a supervised launch, records this rank's exit code. No-op otherwise.
void record_exit(int code);

}  // namespace loom::cli
