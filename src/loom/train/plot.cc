#include "loom/train/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/fileio.h"
#include "loom/core/owned.h"
#include "loom/core/xml.h"

namespace loom {

RunSeries read_run_log(const std::string& path, const std::string& label) {
  RunSeries r;
  r.label = label;
  std::istringstream in(owned::read_regular(path, size_t(1) << 30));
  std::string line;
  int64_t points = 0;
  std::vector<std::string> header;  // --csv output: its columns
  while (std::getline(in, line)) {
    if (line.rfind("step,", 0) == 0) {
      header.clear();
      for (std::istringstream cols(line); std::getline(cols, header.emplace_back(), ',');) {}
      header.pop_back();
      continue;
    }
    if (!header.empty() && !line.empty() && line[0] != '{') {  // a --csv row (empty cells: no value)
      std::istringstream cells(line);
      std::string cell;
      double step = 0;
      for (size_t c = 0; c < header.size() && std::getline(cells, cell, ','); c++) {
        char* end = nullptr;
        const double v = std::strtod(cell.c_str(), &end);
        if (cell.empty() || end != cell.c_str() + cell.size() || !std::isfinite(v)) continue;
        if (c == 0) step = v;
        else r.metrics[header[c]].push_back({step, v}), points++;
      }
      continue;
    }
    if (line.empty() || line[0] != '{') continue;  // plain log lines, warnings
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number()) continue;
    const double step = j["step"].get<double>();
    for (const auto& [key, v] : j.items())
      if (key != "step" && v.is_number() && std::isfinite(v.get<double>())) {
        r.metrics[key].push_back({step, v.get<double>()});
        points++;
      }
  }
  LOOM_CONFIG_CHECK(points > 0, "plot: '", path, "' holds no step lines of `loom train --json` or `--csv` (JSON objects "
                    "with \"step\", or rows under a step,... header); save a run's output with `loom train --json > FILE`");
  return r;
}

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                   "#7f7f7f"};
constexpr double kPanelW = 560, kPanelH = 300, kLeft = 70, kRight = 20, kTop = 30, kBottom = 40, kHeader = 60;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
  bool empty() const { return lo > hi; }
  // 5% margins; a flat series gets a unit-wide band.
  void pad() {
    const double span = hi > lo ? hi - lo : std::max(1.0, std::abs(lo));
    lo -= 0.05 * span, hi += 0.05 * span;
  }
};

void panel(std::ostringstream& f, const std::vector<RunSeries>& runs, const std::string& metric, double x0, double y0) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "<g transform=\"translate(%.0f,%.0f)\">\n<text x=\"%.0f\" y=\"18\" font-size=\"13\">",
                x0, y0, kLeft);
  f << buf << xml_escape(metric) << "</text>\n";
  const double w = kPanelW - kLeft - kRight, h = kPanelH - kTop - kBottom;
  std::snprintf(buf, sizeof buf, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>\n",
                kLeft, kTop, w, h);
  f << buf;
  Range xs, ys;
  for (const RunSeries& r : runs)
    if (auto it = r.metrics.find(metric); it != r.metrics.end())
      for (const auto& [x, y] : it->second) xs.add(x), ys.add(y);
  if (xs.empty()) {
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">no data</text>\n</g>\n",
                  kLeft + w / 2, kTop + h / 2);
    f << buf;
    return;
  }
  if (xs.hi == xs.lo) xs.hi = xs.lo + 1;
  ys.pad();
  auto px = [&](double x) { return kLeft + (x - xs.lo) / (xs.hi - xs.lo) * w; };
  auto py = [&](double y) { return kTop + h - (y - ys.lo) / (ys.hi - ys.lo) * h; };
  for (int i = 0; i <= 4; i++) {  // ticks
    const double x = xs.lo + (xs.hi - xs.lo) * i / 4, y = ys.lo + (ys.hi - ys.lo) * i / 4;
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.3g</text>\n"
                  "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                  px(x), kTop + h + 16, x, kLeft - 4, py(y) + 4, y);
    f << buf;
  }
  for (size_t i = 0; i < runs.size(); i++) {
    const auto it = runs[i].metrics.find(metric);
    if (it == runs[i].metrics.end()) continue;
    f << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << kColors[i % std::size(kColors)] << "\" points=\"";
    for (const auto& [x, y] : it->second) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", px(x), py(y));
      f << buf;
    }
    f << "\"><title>" << xml_escape(runs[i].label) << "</title></polyline>\n";
  }
  f << "</g>\n";
}

}  // namespace

std::string plot_svg(const std::vector<RunSeries>& runs, const std::vector<std::string>& metrics) {
  const size_t cols = metrics.size() > 1 ? 2 : 1, rows = (metrics.size() + cols - 1) / cols;
  const double width = kPanelW * double(cols), height = kHeader + kPanelH * double(rows);
  std::ostringstream f;
  char buf[512];
  f << svg_open(width, height);
  double x = 10;
  for (size_t i = 0; i < runs.size(); i++) {  // the legend
    std::snprintf(buf, sizeof buf, "<rect x=\"%.0f\" y=\"14\" width=\"14\" height=\"4\" fill=\"%s\"/>", x,
                  kColors[i % std::size(kColors)]);
    f << buf << "<text x=\"" << x + 18 << "\" y=\"20\">" << xml_escape(runs[i].label) << "</text>\n";
    x += 30 + 7.0 * double(runs[i].label.size());
  }
  for (size_t m = 0; m < metrics.size(); m++)
    panel(f, runs, metrics[m], kPanelW * double(m % cols), kHeader + kPanelH * double(m / cols));
  f << "</svg>\n";
  return f.str();
}

namespace {

// One PNG chunk: length, type, data, CRC-32 of type and data (PNG spec, section 5.3).
std::string png_chunk(const std::string& type, const std::string& data) {
  std::string out;
  const uint32_t n = uint32_t(data.size());
  for (int k = 3; k >= 0; k--) out.push_back(char((n >> (8 * k)) & 0xff));
  out += type + data;
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(out.data() + 4), uInt(type.size() + data.size()));
  for (int k = 3; k >= 0; k--) out.push_back(char((crc >> (8 * k)) & 0xff));
  return out;
}

// Runs rsvg-convert on `in`, writing `out`; its stderr goes to `err`.
void run_rsvg(const std::string& in, const std::string& out, const std::string& err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::string a0 = "rsvg-convert", a1 = "--format=png", a2 = "-o";
  std::string a3 = out, a4 = in;
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "rsvg-convert", &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  LOOM_CHECK(rc == 0, "loom plot writes a PNG with rsvg-convert, which could not be started (", std::strerror(rc),
             "): install it (apt-get install librsvg2-bin) or write FILE.svg");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  LOOM_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rsvg-convert failed making the PNG (",
             read_file_bytes(err), ")");
}

}  // namespace

std::string svg_to_png(const std::string& svg) {
  std::string dir = (std::filesystem::temp_directory_path() / "loom-plot-XXXXXX").string();
  LOOM_CHECK(::mkdtemp(dir.data()) != nullptr, "cannot make a temporary directory for the PNG under ",
             std::filesystem::temp_directory_path().string(), ": ", std::strerror(errno));
  const std::string in = dir + "/plot.svg", out = dir + "/plot.png", err = dir + "/stderr";
  std::string png;
  try {
    write_file_atomic(in, svg);
    run_rsvg(in, out, err);
    png = read_file_bytes(out);
  } catch (...) {
    std::filesystem::remove_all(dir);
    throw;
  }
  std::filesystem::remove_all(dir);
  // Signature (8 bytes), then IHDR (4 + 4 + 13 + 4 bytes): the mark goes right after it.
  LOOM_CHECK(png.size() > 33 && png.compare(1, 3, "PNG") == 0 && png.compare(12, 4, "IHDR") == 0,
             "rsvg-convert wrote something that is not a PNG (", png.size(), " bytes)");
  const std::string& mark = owned::marks::kPng[0];
  return png.substr(0, 33) + png_chunk("tEXt", mark) + png.substr(33);
}

}  // namespace loom

