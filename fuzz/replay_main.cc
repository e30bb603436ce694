// A main for the fuzz targets where libFuzzer is not linked (the gcc build, ctest): runs
// every file of the seed corpus directories given, then `--mutations N` deterministic
// mutations of them (byte flips, insertions, deletions, splices), so the default test
// suite replays the corpus and a little more on every build. scripts/fuzz.sh fuzzes for real.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long mutations = 0;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mutations") == 0 && i + 1 < argc) {
      mutations = std::strtol(argv[++i], nullptr, 10);
      continue;
    }
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::ostringstream os;
      os << in.rdbuf();
      inputs.push_back(os.str());
    }
  }
  if (inputs.empty()) inputs.push_back("");
  for (const std::string& s : inputs) LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  std::mt19937_64 rng(12345);
  for (long m = 0; m < mutations; ++m) {
    std::string s = inputs[rng() % inputs.size()];
    const int edits = 1 + int(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      const size_t at = s.empty() ? 0 : rng() % s.size();
      switch (rng() % 5) {
        case 0: if (!s.empty()) s[at] = char(rng()); break;
        case 1: s.insert(at, 1, char(rng())); break;
        case 2: if (!s.empty()) s.erase(at, 1 + rng() % 16); break;
        case 3: { const std::string& o = inputs[rng() % inputs.size()]; if (!o.empty()) s.insert(at, o.substr(rng() % o.size(), 1 + rng() % 64)); } break;
        default: if (!s.empty()) s[at] = "0123456789-[]{}\",:e."[rng() % 20]; break;
      }
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::printf("replayed %zu inputs and %ld mutations\n", inputs.size(), mutations);
  return 0;
}
