// `loom plot` (Note [Run plots]): two runs' JSON lines drawn as curves on shared axes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <zlib.h>

#include "support/loom_cli.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using testing_support::fresh_dir;
using testing_support::run_loom;

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The polylines of the file: their colour and points, in order.
std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> polylines(const std::string& svg) {
  std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> out;
  const std::regex line("<polyline[^>]*stroke=\"(#[0-9a-f]+)\" points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), line), end; it != end; ++it) {
    std::vector<std::pair<double, double>> pts;
    std::istringstream in((*it)[2].str());
    std::string p;
    while (in >> p) pts.push_back({std::stod(p.substr(0, p.find(','))), std::stod(p.substr(p.find(',') + 1))});
    out.push_back({(*it)[1].str(), pts});
  }
  return out;
}

TEST(PlotCli, TwoRunsDrawOneCurveEachPerPanelOnSharedAxes) {
  const std::string d = fresh_dir("loom-plot");
  for (const char* name : {"exact", "topk"}) {
    const auto r = run_loom(testing_support::tiny_train(d + "/" + name, 8, "--json --set train.log_every=1 --set "
                                                                          "train.val_every=4") +
                            (std::string(name) == "topk" ? " --set parallel.dp=2 --set parallel.compress=topk --nproc 2"
                                                         : ""));
    ASSERT_EQ(r.code, 0) << r.output;
    std::ofstream(d + "/" + name + ".jsonl") << r.output;  // warnings and log text beside the JSON lines
  }
  const std::string svg = d + "/curves.svg";
  auto r = run_loom("plot " + d + "/exact.jsonl " + d + "/topk.jsonl --out " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string text = read_all(svg);
  const auto lines = polylines(text);
  ASSERT_EQ(lines.size(), 8u) << "loss, val_loss, tokens_per_s, lr for each run";
  EXPECT_NE(lines[0].first, lines[1].first) << "each run its own colour";
  EXPECT_EQ(lines[0].second.size(), 8u);  // the train loss of 8 steps
  EXPECT_EQ(lines[2].second.size(), 2u);  // val_loss at steps 4 and 8
  for (const auto& [colour, pts] : lines)
    for (const auto& [x, y] : pts) {  // inside the panel's plot box (panel coordinates)
      EXPECT_GE(x, 70);
      EXPECT_LE(x, 540);
      EXPECT_GE(y, 30);
      EXPECT_LE(y, 260);
    }
  // Shared axes: the first and last loss points span the panel's width.
  EXPECT_NEAR(lines[0].second.front().first, 70, 0.1);
  EXPECT_NEAR(lines[0].second.back().first, 540, 0.1);
  EXPECT_NE(text.find(">exact<"), std::string::npos);
  EXPECT_NE(text.find(">topk<"), std::string::npos);

  // A metric no run has gets its panel, marked; the file is replaced (it is loom's).
  r = run_loom("plot " + d + "/exact.jsonl --metrics loss,ps_staleness --out " + svg);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(read_all(svg).find("no data"), std::string::npos);
  EXPECT_EQ(polylines(read_all(svg)).size(), 1u);
}

// --csv carries the JSON lines' values (the same deterministic run), and plot reads either.
TEST(PlotCli, CsvRowsCarryTheJsonLinesValuesAndPlotTheSame) {
  const std::string d = fresh_dir("loom-plot-csv");
  const std::string args = " --set train.log_every=1 --set train.val_every=3";
  const auto js = run_loom(testing_support::tiny_train(d + "/a", 6, "--json" + args));
  const auto cs = run_loom(testing_support::tiny_train(d + "/b", 6, "--csv" + args));
  ASSERT_EQ(js.code, 0) << js.output;
  ASSERT_EQ(cs.code, 0) << cs.output;
  std::ofstream(d + "/run.jsonl") << js.output;
  std::ofstream(d + "/run.csv") << cs.output;
  std::vector<double> json_loss, csv_loss, csv_val;
  std::istringstream jl(js.output), cl(cs.output);
  for (std::string line; std::getline(jl, line);)
    if (!line.empty() && line[0] == '{')
      if (const auto j = nlohmann::json::parse(line); j.contains("loss")) json_loss.push_back(j["loss"].get<double>());
  bool header = false;
  for (std::string line; std::getline(cl, line);) {
    if (line.rfind("step,loss,lr,grad_norm,tokens_per_s", 0) == 0) header = true;
    else if (header && !line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) {
      std::vector<std::string> cells;
      std::istringstream row(line);
      for (std::string c; std::getline(row, c, ',');) cells.push_back(c);
      if (cells.size() > 1 && !cells[1].empty()) csv_loss.push_back(std::stod(cells[1]));
      if (cells.size() > 10 && !cells[10].empty()) csv_val.push_back(std::stod(cells[10]));
    }
  }
  ASSERT_TRUE(header) << cs.output;
  EXPECT_EQ(csv_loss.size(), 6u);
  EXPECT_EQ(csv_loss, json_loss);  // the same run, every digit
  EXPECT_EQ(csv_val.size(), 2u);   // validations at steps 3 and 6
  ASSERT_EQ(run_loom("plot " + d + "/run.jsonl --metrics loss,val_loss --out " + d + "/j.svg").code, 0);
  ASSERT_EQ(run_loom("plot " + d + "/run.csv --metrics loss,val_loss --out " + d + "/c.svg").code, 0);
  const auto pj = polylines(read_all(d + "/j.svg")), pc = polylines(read_all(d + "/c.svg"));
  ASSERT_EQ(pj.size(), 2u);
  EXPECT_EQ(pc, pj);
}

TEST(PlotCli, RefusesWhatItCannotDrawOrMustNotReplace) {
  const std::string d = fresh_dir("loom-plot-bad");
  std::ofstream(d + "/text.log") << "step 1/8  loss 5.5\n";
  testing_support::expect_usage_error("plot " + d + "/text.log --out " + d + "/a.svg", "holds no step lines");
  std::ofstream(d + "/run.jsonl") << "{\"step\": 1, \"loss\": 5.5}\n";
  testing_support::expect_usage_error("plot " + d + "/run.jsonl --out " + d + "/a.gif", "name FILE.svg or FILE.png");
  testing_support::expect_usage_error("plot " + d + "/missing.jsonl --out " + d + "/a.svg", "missing.jsonl");
  std::ofstream(d + "/mine.svg") << "<svg>a user's drawing</svg>\n";
  const auto r = run_loom("plot " + d + "/run.jsonl --out " + d + "/mine.svg");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(read_all(d + "/mine.svg"), "<svg>a user's drawing</svg>\n");
}

// A PNG decoded by the spec (8-bit RGB or RGBA, non-interlaced, as rsvg-convert writes
// them): its size, its tEXt chunks and its pixels, unfiltered (PNG spec, section 9).
struct Png {
  uint32_t width = 0, height = 0;
  int channels = 0;
  std::vector<std::string> text;
  std::vector<uint8_t> pixels;  // (height, width, channels)
};

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint32_t(uint8_t(s[at + 3]));
}

Png decode_png(const std::string& f) {
  Png p;
  EXPECT_EQ(f.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  for (size_t at = 8; at + 8 <= f.size();) {
    const uint32_t n = be32(f, at);
    const std::string type = f.substr(at + 4, 4), data = f.substr(at + 8, n);
    if (type == "IHDR") {
      p.width = be32(data, 0), p.height = be32(data, 4);
      EXPECT_EQ(data[8], 8) << "bit depth";
      p.channels = data[9] == 6 ? 4 : data[9] == 2 ? 3 : 0;
      EXPECT_EQ(data[12], 0) << "interlaced";
    }
    if (type == "tEXt") p.text.push_back(data);
    if (type == "IDAT") idat += data;
    at += 12 + n;
  }
  const size_t stride = size_t(p.width) * size_t(p.channels);
  std::vector<uint8_t> raw((stride + 1) * p.height);
  uLongf len = uLongf(raw.size());
  EXPECT_EQ(uncompress(raw.data(), &len, reinterpret_cast<const Bytef*>(idat.data()), uLong(idat.size())), Z_OK);
  p.pixels.assign(stride * p.height, 0);
  const int bpp = p.channels;
  for (size_t y = 0; y < p.height; y++) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &p.pixels[y * stride];
    const uint8_t* up = y ? &p.pixels[(y - 1) * stride] : nullptr;
    for (size_t x = 0; x < stride; x++) {
      const int a = x >= size_t(bpp) ? out[x - bpp] : 0, b = up ? up[x] : 0, c = up && x >= size_t(bpp) ? up[x - bpp] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      out[x] = uint8_t(in[x] + pred);
    }
  }
  return p;
}

// Pixels within 8 of colour (r, g, b), opaque.
int count_colour(const Png& p, int r, int g, int b) {
  int n = 0;
  for (size_t i = 0; i + size_t(p.channels) <= p.pixels.size(); i += size_t(p.channels))
    n += std::abs(p.pixels[i] - r) <= 8 && std::abs(p.pixels[i + 1] - g) <= 8 && std::abs(p.pixels[i + 2] - b) <= 8 &&
         (p.channels == 3 || p.pixels[i + 3] > 200);
  return n;
}

// --out FILE.png: the SVG rendered (its size, each run's curve in its colour), marked as
// loom's so the next plot replaces it and a user's PNG is never replaced.
TEST(PlotCli, APngIsTheSvgRenderedAndMarkedAsLooms) {
  const std::string d = fresh_dir("loom-plot-png");
  {
    std::ofstream a(d + "/exact.jsonl"), b(d + "/approx.jsonl");
    for (int s = 1; s <= 20; s++) {
      a << "{\"step\": " << s << ", \"loss\": " << 6.0 - 0.1 * s << "}\n";
      b << "{\"step\": " << s << ", \"loss\": " << 6.0 - 0.05 * s << "}\n";
    }
  }
  const std::string runs = d + "/exact.jsonl " + d + "/approx.jsonl --metrics loss";
  auto r = run_loom("plot " + runs + " --out " + d + "/c.png");
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(run_loom("plot " + runs + " --out " + d + "/c.svg").code, 0);
  const std::string svg = read_all(d + "/c.svg");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex("width=\"([0-9]+)\" height=\"([0-9]+)\"")));
  const Png p = decode_png(read_all(d + "/c.png"));
  EXPECT_EQ(p.width, uint32_t(std::stoul(m[1]))) << "the SVG's size";
  EXPECT_EQ(p.height, uint32_t(std::stoul(m[2])));
  ASSERT_GT(p.channels, 0);
  ASSERT_EQ(p.text.size(), 1u);
  EXPECT_EQ(p.text[0], std::string("Software\0generated by loom plot", 31));
  // Each run's polyline in its colour (#1f77b4, #d62728): a curve across the panel is
  // hundreds of pixels; a third colour of the palette is not drawn.
  EXPECT_GT(count_colour(p, 0x1f, 0x77, 0xb4), 100);
  EXPECT_GT(count_colour(p, 0xd6, 0x27, 0x28), 100);
  EXPECT_EQ(count_colour(p, 0x2c, 0xa0, 0x2c), 0);
  r = run_loom("plot " + d + "/exact.jsonl --out " + d + "/c.png");  // its own earlier file: replaced
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count_colour(decode_png(read_all(d + "/c.png")), 0xd6, 0x27, 0x28), 0);
  std::ofstream(d + "/mine.png") << "\x89PNG a user's picture";
  EXPECT_NE(run_loom("plot " + runs + " --out " + d + "/mine.png").code, 0);
  EXPECT_EQ(read_all(d + "/mine.png"), "\x89PNG a user's picture");
}

}  // namespace
}  // namespace loom
