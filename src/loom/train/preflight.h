// Note [Preflight]: before step 1, every rank of a multi-process job runs the same loom build
// with the same config, or the job is refused naming the rank and host that differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/config.h"

namespace loom::comm {
class World;
}

namespace loom {

// What a rank runs: CRC-32s of its build (the executable's GNU build-id, else its bytes)
// and of its config (the TOML of every resolved key).
struct RankIdentity {
  uint32_t build = 0, config = 0;
};
RankIdentity identity_of(const Config& cfg);
// The executable's GNU build-id in hex ("" when it has none).
std::string build_id_hex();

// The refusal for a gathered table (rank r's identity and host at r), naming each rank that
// differs from rank 0 with its host; "" when they all agree.
std::string preflight_problem(const std::vector<RankIdentity>& ranks, const std::vector<std::string>& hosts);

// Collective over the world: gathers every rank's identity and throws ConfigError on every
// rank (each sees the same table) when one differs.
void preflight(comm::World& world, const Config& cfg);

}  // namespace loom
