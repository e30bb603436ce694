// In-memory checkpoints kept on the job's hosts (issue 54, item 4).
//
// Note [In-memory checkpoints]
// checkpoint.memory_every = N saves every N steps, besides the disk checkpoints of
// save_every, into memory: each host keeps a store in checkpoint.memory_dir (a tmpfs such as
// /dev/shm, so host memory that outlives the rank processes but not the host), named
// loom-memory-<hash of checkpoint.dir>-<host>, proved loom's by its marker file (first line
// `loom-memory-v1 <checkpoint.dir>`; Note [Ownership by content]: a path of that name without
// it is refused, never touched). A store holds step-NNNNNNNN/ directories in the disk format
// (rank-RRRRR.bin, compress-RRRRR.bin, manifest.json: Note [Sharded checkpoints]), each file
// written under a temporary name and renamed, so a file present is whole.
//
// A save (collective over the whole job): every rank writes its own file into its host's store,
// then sends it to its peer, the rank with the same index on the next host in the job's order
// of hosts (fewer ranks there: the index modulo their count), which writes it into its host's
// store; rank 0 merges the piece tables into the manifest, which every host's store gets. After
// one agreement that every rank succeeded, each store drops its older steps. So every file of
// the newest step lives on two distinct hosts, and losing any one host loses no file. A job on
// one host keeps one copy (it survives a rank's death, not the host's), and says so.
//
// A resume (`--resume auto`, as an elastic job relaunches: Note [Elastic launch]) first asks
// every host's store what it holds (one rank a host reads its store; the lists are
// all-gathered), takes the newest step whose manifest and every rank file some running host
// holds, and copies the files a host lacks from a host that has them, host to host in one
// order every rank agrees on (so each transfer's two ends meet and none waits on another),
// until every host's store holds the whole step; then each rank loads it as a disk checkpoint
// (resharding to the new layout). It is preferred to a disk checkpoint of the same or an older
// step: losing one host costs at most N steps and reads nothing from disk. When no step is
// whole on the running hosts (both copies of a file lost), the disk checkpoints are the
// fallback. A host's store is removed when the job ends with its last step saved; a failed job
// leaves them for its relaunch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

struct Config;
struct ShardState;
namespace comm {
class Group;
}

// The store of the job of `cfg` on `host` (a path; it may not exist).
std::string memory_store_path(const Config& cfg, const std::string& host);

// Collective over `world` (every rank of the job, rank r's files named by its group rank;
// nullptr: one process). Saves `s` as step `step` into this host's store and its peer's.
// Throws loom::Error on every rank when any rank fails (the older step stays).
void save_memory(const Config& cfg, int64_t step, const ShardState& s, comm::Group* world);

struct MemoryStep {
  int64_t step = 0;
  std::string dir;           // this host's store's step directory, now whole
  int64_t copied_bytes = 0;  // the bytes this host received to make it whole
  int hosts = 0;             // the hosts whose stores held the step's files
};

// Collective over `world`: the newest step the running hosts' stores hold whole, made whole
// on every host (see the Note); nullopt when none is (every rank agrees).
std::optional<MemoryStep> restore_memory(const Config& cfg, comm::Group* world);

// Collective over `world`: removes the job's store on every host (only a store its marker
// proves the job's).
void drop_memory(const Config& cfg, comm::Group* world);

}  // namespace loom
