#include "loom/sim/cluster.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "loom/core/error.h"

namespace loom::sim {

// Generated from configs/clusters/*.toml by cmake/embed_presets.cmake.
const char* embedded_cluster_preset(const std::string& name);
std::vector<std::string> embedded_cluster_preset_names();

double Curve::at(double x) const {
  if (points.empty()) return 1.0;
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto& [x1, y1] = points[i];
    if (x > x1) continue;
    const auto& [x0, y0] = points[i - 1];
    const double f = (std::log(x) - std::log(x0)) / (std::log(x1) - std::log(x0));
    return y0 + f * (y1 - y0);
  }
  return points.back().second;
}

double WidthCurves::at(double width, double flops) const {
  if (by_width.empty()) return 1.0;
  if (width <= by_width.front().first) return by_width.front().second.at(flops);
  if (width >= by_width.back().first) return by_width.back().second.at(flops);
  size_t i = 1;
  while (by_width[i].first < width) ++i;
  const auto& [w0, c0] = by_width[i - 1];
  const auto& [w1, c1] = by_width[i];
  const double f = (std::log(width) - std::log(w0)) / (std::log(w1) - std::log(w0));
  return c0.at(flops) + f * (c1.at(flops) - c0.at(flops));
}

std::vector<std::string> cluster_preset_names() {
  auto names = embedded_cluster_preset_names();
  names.push_back("local");
  names.push_back("local-bf16");
  return names;
}

const char* cluster_preset_toml(const std::string& name) { return embedded_cluster_preset(name); }

namespace {

[[noreturn]] void bad(const std::string& origin, const std::string& key, const std::string& what) {
  throw ConfigError(detail::cat(origin, ": cluster.", key, " ", what));
}

// Reads the keys of one table, refusing any key not in `known`.
class TableReader {
 public:
  TableReader(const toml::table* t, std::string prefix, std::string origin, std::set<std::string> known)
      : t_(t), prefix_(std::move(prefix)), origin_(std::move(origin)) {
    if (!t_) return;
    for (const auto& [k, v] : *t_) {
      const std::string key(k.str());
      if (!known.count(key)) {
        std::string valid;
        for (const auto& n : known) valid += (valid.empty() ? "" : ", ") + n;
        bad(origin_, prefix_ + key, "is not a cluster key; valid here: " + valid);
      }
    }
  }
  double number(const std::string& key, double fallback, bool positive = true) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) return fallback;
    if (!n->is_number()) bad(origin_, prefix_ + key, "must be a number");
    const double v = *n->value<double>();
    if (!std::isfinite(v) || (positive ? !(v > 0) : v < 0))
      bad(origin_, prefix_ + key, detail::cat("= ", v, ": expected ", positive ? "> 0" : ">= 0"));
    return v;
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) return fallback;
    if (!n->is_integer() || *n->value<int64_t>() < 1) bad(origin_, prefix_ + key, "must be a positive integer");
    return *n->value<int64_t>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) return fallback;
    if (!n->is_string()) bad(origin_, prefix_ + key, "must be a string");
    return *n->value<std::string>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) return fallback;
    if (!n->is_boolean()) bad(origin_, prefix_ + key, "must be true or false");
    return *n->value<bool>();
  }
  // [[x, y], ...] with x increasing and y in (0, max_y].
  Curve curve(const std::string& key, double max_y) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (!n) bad(origin_, prefix_ + key, "is missing (a list of [size, value] pairs)");
    const toml::array* a = n->as_array();
    if (!a || a->empty()) bad(origin_, prefix_ + key, "must be a non-empty list of [size, value] pairs");
    Curve c;
    for (const auto& e : *a) {
      const toml::array* p = e.as_array();
      if (!p || p->size() != 2 || !(*p)[0].is_number() || !(*p)[1].is_number())
        bad(origin_, prefix_ + key, "entries must be [size, value] pairs of numbers");
      const double x = *(*p)[0].value<double>(), y = *(*p)[1].value<double>();
      if (!(x > 0) || !(y > 0) || y > max_y)
        bad(origin_, prefix_ + key, detail::cat("has [", x, ", ", y, "]: need size > 0 and 0 < value <= ", max_y));
      if (!c.points.empty() && !(x > c.points.back().first))
        bad(origin_, prefix_ + key, "sizes must increase");
      c.points.emplace_back(x, y);
    }
    return c;
  }
  // [[width, flops, value], ...] (Note [GEMM width]): widths, then FLOPs within a width, increasing.
  WidthCurves width_curves(const std::string& key, double max_y) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    const toml::array* a = n ? n->as_array() : nullptr;
    if (!a || a->empty()) bad(origin_, prefix_ + key, "must be a non-empty list of [width, flops, value] triples");
    WidthCurves w;
    for (const auto& e : *a) {
      const toml::array* p = e.as_array();
      if (!p || p->size() != 3 || !(*p)[0].is_number() || !(*p)[1].is_number() || !(*p)[2].is_number())
        bad(origin_, prefix_ + key, "entries must be [width, flops, value] triples of numbers");
      const double width = *(*p)[0].value<double>(), x = *(*p)[1].value<double>(), y = *(*p)[2].value<double>();
      if (!(width > 0) || !(x > 0) || !(y > 0) || y > max_y)
        bad(origin_, prefix_ + key, detail::cat("has [", width, ", ", x, ", ", y, "]: need width > 0, flops > 0 and 0 < value <= ", max_y));
      if (w.by_width.empty() || width > w.by_width.back().first) w.by_width.push_back({width, Curve{}});
      else if (width < w.by_width.back().first) bad(origin_, prefix_ + key, "widths must increase");
      Curve& c = w.by_width.back().second;
      if (!c.points.empty() && !(x > c.points.back().first))
        bad(origin_, prefix_ + key, detail::cat("FLOPs must increase within width ", width));
      c.points.emplace_back(x, y);
    }
    return w;
  }
  const toml::table* sub(const std::string& key) const {
    const toml::node* n = t_ ? t_->get(key) : nullptr;
    if (n && !n->is_table() && !n->is_array_of_tables()) bad(origin_, prefix_ + key, "must be a table");
    return n ? n->as_table() : nullptr;
  }

 private:
  const toml::table* t_;
  std::string prefix_, origin_;
};

LinkTier read_tier(const TableReader& root, const std::string& name, const std::string& origin) {
  TableReader r(root.sub(name), name + ".", origin, {"gbps", "latency_us", "efficiency"});
  LinkTier t;
  t.bw = r.number("gbps", 0) * 1e9;
  if (!(t.bw > 0)) bad(origin, name + ".gbps", "is missing (link bandwidth per device, GB/s)");
  t.latency_s = r.number("latency_us", 0, false) * 1e-6;
  t.efficiency = r.number("efficiency", 1);
  if (t.efficiency > 1) bad(origin, name + ".efficiency", detail::cat("= ", t.efficiency, ": expected <= 1"));
  return t;
}

// "cluster.a.b=v" -> a.b = v merged into `tbl`; a value that is not TOML is taken as a string.
void apply_set(toml::table& tbl, const std::string& set) {
  const auto eq = set.find('=');
  const std::string prefix = "cluster.";
  if (eq == std::string::npos || set.rfind(prefix, 0) != 0)
    throw ConfigError("--set '" + set + "': expected cluster.key=value");
  const std::string path = set.substr(prefix.size(), eq - prefix.size());
  const std::string value = set.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    std::ostringstream quoted;  // a bare word: take it as a string
    quoted << "v = " << toml::value<std::string>(value);
    parsed = toml::parse(quoted.str());
  }
  toml::table* at = &tbl;
  std::string rest = path;
  for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) {
    const std::string part = rest.substr(0, dot);
    if (!at->contains(part)) at->insert(part, toml::table{});
    at = (*at)[part].as_table();
    if (!at) throw ConfigError("--set '" + set + "': cluster." + part + " is not a table");
  }
  at->insert_or_assign(rest, *parsed.get("v"));
}

// Note [Memory-bound kernel classes]: <class>_efficiency, <class>_efficiency_1t and
// <class>_backward where present. A class curve is relative to memory_bw, which is the best
// of the classes' mean, so a fast class may pass 1.
void read_class_curves(const TableReader& root, const TableReader& d, DeviceSpec& dev) {
  const double most_1t = 8.0 * double(std::max<int64_t>(1, dev.threads));
  auto has = [&](const std::string& n) { return root.sub("device") && root.sub("device")->get(n); };
  for (int k = 1; k < kMemClasses; ++k) {
    const std::string key = mem_class_key(MemClass(k));
    if (has(key + "_efficiency")) dev.class_efficiency[k] = d.curve(key + "_efficiency", 8.0);
    if (has(key + "_efficiency_1t")) dev.class_efficiency_1t[k] = d.curve(key + "_efficiency_1t", most_1t);
    if (has(key + "_backward")) dev.class_backward[k] = d.curve(key + "_backward", 16.0);
  }
}

// The curves a device may leave out (each empty then: Note [Cost model] says what stands in).
void read_optional_curves(const TableReader& root, const TableReader& d, DeviceSpec& dev) {
  auto has = [&](const std::string& n) { return root.sub("device") && root.sub("device")->get(n); };
  if (has("attention_efficiency")) dev.attention_efficiency = d.curve("attention_efficiency", 1.0);
  const double most_1t = double(std::max<int64_t>(1, d.integer("threads", 0)));
  for (auto [key, curve, most] : {std::tuple{"optimizer_efficiency", &dev.optimizer_efficiency, 1.0},
                                  std::tuple{"optimizer_efficiency_1t", &dev.optimizer_efficiency_1t, most_1t}})
    if (has(key)) *curve = d.curve(key, most);
  for (int g = 1; g <= 3; ++g)
    if (const std::string key = "flash" + std::to_string(g) + "_efficiency"; has(key)) dev.flash_efficiency[g] = d.curve(key, 1.0);
  if (has("flash3_head_dim_rate")) dev.flash3_head_dim_rate = d.curve("flash3_head_dim_rate", 2.0);
  if (has("gemm_backward_factor")) dev.gemm_backward_factor = d.curve("gemm_backward_factor", 16.0);
  if (has("oversubscription")) dev.oversubscription = d.curve("oversubscription", 1.0);
  if (has("fp8_gemm_efficiency")) dev.fp8_gemm_efficiency = d.curve("fp8_gemm_efficiency", 1.0);
}

// Note [GEMM width] (sim/costs.cc): gemm_width_efficiency and its _1t where present; one
// thread can beat 1/threads of peak.
void read_width_curves(const TableReader& root, const TableReader& d, DeviceSpec& dev) {
  auto has = [&](const char* n) { return root.sub("device") && root.sub("device")->get(n); };
  if (has("gemm_width_efficiency")) dev.gemm_width_efficiency = d.width_curves("gemm_width_efficiency", 1.0);
  if (has("gemm_width_efficiency_1t"))
    dev.gemm_width_efficiency_1t = d.width_curves("gemm_width_efficiency_1t", double(std::max<int64_t>(1, dev.threads)));
}

// [offload]: the three tier keys, and the page cache's rates if measured.
OffloadTier read_offload(const TableReader& root, const std::string& origin) {
  TableReader o(root.sub("offload"), "offload.", origin,
                {"read_gbps", "write_gbps", "capacity_gib", "cached_read_gbps", "cached_write_gbps"});
  for (const char* k : {"read_gbps", "write_gbps", "capacity_gib"})
    if (!(o.number(k, 0, false) > 0)) bad(origin, std::string("offload.") + k, "is missing (> 0)");
  return {o.number("read_gbps", 0) * 1e9, o.number("write_gbps", 0) * 1e9,
          o.number("capacity_gib", 0) * double(int64_t(1) << 30), o.number("cached_read_gbps", 0) * 1e9,
          o.number("cached_write_gbps", 0) * 1e9};
}

}  // namespace

const char* mem_class_key(MemClass c) {
  switch (c) {
    case MemClass::kNorm: return "norm";
    case MemClass::kActivation: return "activation";
    case MemClass::kResidual: return "residual";
    default: return "";
  }
}

namespace {
toml::table parse_spec(const std::string& text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ": " << e.description() << " (line " << e.source().begin.line << ")";
    throw ConfigError(os.str());
  }
}
}  // namespace

ClusterSpec cluster_from_toml(const std::string& text, const std::string& origin,
                              const std::vector<std::string>& sets) {
  toml::table tbl = parse_spec(text, origin);
  for (const auto& s : sets) apply_set(tbl, s);
  TableReader root(&tbl, "", origin,
                   {"name", "nodes", "devices_per_node", "tray_devices", "device", "intra", "inter", "offload", "busbw"});
  ClusterSpec c;
  c.name = root.text("name", origin);
  c.nodes = root.integer("nodes", 1);
  c.devices_per_node = root.integer("devices_per_node", 1);
  c.tray_devices = root.integer("tray_devices", 0);  // a positive integer where given
  if (c.tray_devices > 0 && c.devices_per_node % c.tray_devices != 0)
    throw ConfigError(detail::cat(origin, ": tray_devices = ", c.tray_devices, " does not divide devices_per_node = ",
                                  c.devices_per_node, ": a node holds whole trays (Note [Partial racks])"));
  TableReader d(root.sub("device"), "device.", origin,
                {"name", "peak_tflops", "memory_gib", "memory_gbps", "dtype_bytes", "mixed_precision",
                 "gemm_efficiency", "memory_efficiency", "attention_efficiency", "flash1_efficiency",
                 "flash2_efficiency", "flash3_efficiency", "gemm_backward_factor",
                 "kernel_overhead_us", "shared", "page_fault_gbps", "threads", "gemm_efficiency_1t",
                 "attention_efficiency_1t", "memory_efficiency_1t", "optimizer_efficiency",
                 "optimizer_efficiency_1t", "special_function_tops", "norm_efficiency", "norm_efficiency_1t",
                 "norm_backward", "activation_efficiency", "activation_efficiency_1t", "activation_backward",
                 "residual_efficiency", "residual_efficiency_1t", "residual_backward", "gemm_width_efficiency",
                 "gemm_width_efficiency_1t", "overlap_cost", "flash3_head_dim_rate", "oversubscription",
                 "oversubscribed_sync_us", "speed_probe_gflops", "fp8_peak_tflops", "fp8_gemm_efficiency",
                 "fp4_peak_tflops", "host_gbps"});
  c.device.name = d.text("name", "device");
  c.device.peak_flops = d.number("peak_tflops", 0) * 1e12;
  c.device.memory_bytes = d.number("memory_gib", 0) * double(int64_t(1) << 30);
  c.device.memory_bw = d.number("memory_gbps", 0) * 1e9;
  for (const char* k : {"peak_tflops", "memory_gib", "memory_gbps"})
    if (!(d.number(k, 0) > 0)) bad(origin, std::string("device.") + k, "is missing");
  c.device.dtype_bytes = d.integer("dtype_bytes", 2);
  if (c.device.dtype_bytes != 2 && c.device.dtype_bytes != 4)
    bad(origin, "device.dtype_bytes", detail::cat("= ", c.device.dtype_bytes, ": expected 2 or 4"));
  c.device.mixed_precision = d.boolean("mixed_precision", c.device.dtype_bytes == 2);
  c.device.gemm_efficiency = d.curve("gemm_efficiency", 1.0);
  c.device.memory_efficiency = d.curve("memory_efficiency", 1.0);
  read_optional_curves(root, d, c.device);
  c.device.kernel_overhead_s = d.number("kernel_overhead_us", 0, false) * 1e-6;
  c.device.fp8_peak_flops = d.number("fp8_peak_tflops", 0, false) * 1e12;
  c.device.fp4_peak_flops = d.number("fp4_peak_tflops", 0, false) * 1e12;
  c.device.special_function_rate = d.number("special_function_tops", 0, false) * 1e12;
  c.device.page_fault_bw = d.number("page_fault_gbps", 0, false) * 1e9;
  c.device.host_bw = d.number("host_gbps", 0, false) * 1e9;
  if ((c.device.overlap_cost = d.number("overlap_cost", 0, false)) > 4)  // >= 0: number() refuses the rest
    bad(origin, "device.overlap_cost", detail::cat("= ", c.device.overlap_cost, ": expected 0 to 4 (Note [Overlap contention])"));
  if ((c.device.oversubscribed_sync_s = d.number("oversubscribed_sync_us", 0, false) * 1e-6) > 0.01)
    bad(origin, "device.oversubscribed_sync_us",
        detail::cat("= ", c.device.oversubscribed_sync_s * 1e6, ": expected 0 to 10000 (Note [Oversubscribed cores])"));
  c.device.speed_probe_flops = d.number("speed_probe_gflops", 0, false) * 1e9;
  c.device.shared = d.boolean("shared", false);
  if (!c.device.shared && (!c.device.oversubscription.points.empty() || c.device.oversubscribed_sync_s > 0))
    bad(origin, "device.oversubscription",
        "and oversubscribed_sync_us price ranks sharing one processor: set device.shared = true or remove them");
  c.device.threads = d.integer("threads", 0);
  if (root.sub("device") && root.sub("device")->get("gemm_efficiency_1t")) {  // all three or none
    const double most = double(std::max<int64_t>(1, c.device.threads));  // one thread can beat 1/threads
    c.device.gemm_efficiency_1t = d.curve("gemm_efficiency_1t", most);
    c.device.attention_efficiency_1t = d.curve("attention_efficiency_1t", most);
    c.device.memory_efficiency_1t = d.curve("memory_efficiency_1t", most);
  }
  read_class_curves(root, d, c.device);
  read_width_curves(root, d, c.device);
  c.intra = read_tier(root, "intra", origin);
  c.inter = read_tier(root, "inter", origin);
  if (root.sub("offload")) c.offload = read_offload(root, origin);
  if (const toml::node* b = tbl.get("busbw")) {
    const toml::array* arr = b->as_array();
    if (!arr || !arr->is_array_of_tables()) bad(origin, "busbw", "must be an array of tables ([[busbw]])");
    for (const auto& e : *arr) {
      TableReader r(e.as_table(), "busbw.", origin, {"op", "ranks", "gbps"});
      BusbwTable t{r.text("op", ""), r.integer("ranks", 2), r.curve("gbps", 1e6)};
      static const std::set<std::string> ops{"all_reduce", "all_gather", "reduce_scatter", "p2p"};
      if (!ops.count(t.op)) bad(origin, "busbw.op", "= '" + t.op + "': expected all_reduce, all_gather, reduce_scatter or p2p");
      c.busbw.push_back(std::move(t));
    }
  }
  return c;
}

namespace {
bool toml(const std::string& p) { return p.size() > 5 && p.substr(p.size() - 5) == ".toml"; }
}  // namespace

std::string cluster_file_path(const std::string& source, const std::string& local_path) {
  if (cluster_preset_toml(source)) return "";
  if (source == "local") return local_path;
  // local-bf16 (`loom calibrate --precision bf16`) sits beside local: cluster-local-bf16.toml.
  if (source == "local-bf16") return toml(local_path) ? local_path.substr(0, local_path.size() - 5) + "-bf16.toml" : local_path + "-bf16";
  return toml(source) ? source : "";
}

// Note [Partial racks]
// An NVL72 rack is 18 compute trays of 4 GPUs in one NVLink domain, and a job takes whole
// trays, not whole racks: 256 GPUs are 4 racks of 64 (16 trays each), not 3 racks and a
// remainder. With tray_devices set, --gpus N that is not a whole number of nodes spreads
// evenly over the fewest nodes that can hold it, R = ceil(N / devices_per_node), when N / R
// is whole trays; the node (the NVLink domain the job's groups see) is then N / R devices.
// Otherwise refused, naming the sizes around N that spread so. Fewer devices than a node are
// part of one node, as on every preset. Whole-node presets (DGX, tray_devices = 0) keep the
// whole-node rule.
namespace {
void spread_over_racks(ClusterSpec& c, int64_t gpus) {
  const int64_t racks = (gpus + c.devices_per_node - 1) / c.devices_per_node, step = racks * c.tray_devices;
  if (gpus % step == 0) {
    c.devices_per_node = gpus / racks, c.nodes = racks;
    return;
  }
  throw ConfigError(detail::cat("--gpus ", gpus, " does not spread evenly over ", racks, " ", c.name,
                                " nodes in whole trays of ", c.tray_devices, " devices (Note [Partial racks]); use ",
                                std::max((racks - 1) * c.devices_per_node, gpus / step * step), " or ",
                                (gpus / step + 1) * step));
}
}  // namespace

// Each rank of a shared device (loom ranks on one CPU) gets its share of the processor.
//
// Note [Oversubscribed cores]
// Ranks beyond the cores (dp 2 x tp 2 on two) are time-sliced by the OS, and that costs more
// than the halved share: between two synchronisations the scheduler's shares are unequal and
// the slowest rank sets the pace, and a rank waiting for a descheduled peer spins and yields.
// `loom calibrate` measures both on loom's kernels and collective layer
// (calibrate_oversubscribe.cc): `oversubscription`, x ranks a core -> the throughput kept
// over one rank a core at a step's cadence (one all-reduce of all ranks per ~0.1 s of a core's
// work), and `oversubscribed_sync_us`, the extra wait of one collective when pairs
// synchronise every ~8 ms (a tensor-parallel layer's cadence). With n ranks on t threads,
// n > t, each rank's peak and bandwidth are (peak / n) x oversubscription(n / t), and every
// collective (collective_time_s) costs the wait on top of its bytes; n <= t: neither.
// Measured here (two cores, eleven calibrations): kept 0.91-0.98 at two ranks a core,
// 0.94-0.99 at four, the wait 0-0.38 ms; loom's B at dp 2 x tp 2 had measured 4-16% slower
// than the shares alone predict.
namespace {
void share_processor(ClusterSpec& c) {
  const double n = double(c.devices_per_node);
  c.device.peak_flops /= n, c.device.memory_bw /= n, c.device.memory_bytes /= n, c.device.page_fault_bw /= n;
  DeviceSpec& d = c.device;
  if (d.threads > 0 && n > double(d.threads)) {  // Note [Oversubscribed cores]
    const double kept = d.oversubscription.at(n / double(d.threads));
    d.peak_flops *= kept, d.memory_bw *= kept, d.page_fault_bw *= kept;
  } else {
    d.oversubscribed_sync_s = 0;
  }
  if (d.threads > 1 && c.devices_per_node >= d.threads && !d.gemm_efficiency_1t.points.empty()) {
    // At most one thread per rank: the one-thread curves. They are fractions of
    // peak / threads; a rank holding threads / n of a thread runs at that fraction of
    // peak / n (the share set just above), whether n equals threads or exceeds it.
    d.gemm_efficiency = d.gemm_efficiency_1t, d.attention_efficiency = d.attention_efficiency_1t;
    if (!d.gemm_width_efficiency_1t.empty()) d.gemm_width_efficiency = d.gemm_width_efficiency_1t;
    d.memory_efficiency = d.memory_efficiency_1t;
    if (!d.optimizer_efficiency_1t.points.empty()) d.optimizer_efficiency = d.optimizer_efficiency_1t;
    for (int k = 1; k < kMemClasses; ++k)
      if (!d.class_efficiency_1t[k].points.empty()) d.class_efficiency[k] = d.class_efficiency_1t[k];
  }
}
}  // namespace

ClusterSpec load_cluster(const std::string& source, const std::vector<std::string>& sets, int64_t gpus,
                         const std::string& local_path) {
  std::string text, origin = source;
  if (const char* preset = cluster_preset_toml(source)) {
    text = preset;
  } else if (source == "local" || source == "local-bf16" || toml(source)) {
    const std::string path = cluster_file_path(source, local_path);
    std::ifstream f(path);
    if (!f) {
      if (source == "local" || source == "local-bf16")
        throw ConfigError("cluster '" + source + "' has no calibration at " + path + "; run `loom calibrate" +
                          (source == "local" ? "" : " --precision bf16") + "` first");
      throw ConfigError("cannot read cluster file " + path);
    }
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
    origin = path;
  } else {
    std::string names;
    for (const auto& n : cluster_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError("cluster '" + source + "' is not a preset (" + names + ") or a .toml file");
  }
  ClusterSpec c = cluster_from_toml(text, origin, sets);
  if (gpus > 0) {
    if (c.device.shared && gpus > c.devices_per_node)
      throw ConfigError(detail::cat("--gpus ", gpus, ": cluster ", c.name, " is one machine shared by at most ",
                                    c.devices_per_node, " ranks (cluster.devices_per_node); use --gpus <= ",
                                    c.devices_per_node));
    if (gpus < c.devices_per_node) {  // part of one node, as on every preset (trays or not)
      c.nodes = 1;
      c.devices_per_node = gpus;
      if (c.tray_devices > 0 && gpus % c.tray_devices != 0) c.tray_devices = 0;  // the spec stays one that loads
    } else if (gpus % c.devices_per_node != 0 && c.tray_devices > 0) {
      spread_over_racks(c, gpus);
    } else if (gpus % c.devices_per_node != 0) {
      throw ConfigError(detail::cat("--gpus ", gpus, " is not a whole number of ", c.name, " nodes (",
                                    c.devices_per_node, " devices each); use ",
                                    (gpus / c.devices_per_node + 1) * c.devices_per_node));
    } else {
      c.nodes = gpus / c.devices_per_node;
    }
  }
  if (c.device.shared) share_processor(c);
  return c;
}

std::string cluster_to_toml(const ClusterSpec& c) {
  std::ostringstream os;
  os.precision(10);  // round-trips the measured values (a rank's share of peak stays exact)
  auto curve = [&](const Curve& cv) {
    std::ostringstream s;
    s.precision(6);
    s << "[";
    for (size_t i = 0; i < cv.points.size(); ++i)
      s << (i ? ", " : "") << "[" << cv.points[i].first << ", " << cv.points[i].second << "]";
    s << "]";
    return s.str();
  };
  auto tier = [&](const char* name, const LinkTier& t) {
    os << "\n[" << name << "]\ngbps = " << t.bw / 1e9 << "\nlatency_us = " << t.latency_s * 1e6
       << "\nefficiency = " << t.efficiency << "\n";
  };
  os << "name = " << toml::value<std::string>(c.name) << "\nnodes = " << c.nodes
     << "\ndevices_per_node = " << c.devices_per_node << (c.tray_devices > 0 ? "\ntray_devices = " + std::to_string(c.tray_devices) : "")
     << "\n\n[device]\nname = " << toml::value<std::string>(c.device.name)
     << "\npeak_tflops = " << c.device.peak_flops / 1e12 << "\nmemory_gib = " << c.device.memory_bytes / double(int64_t(1) << 30)
     << "\nmemory_gbps = " << c.device.memory_bw / 1e9 << "\ndtype_bytes = " << c.device.dtype_bytes
     << "\nmixed_precision = " << (c.device.mixed_precision ? "true" : "false")
     << "\ngemm_efficiency = " << curve(c.device.gemm_efficiency)
     << "\nmemory_efficiency = " << curve(c.device.memory_efficiency);
  if (!c.device.attention_efficiency.points.empty())
    os << "\nattention_efficiency = " << curve(c.device.attention_efficiency);
  if (c.device.special_function_rate > 0) os << "\nspecial_function_tops = " << c.device.special_function_rate / 1e12;
  if (c.device.host_bw > 0) os << "\nhost_gbps = " << c.device.host_bw / 1e9;
  if (!c.device.optimizer_efficiency.points.empty())
    os << "\noptimizer_efficiency = " << curve(c.device.optimizer_efficiency);
  if (!c.device.optimizer_efficiency_1t.points.empty())
    os << "\noptimizer_efficiency_1t = " << curve(c.device.optimizer_efficiency_1t);
  for (int g = 1; g <= 3; ++g)
    if (!c.device.flash_efficiency[g].points.empty())
      os << "\nflash" << g << "_efficiency = " << curve(c.device.flash_efficiency[g]);
  if (!c.device.flash3_head_dim_rate.points.empty())
    os << "\nflash3_head_dim_rate = " << curve(c.device.flash3_head_dim_rate);
  if (!c.device.gemm_backward_factor.points.empty())
    os << "\ngemm_backward_factor = " << curve(c.device.gemm_backward_factor);
  if (c.device.page_fault_bw > 0) os << "\npage_fault_gbps = " << c.device.page_fault_bw / 1e9;
  if (c.device.overlap_cost > 0) os << "\noverlap_cost = " << c.device.overlap_cost;
  if (!c.device.oversubscription.points.empty()) os << "\noversubscription = " << curve(c.device.oversubscription);
  if (c.device.oversubscribed_sync_s > 0) os << "\noversubscribed_sync_us = " << c.device.oversubscribed_sync_s * 1e6;
  if (c.device.speed_probe_flops > 0) os << "\nspeed_probe_gflops = " << c.device.speed_probe_flops / 1e9;
  if (c.device.threads > 0) os << "\nthreads = " << c.device.threads;
  if (!c.device.gemm_efficiency_1t.points.empty())
    os << "\ngemm_efficiency_1t = " << curve(c.device.gemm_efficiency_1t)
       << "\nattention_efficiency_1t = " << curve(c.device.attention_efficiency_1t)
       << "\nmemory_efficiency_1t = " << curve(c.device.memory_efficiency_1t);
  auto widths = [&](const char* key, const WidthCurves& w) {
    if (w.empty()) return;
    os << "\n" << key << " = [";
    const char* sep = "";
    for (const auto& [width, cv] : w.by_width)
      for (const auto& [x, y] : cv.points) os << std::exchange(sep, ", ") << "[" << width << ", " << x << ", " << y << "]";
    os << "]";
  };
  widths("gemm_width_efficiency", c.device.gemm_width_efficiency);
  widths("gemm_width_efficiency_1t", c.device.gemm_width_efficiency_1t);
  for (int k = 1; k < kMemClasses; ++k) {
    const std::string key = mem_class_key(MemClass(k));
    const Curve* curves[3] = {&c.device.class_efficiency[k], &c.device.class_efficiency_1t[k], &c.device.class_backward[k]};
    const char* suffix[3] = {"_efficiency", "_efficiency_1t", "_backward"};
    for (int i = 0; i < 3; ++i)
      if (!curves[i]->points.empty()) os << "\n" << key << suffix[i] << " = " << curve(*curves[i]);
  }
  os << "\nkernel_overhead_us = " << c.device.kernel_overhead_s * 1e6
     << "\nshared = " << (c.device.shared ? "true" : "false") << "\n";
  tier("intra", c.intra);
  tier("inter", c.inter);
  if (c.offload.read_bw > 0)
    os << "\n[offload]\nread_gbps = " << c.offload.read_bw / 1e9 << "\nwrite_gbps = " << c.offload.write_bw / 1e9
       << "\ncapacity_gib = " << c.offload.capacity_bytes / double(int64_t(1) << 30) << "\n";
  if (c.offload.read_bw > 0 && c.offload.cached_read_bw > 0)
    os << "cached_read_gbps = " << c.offload.cached_read_bw / 1e9 << "\ncached_write_gbps = "
       << c.offload.cached_write_bw / 1e9 << "\n";
  for (const auto& b : c.busbw)
    os << "\n[[busbw]]\nop = \"" << b.op << "\"\nranks = " << b.ranks << "\ngbps = " << curve(b.gbps) << "\n";
  return os.str();
}

void scale_compute_rate(ClusterSpec& c, double f) {
  if (!(f > 0 && f <= 1))
    throw ConfigError(detail::cat("--compute-efficiency ", f, ": expected a fraction in (0, 1] of the cluster's GEMM ",
                                  "and attention rate (1: the cluster's own curves)"));
  if (f == 1) return;
  c.device.peak_flops *= f;
  c.name += detail::cat(" at ", f, " compute");
}

}  // namespace loom::sim
