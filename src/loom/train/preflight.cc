#include "loom/train/preflight.h"

#include <elf.h>
#include <link.h>

#include <cstring>
#include <span>
#include <sstream>

#include "loom/comm/world.h"
#include "loom/core/error.h"
#include "loom/core/fileio.h"

namespace loom {

// Note [Preflight]
// A job launched by hand (`mpirun --host a:4,b:4 loom train ...`) or by a scheduler can put
// a different loom on one host (an older install) or hand one rank other arguments (a stale
// config file on one host). Either trains wrong numbers or hangs at the first collective
// whose shapes differ. So before step 1 each rank states what it runs, as two CRC-32s: its
// build, the GNU build-id note the linker writes into the executable (read from the loaded
// program headers; the bytes of /proc/self/exe where there is none), and its config, the
// TOML of every resolved key (the file and every --set alike). One all-gather of the pairs;
// every rank then holds the same table, compares it with rank 0's pair and, on a difference,
// refuses with the same message naming each rank that differs and its host, so all ranks
// stop together and none waits on another.

namespace {

// The main program's NT_GNU_BUILD_ID descriptor (empty when it has none).
std::string build_id_bytes() {
  std::string out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* id = static_cast<std::string*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
            const char* name = p + sizeof(ElfW(Nhdr));
            const char* desc = name + ((n->n_namesz + 3) & ~3u);
            if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              id->assign(desc, n->n_descsz);
              return 1;
            }
            p = desc + ((n->n_descsz + 3) & ~3u);
          }
        }
        return 1;  // the first object is the main program: stop either way
      },
      &out);
  return out;
}

uint32_t build_crc() {
  const std::string id = build_id_bytes();
  if (!id.empty()) return crc32_of(id.data(), id.size());
  const std::string bytes = read_file_bytes("/proc/self/exe");
  return crc32_of(bytes.data(), bytes.size());
}

std::string hex(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

std::string build_id_hex() {
  std::string out;
  for (unsigned char c : build_id_bytes()) out += hex(c).substr(6);
  return out;
}

RankIdentity identity_of(const Config& cfg) {
  const std::string toml = to_toml(cfg);
  return {build_crc(), crc32_of(toml.data(), toml.size())};
}

std::string preflight_problem(const std::vector<RankIdentity>& ranks, const std::vector<std::string>& hosts) {
  if (ranks.empty()) return "";
  auto host = [&](size_t r) { return r < hosts.size() ? " on host " + hosts[r] : std::string(); };
  std::ostringstream os;
  for (size_t r = 1; r < ranks.size(); ++r) {
    if (ranks[r].build != ranks[0].build)
      os << "\n  rank " << r << host(r) << " runs another loom build (" << hex(ranks[r].build) << " against rank 0's "
         << hex(ranks[0].build) << host(0) << "): install the same build on every host";
    if (ranks[r].config != ranks[0].config)
      os << "\n  rank " << r << host(r) << " was given another config (" << hex(ranks[r].config) << " against rank 0's "
         << hex(ranks[0].config) << "): every rank needs the same config file and --set options";
  }
  const std::string found = os.str();
  return found.empty() ? "" : "preflight: the ranks do not run the same job (Note [Preflight])" + found;
}

void preflight(comm::World& world, const Config& cfg) {
  const RankIdentity mine = identity_of(cfg);
  const int64_t packed = int64_t(mine.build) << 32 | int64_t(mine.config);
  std::vector<int64_t> all(size_t(world.world_size()));
  world.world_group().all_gather(std::span<const int64_t>(&packed, 1), std::span<int64_t>(all));
  std::vector<RankIdentity> ranks;
  for (int64_t v : all) ranks.push_back({uint32_t(uint64_t(v) >> 32), uint32_t(uint64_t(v) & 0xffffffffu)});
  if (const std::string problem = preflight_problem(ranks, world.hosts()); !problem.empty()) throw ConfigError(problem);
}

}  // namespace loom
