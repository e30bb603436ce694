#include "loom/sim/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/sim/published.h"

namespace loom::sim {

const char* embedded_published_runs();  // generated from configs/validation/published_runs.csv

// Note [Error bands]
// A plan is only as good as the simulator's step time, so `loom plan` prints beside each
// candidate the error the simulator showed on measured runs of the same kind: the
// published runs compiled in (configs/validation/published_runs.csv, the rows
// bench/sim_published checks, each through the same check_published) for the GPU
// frameworks, and for loom's own engine the layouts bench/sim_vs_engine measured on this
// machine, which it writes beside the calibrated cluster file. Kinds follow the published
// rows' parallelism_category: data parallel only, sharded data parallel (ZeRO-2/3, FSDP) and
// model parallel (tp, pp or cp, with or without dp, and with ZeRO on top, which no published
// row combines); parameter-server layouts have no measured runs. The band is the kind's rows on the cluster's device family when there are
// any, else on every device (and says so). Errors are in step time, predicted / measured - 1
// (a TFLOP/s row's error is published / predicted - 1), so a negative median means the
// simulator's steps come out shorter than the runs'. A band is a statement about the
// simulator's past, not a bound: two candidates whose step times differ by less than it are
// not reliably ranked (Note [Plan explanation] in plan/search.h says so when it happens).

LayoutKind layout_kind(const SimPlan& p) {
  const ParallelConfig& par = p.cfg.parallel;
  if (par.ps_servers > 0) return LayoutKind::kParameterServer;
  if (par.tp > 1 || par.pp > 1 || p.cp > 1) return LayoutKind::kModelParallel;
  if (par.zero >= 2) return LayoutKind::kSharded;
  return LayoutKind::kDataParallel;
}

const char* layout_kind_name(LayoutKind k) {
  switch (k) {
    case LayoutKind::kDataParallel: return "data-parallel";
    case LayoutKind::kSharded: return "sharded data-parallel";
    case LayoutKind::kModelParallel: return "model-parallel";
    case LayoutKind::kParameterServer: return "parameter-server";
  }
  return "?";
}

namespace {

LayoutKind kind_named(const std::string& name, const std::string& origin) {
  for (LayoutKind k : {LayoutKind::kDataParallel, LayoutKind::kSharded, LayoutKind::kModelParallel,
                       LayoutKind::kParameterServer})
    if (name == layout_kind_name(k)) return k;
  throw Error(origin + ": unknown layout kind '" + name + "' (the file is written by bench/sim_vs_engine)");
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

std::string device_family(const std::string& device_name) { return device_name.substr(0, device_name.find('-')); }

const std::vector<ValidationPoint>& published_points() {
  static const std::vector<ValidationPoint> points = [] {
    std::vector<ValidationPoint> out;
    for (const PublishedRun& row : parse_published_runs(embedded_published_runs(), "configs/validation/published_runs.csv")) {
      PublishedCheck c;
      try {
        c = check_published(row);
      } catch (const Error&) {
        continue;  // a row the reader cannot express (bench/sim_published prints why)
      }
      out.push_back({layout_kind(c.plan), row.gpu_family(), c.step_time_error()});
    }
    return out;
  }();
  return points;
}

std::string validation_path_for(const std::string& cluster_path) {
  const bool toml = cluster_path.size() > 5 && cluster_path.substr(cluster_path.size() - 5) == ".toml";
  return (toml ? cluster_path.substr(0, cluster_path.size() - 5) : cluster_path) + ".validation.csv";
}

// Note [Stale error bands]
// The engine's errors are a statement about one calibration: on a VM whose speed drifts, a
// recalibration moves every prediction by several percent (docs/log/benchmarks.md), so errors
// scored against an earlier calibration say little about the current one. bench/sim_vs_engine
// writes the cluster file's stamp (an FNV-1a hash of its text) as the CSV's first line, and
// `loom plan` says so beside each band when the stamp is not the current file's (or the CSV
// has none), naming the command that measures them again.
std::string calibration_stamp(const std::string& cluster_path) {
  std::ifstream f(cluster_path, std::ios::binary);
  if (!f) return "";
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits
  for (char c; f.get(c);) h = (h ^ uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  std::ostringstream os;
  os << std::hex << h;
  return os.str();
}

bool engine_points_stale(const std::string& cluster_path) {
  std::string stamp;
  if (engine_points(validation_path_for(cluster_path), &stamp).empty()) return false;
  return stamp.empty() || stamp != calibration_stamp(cluster_path);
}

std::vector<ValidationPoint> engine_points(const std::string& csv_path, std::string* stamp) {
  std::ifstream f(csv_path);
  if (stamp) stamp->clear();
  if (!f) return {};
  std::vector<ValidationPoint> out;
  std::string line;
  int n = 1;
  std::getline(f, line);
  if (line.rfind("# calibration ", 0) == 0) {
    if (stamp) *stamp = line.substr(14);
    std::getline(f, line), ++n;
  }
  // line: the header, kind,device,error
  for (++n; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    std::string kind, device, error;
    std::getline(ss, kind, ','), std::getline(ss, device, ','), std::getline(ss, error, ',');
    char* end = nullptr;
    const double e = std::strtod(error.c_str(), &end);
    if (error.empty() || *end != '\0' || !std::isfinite(e))
      throw Error(csv_path + ": line " + std::to_string(n) + ": error '" + error + "' is not a number; rerun bench/sim_vs_engine");
    out.push_back({kind_named(kind, csv_path), device, e});
  }
  return out;
}

void write_engine_points(const std::string& csv_path, const std::vector<ValidationPoint>& points,
                         const std::string& stamp) {
  std::ofstream f(csv_path);
  f << "# calibration " << stamp << "\nkind,device,error\n";
  for (const ValidationPoint& p : points) f << layout_kind_name(p.kind) << "," << p.device << "," << p.error << "\n";
  if (!f) throw Error("cannot write " + csv_path);
}

ErrorBand error_band(const std::vector<ValidationPoint>& points, LayoutKind kind, const std::string& device,
                     const std::string& what) {
  std::vector<double> here, any;
  for (const ValidationPoint& p : points)
    if (p.kind == kind) (p.device == device ? here : any).push_back(p.error);
  ErrorBand b;
  const bool local = !here.empty();
  std::vector<double>& errs = local ? here : any;
  if (errs.empty()) {
    b.basis = std::string("no measured ") + layout_kind_name(kind) + " runs: this kind is not validated";
    return b;
  }
  b.rows = int64_t(errs.size());
  b.median = median_of(errs);
  for (double& e : errs) e = std::fabs(e), b.max_abs = std::max(b.max_abs, e);
  b.median_abs = median_of(errs);
  b.basis = std::to_string(b.rows) + " " + what + " " + layout_kind_name(kind) + " runs " +
            (local ? "on " + device : "on other devices (none on " + device + ")");
  return b;
}

}  // namespace loom::sim
