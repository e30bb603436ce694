// `loom compare PREDICTED MEASURED`: two Chrome traces of the same layout (one from
// `loom simulate --trace`, one from `loom train --trace`) lined up per rank: step time,
// compute, communication and idle per step, each memory category's peak, and the pipeline
// bubble of the whole pipeline (Note [Measured bubble]) with its floor (Note [Bubble floor]).
//
// Note [Measured bubble]
// For step k: every rank's time from its step start to the end of the step's last
// pipeline step on any rank, less its time in pipeline steps (F, B, W, and the updates U that
// run inside the stream: pipedream / pipemare's per minibatch, and 2bw's work of a step's
// update, category "update": the gradient's move and squares, the stash copy, AdamW (the
// pieces a stage writes while it waits are "U wait": Note [2BW's update in the waits]) - work,
// not idle, though the flushing schedules do theirs outside the window), summed over ranks,
// over the sum of those windows: 1 - sum_r busy_r / sum_r (end_k - start_r,k), averaged
// over the counted steps. A rank's window stops where its next step starts, if that comes
// first: 2bw's steps overlap across ranks (Note [PipeDream-2BW]), and time a rank spends on
// its next step is not this step's idle (flushing schedules start the next step after the
// update, so nothing changes for them). Busy is the union of those spans: 2bw's update of its
// vocabulary rows runs inside a pass (Note [Vocabulary passes across a step's end]). A stream's flushing steps (marked in the trace: Note
// [Trace schema]; the run's last, validation and checkpoint steps) are left out while it has
// steady ones: they ramp down as 1F1B does, and the simulator prices the steady step (on
// config A at pp 2, 2bw's last step measured 10 points over the floor, its others 1.6-2.9).
// A simulated trace is one step starting at 0, where this is the simulator's bubble_fraction
// (1 - busy / (pp x pipeline end), 2bw's update inside both: RankReport::update_end_s).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/cli/commands.h"
#include "loom/core/error.h"
#include "loom/sim/simulator.h"

namespace loom::cli {

namespace {

struct RankTimes {
  double step_s = 0, compute_s = 0, comm_s = 0;
  std::map<std::string, double> memory_mib;  // peak per series
  struct PipeStep {
    double start = 0, busy = 0, last_end = 0;  // a counted step: its start, time in pipeline steps, their end
    bool flush = false;                          // a stream's flushing step
  };
  std::vector<PipeStep> pipe;  // empty without pipeline steps
};

using Spans = std::vector<std::pair<double, double>>;

double union_length(Spans v) {
  std::sort(v.begin(), v.end());
  double total = 0, end = -1e300;
  for (auto [a, b] : v) {
    if (b <= end) continue;
    total += b - std::max(a, end);
    end = b;
  }
  return total;
}

// Per rank, per step: the trace's step spans (cat "step"; a simulated trace is one step
// from 0 to its last event), validation excluded.
std::map<int64_t, RankTimes> summarize(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError("compare: cannot read trace '" + path + "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw ConfigError("compare: '" + path + "' is not a JSON trace: " + e.what());
  }
  if (!j.contains("traceEvents") || !j["traceEvents"].is_array())
    throw ConfigError("compare: '" + path + "' has no traceEvents array (write it with --trace)");
  std::map<int64_t, Spans> steps, validation, compute, comm, pipeline;
  std::map<int64_t, std::vector<double>> flushes;  // start of each flushing step
  std::map<int64_t, double> last_end;
  std::map<int64_t, RankTimes> out;
  for (const auto& e : j["traceEvents"]) {
    if (!e.contains("pid") || !e.contains("ph")) continue;
    const int64_t pid = e["pid"].get<int64_t>();
    const std::string ph = e["ph"].get<std::string>(), cat = e.value("cat", ""), name = e.value("name", "");
    if (ph == "C" && name == "memory" && e.contains("args"))
      for (const auto& [k, v] : e["args"].items())
        out[pid].memory_mib[k] = std::max(out[pid].memory_mib[k], v.get<double>());
    if (ph != "X") continue;
    const double a = e.value("ts", 0.0) * 1e-6, b = a + e.value("dur", 0.0) * 1e-6;
    last_end[pid] = std::max(last_end[pid], b);
    if (cat == "step" && e.contains("args") && e["args"].is_object() && e["args"].value("flush", 0) == 1)
      flushes[pid].push_back(a);
    if (cat == "step") steps[pid].push_back({a, b});
    else if (name == "validation") validation[pid].push_back({a, b});
    else if (cat == "compute" || cat == "pipeline" || cat == "update") compute[pid].push_back({a, b});
    if (cat == "pipeline" || cat == "update") pipeline[pid].push_back({a, b});
    else if (cat == "collective" || cat == "transfer") comm[pid].push_back({a, b});
  }
  for (const auto& [pid, end] : last_end) {
    RankTimes& r = out[pid];
    // With three or more steps the first (page faults, buffer warm-up) is left out.
    std::sort(steps[pid].begin(), steps[pid].end());
    double from = -1e300;
    if (steps[pid].size() >= 3) {
      from = steps[pid].front().second;
      steps[pid].erase(steps[pid].begin());
    }
    // Spans of the counted steps: after the warm-up step, outside validation.
    auto in_measured_steps = [&](Spans v) {
      Spans kept;
      for (auto s : v) {
        bool skip = s.first < from;
        for (auto [a, b] : validation[pid]) skip = skip || (s.first >= a && s.second <= b);
        if (!skip) kept.push_back(s);
      }
      return kept;
    };
    const double n = std::max<double>(1, double(steps[pid].size()));
    double step_total = steps[pid].empty() ? end : 0;
    for (auto [a, b] : steps[pid]) step_total += b - a;
    Spans later_validation;
    for (auto v : validation[pid])
      if (v.first >= from) later_validation.push_back(v);
    step_total -= union_length(later_validation);
    r.step_s = step_total / n;
    r.compute_s = union_length(in_measured_steps(compute[pid])) / n;
    r.comm_s = union_length(in_measured_steps(comm[pid])) / n;
    // Note [Measured bubble]: each counted step's pipeline steps.
    const Spans counted = steps[pid].empty() ? Spans{{0.0, end}} : steps[pid];
    for (auto [a, b] : counted) {
      const std::vector<double>& f = flushes[pid];
      RankTimes::PipeStep ps{a, 0, a, std::find(f.begin(), f.end(), a) != f.end()};
      Spans inside;  // their union: a U may run inside a V (Note [Vocabulary passes across a step's end])
      for (auto [x, y] : pipeline[pid])
        if (x >= a && y <= b) inside.push_back({x, y}), ps.last_end = std::max(ps.last_end, y);
      ps.busy = union_length(inside);
      if (ps.busy > 0) r.pipe.push_back(ps);
    }
  }
  return out;
}

// Note [Measured bubble] and Note [Bubble floor] (sim/simulator.h) per counted step,
// averaged; fraction -1 when the trace has no pipeline steps.
struct Bubble {
  double fraction = -1, floor = 0;
};
Bubble pipeline_bubble(const std::map<int64_t, RankTimes>& ranks) {
  size_t steps = SIZE_MAX;
  for (const auto& [pid, r] : ranks) steps = std::min(steps, r.pipe.size());
  if (ranks.size() < 2 || steps == 0 || steps == SIZE_MAX) return {};
  auto flushes = [&](size_t k) {
    return std::any_of(ranks.begin(), ranks.end(), [&](const auto& r) { return r.second.pipe[k].flush; });
  };
  size_t steady = 0;
  for (size_t k = 0; k < steps; k++) steady += !flushes(k);
  Bubble out{0, 0};
  for (size_t k = 0; k < steps; k++) {
    if (steady > 0 && flushes(k)) continue;
    double end = 0, busy = 0, window = 0, most = 0;
    for (const auto& [pid, r] : ranks) end = std::max(end, r.pipe[k].last_end);
    for (const auto& [pid, r] : ranks) {
      const double stop = k + 1 < r.pipe.size() ? std::min(end, r.pipe[k + 1].start) : end;
      busy += r.pipe[k].busy, window += stop - r.pipe[k].start, most = std::max(most, r.pipe[k].busy);
    }
    const double counted = double(steady > 0 ? steady : steps);
    out.fraction += (1 - busy / window) / counted;
    out.floor += sim::bubble_floor(busy, most, double(ranks.size())) / counted;
  }
  return out;
}

}  // namespace

int run_compare(const std::string& predicted, const std::string& measured, bool json) {
  const auto p = summarize(predicted), m = summarize(measured);
  nlohmann::json rows = nlohmann::json::array();
  auto err = [](double a, double b) { return b > 0 ? (a - b) / b : 0.0; };
  if (!json)
    std::cout << "rank  category           predicted     measured    error\n" << std::fixed;
  int matched = 0;
  for (const auto& [rank, pr] : p) {
    auto it = m.find(rank);
    if (it == m.end()) continue;
    ++matched;
    const RankTimes& mr = it->second;
    std::vector<std::tuple<std::string, double, double, const char*>> cats = {
        {"step", pr.step_s, mr.step_s, "s"},
        {"compute", pr.compute_s, mr.compute_s, "s"},
        {"communication", pr.comm_s, mr.comm_s, "s"},
        {"idle", pr.step_s - pr.compute_s, mr.step_s - mr.compute_s, "s"}};
    for (const auto& [k, v] : pr.memory_mib)
      if (mr.memory_mib.count(k)) cats.push_back({"memory " + k.substr(0, k.find(' ')), v, mr.memory_mib.at(k), "MiB"});
    for (const auto& [cat, a, b, unit] : cats) {
      rows.push_back({{"rank", rank}, {"category", cat}, {"predicted", a}, {"measured", b}, {"unit", unit},
                      {"error", err(a, b)}});
      if (!json)
        std::cout << std::setw(4) << rank << "  " << std::left << std::setw(18) << cat << std::right
                  << std::setprecision(4) << std::setw(10) << a << " " << std::setw(12) << b << " " << unit
                  << std::setprecision(1) << std::setw(8) << 100 * err(a, b) << "%\n";
    }
  }
  if (matched == 0)
    throw ConfigError("compare: the traces share no rank (pids); compare a simulated and a measured run of one layout");
  if (const Bubble pb = pipeline_bubble(p), mb = pipeline_bubble(m); pb.fraction >= 0 && mb.fraction >= 0) {
    for (auto [cat, a, b] : {std::tuple{"pipeline bubble", pb.fraction, mb.fraction},
                             std::tuple{"bubble floor", pb.floor, mb.floor}}) {
      rows.push_back({{"rank", "all"}, {"category", cat}, {"predicted", a}, {"measured", b}, {"unit", "fraction"},
                      {"error", a - b}});
      if (!json)
        std::cout << " all  " << std::left << std::setw(18) << cat << std::right << std::setprecision(1)
                  << std::setw(9) << 100 * a << "% " << std::setw(11) << 100 * b << "%  " << std::showpos
                  << std::setw(6) << 100 * (a - b) << std::noshowpos << " points\n";
    }
  }
  if (json) std::cout << rows.dump() << std::endl;
  return 0;
}

}  // namespace loom::cli
