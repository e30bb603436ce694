// What the simulator's own validation says about a kind of layout: the step-time error it
// showed on measured runs of that kind (Note [Error bands]), for `loom plan` to print beside
// each candidate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/sim/simulator.h"

namespace loom::sim {

// The kinds the published rows are filed under (their parallelism_category column), and
// parameter servers, which no measured run validates.
enum class LayoutKind { kDataParallel, kSharded, kModelParallel, kParameterServer };
LayoutKind layout_kind(const SimPlan& p);  // tp, pp or cp > 1: model parallel; else ZeRO-2/3: sharded
const char* layout_kind_name(LayoutKind k);

// One validated run: its kind, the device it ran on ("A100", "H100", "local"), and the
// step-time error (predicted / measured - 1: negative means the simulator was optimistic).
struct ValidationPoint {
  LayoutKind kind = LayoutKind::kDataParallel;
  std::string device;
  double error = 0;
};

// Every compiled-in published row (configs/validation/published_runs.csv) the reader can
// express, through check_published; TFLOP/s rows turned into step-time errors.
const std::vector<ValidationPoint>& published_points();

// loom's engine on a calibrated machine: what bench/sim_vs_engine wrote beside the cluster
// file (validation_path_for). Empty when it has not run there. Throws loom::Error on a
// malformed file. `stamp` (optional): the calibration the errors were scored against
// ("" for a file that does not say).
std::vector<ValidationPoint> engine_points(const std::string& csv_path, std::string* stamp = nullptr);
std::string validation_path_for(const std::string& cluster_path);  // x.toml -> x.validation.csv
// `stamp`: calibration_stamp of the cluster file the predictions came from.
void write_engine_points(const std::string& csv_path, const std::vector<ValidationPoint>& points,
                         const std::string& stamp);
// Note [Stale error bands]: which calibration a cluster file holds (a hash of its text; ""
// when it cannot be read), and whether the errors beside it were scored against another one.
std::string calibration_stamp(const std::string& cluster_path);
bool engine_points_stale(const std::string& cluster_path);

struct ErrorBand {
  int64_t rows = 0;       // 0: no validation of this kind
  double median = 0;      // signed, step time
  double median_abs = 0, max_abs = 0;
  std::string basis;      // what the rows are, e.g. "12 published sharded data-parallel runs on H100"
};

// The band of `kind` on `device` (the cluster's device family): the points of that kind and
// device, else of that kind on any device (the basis says so), else none.
ErrorBand error_band(const std::vector<ValidationPoint>& points, LayoutKind kind, const std::string& device,
                     const std::string& what);

// "A100" for "A100-SXM4-80GB": the family the published rows name.
std::string device_family(const std::string& device_name);

}  // namespace loom::sim
