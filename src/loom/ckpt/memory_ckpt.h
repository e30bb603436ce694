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
// A save (collective over the whole job): every rank writes its own file into its host's store
// and every host's store gets the manifest (each rank has every piece table after one
// all-gather); then each rank's file goes to its peer, the rank with the same index on the next
// host in the job's order of hosts (fewer ranks there: the index modulo their count), in the
// background on a group of its own while training goes on: the file is mapped and sent from
// the store, received straight into the peer's store under a temporary name and renamed once
// all of a rank's copies have arrived (polled after each step). The next save (or a stop, or
// the end) first waits for those copies and agrees that every rank has them; only then does
// each store drop the older steps. So the newest step whose copies have arrived, and always
// the one before it, has every file on two distinct hosts, and losing any one host loses no
// file. A job on one host keeps one copy (it survives a rank's death, not the host's).
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
#include <memory>
#include <optional>
#include <string>

namespace loom {

struct Config;
struct ShardState;
namespace comm {
class Group;
class World;
}

// The store of the job of `cfg` on `host` (a path; it may not exist).
std::string memory_store_path(const Config& cfg, const std::string& host);

// One run's in-memory saves (every rank of the job holds one; rank r's files are named by its
// global rank).
class MemorySaver {
 public:
  // Collective over `world` (nullptr: one process): makes the group the copies travel on.
  MemorySaver(const Config& cfg, comm::World* world);
  ~MemorySaver();
  MemorySaver(const MemorySaver&) = delete;
  MemorySaver& operator=(const MemorySaver&) = delete;
  // Collective: completes the previous save (its copies arrived everywhere: the older steps
  // go), writes `s` as step `step` into this host's store with the manifest, and starts
  // sending its copy to the peer in the background. Throws loom::Error on every rank when
  // any rank fails (the older step stays).
  void save(int64_t step, const ShardState& s);
  // Local, after each step: the copies received, once all have arrived, take their names.
  void poll();
  // Collective: completes the save in flight (so its step is whole on two hosts) and, with
  // `drop`, removes the job's stores (the run is over).
  void finish(bool drop);

 private:
  void complete();
  struct InFlight;
  const Config& cfg_;
  comm::World* world_;
  std::unique_ptr<comm::Group> group_;
  std::unique_ptr<InFlight> flight_;
};

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
// proves the job's); true when this rank's host had one. A run that does not resume drops
// them first, so that a later `--resume auto` never takes an earlier run's step.
bool drop_memory(const Config& cfg, comm::Group* world);

}  // namespace loom
