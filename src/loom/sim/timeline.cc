#include "loom/sim/timeline.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/xml.h"

namespace loom::sim {

namespace {

constexpr double kUs = 1e6;

}  // namespace

void write_sim_trace(const std::string& path, const SimResult& r) {
  nlohmann::json out = nlohmann::json::array();
  std::map<int64_t, std::vector<std::pair<double, double>>> busy;  // rank -> compute spans
  for (const RankReport& rank : r.ranks) {
    const int64_t pid = rank.global_rank;
    out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(pid)}}}});
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "communication"}}}});
    const MemoryBreakdown& m = rank.memory;
    nlohmann::json args = {{"params MiB", m.params / (1 << 20)}, {"grads MiB", m.grads / (1 << 20)},
                           {"optimizer MiB", m.optimizer / (1 << 20)}, {"activations MiB", m.activations / (1 << 20)},
                           {"buffers MiB", m.buffers / (1 << 20)}};
    out.push_back({{"ph", "C"}, {"name", "memory"}, {"cat", "memory"}, {"pid", pid}, {"tid", 0}, {"ts", 0}, {"args", args}});
  }
  for (const SimEvent& e : r.events) {
    out.push_back({{"name", e.name}, {"cat", e.cat}, {"ph", "X"}, {"pid", e.rank}, {"tid", e.tid},
                   {"ts", e.t0_s * kUs}, {"dur", (e.t1_s - e.t0_s) * kUs}});
    if (e.tid == 0) busy[e.rank].push_back({e.t0_s, e.t1_s});
  }
  for (auto& [rank, spans] : busy) {  // idle gaps on the compute thread, as the engine marks them
    std::sort(spans.begin(), spans.end());
    double covered = 0;
    for (const auto& [s, e] : spans) {
      if (s - covered > 1e-9)
        out.push_back({{"name", "idle"}, {"cat", "idle"}, {"ph", "X"}, {"pid", rank}, {"tid", 0},
                       {"ts", covered * kUs}, {"dur", (s - covered) * kUs}});
      covered = std::max(covered, e);
    }
  }
  // "otherData" marks the file loom's (Note [User-named outputs]).
  write_file_atomic(path, nlohmann::json{{"displayTimeUnit", "ms"}, {"otherData", {{"generator", "loom"}}},
                                         {"traceEvents", out}}.dump() + "\n");
}

void write_sim_svg(const std::string& path, const SimResult& r, const std::string& title) {
  const double width = 1200, left = 90, lane = 26, top = 40;
  const double scale = (width - left - 20) / std::max(r.step_time_s, 1e-12);
  std::map<int64_t, size_t> lane_of;
  for (const RankReport& rank : r.ranks) lane_of[rank.global_rank] = lane_of.size();
  const double height = top + lane * double(lane_of.size()) + 40;
  std::ostringstream f;
  char buf[512];
  f << svg_open(width, height);
  f << "<text x=\"10\" y=\"18\" font-size=\"13\">" << xml_escape(title) << "</text>\n";
  for (const auto& [rank, i] : lane_of) {
    std::snprintf(buf, sizeof buf, "<text x=\"6\" y=\"%.1f\">rank %lld</text>\n", top + lane * double(i) + 14,
                  static_cast<long long>(rank));
    f << buf;
  }
  for (const SimEvent& e : r.events) {
    const char* color = e.cat == "transfer" ? "#bbbbbb" : e.cat == "collective" ? "#d62728"
                        : e.name == "optimizer"  ? "#ff7f0e" : e.name[0] == 'F' ? "#1f77b4" : "#2ca02c";
    const double y = top + lane * double(lane_of[e.rank]) + (e.tid == 0 ? 0 : 16);
    std::snprintf(buf, sizeof buf,
                  "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"white\" "
                  "stroke-width=\"0.3\"><title>%s %.3f-%.3f ms</title></rect>\n",
                  left + e.t0_s * scale, y, std::max(0.3, (e.t1_s - e.t0_s) * scale), e.tid == 0 ? 15 : 5, color,
                  xml_escape(e.name).c_str(), e.t0_s * 1e3, e.t1_s * 1e3);
    f << buf;
  }
  const double axis = top + lane * double(lane_of.size()) + 14;
  for (int i = 0; i <= 10; ++i) {
    const double t = r.step_time_s * i / 10;
    std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3g s</text>\n",
                  left + t * scale, axis, t);
    f << buf;
  }
  f << "<text x=\"" << left << "\" y=\"" << axis + 16
    << "\">forward: blue, backward: green, optimizer: orange, exposed collectives: red, transfers: grey</text>\n</svg>\n";
  write_file_atomic(path, f.str());  // Note [User-named outputs]
}

}  // namespace loom::sim
