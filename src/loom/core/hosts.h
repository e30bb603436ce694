// The hosts of a job: `loom train --hosts` (Note [Host lists]).
#pragma once

#include <string>
#include <vector>

namespace loom {

// Note [Host lists]
// `loom train --hosts SPEC` takes the hosts of a multi-host job as OpenMPI and DeepSpeed write
// them: SPEC is a hostfile (lines "HOST slots=N", `#` comments and blank lines skipped, a bare
// HOST one slot, OpenMPI's max_slots=N accepted and ignored) or, when no file has that name,
// the inline list "a:2,b:2" (a bare host: one slot). Each host appears once and every slot
// count is positive; anything else is refused naming the line or item and what is expected.
// Ranks fill the hosts in order: rank 0 and the next slots - 1 on the first host, and so on,
// which is how mpirun places `--host a:2,b:2` by slot.
struct HostSlots {
  std::string host;
  int slots = 1;
};

// Reads SPEC (a hostfile, else an inline list). Throws ConfigError naming what is wrong.
std::vector<HostSlots> parse_hosts(const std::string& spec);
// The inline list of a hostfile's text; `origin` names it in errors ("hosts.txt").
std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& origin);

// Slots of all hosts together: the job's ranks.
int total_slots(const std::vector<HostSlots>& hosts);
// "a:2,b:2", mpirun's --host argument.
std::string host_arg(const std::vector<HostSlots>& hosts);
// The host of every rank, in rank order.
std::vector<std::string> host_of_ranks(const std::vector<HostSlots>& hosts);

// This machine's host name (gethostname; "localhost" if it has none).
std::string this_host();

}  // namespace loom
