// `loom plot` (Note [Run plots]): two runs' JSON lines drawn as curves on shared axes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

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
  testing_support::expect_usage_error("plot " + d + "/run.jsonl --out " + d + "/a.png", "rsvg-convert");
  testing_support::expect_usage_error("plot " + d + "/missing.jsonl --out " + d + "/a.svg", "missing.jsonl");
  std::ofstream(d + "/mine.svg") << "<svg>a user's drawing</svg>\n";
  const auto r = run_loom("plot " + d + "/run.jsonl --out " + d + "/mine.svg");
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(read_all(d + "/mine.svg"), "<svg>a user's drawing</svg>\n");
}

}  // namespace
}  // namespace loom
