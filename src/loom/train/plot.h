// Curves of training runs (Note [Run plots]): `loom plot RUN... --out FILE.svg`.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// Note [Run plots]
// A run is what `loom train --json` or `--csv` printed (JSON lines, or a header and rows;
// other lines are skipped): each numeric field of a line with "step" (each non-empty cell of
// a row) is a point (step, value) of that metric. plot_svg
// draws one panel per metric asked for (two columns), every run a polyline in its own
// colour on the panel's shared axes (x: step, y: the runs' range with 5% margins; tick
// labels in %.3g), a legend naming the runs, and "no data" where no run has the metric -
// the obvious use being an approximate mode beside its exact reference. The SVG is text loom
// writes itself (marked as loom's, Note [User-named outputs]); a PNG is that SVG rendered
// by librsvg's rsvg-convert (Debian's librsvg2-bin), with loom's mark added as a tEXt chunk
// right after the header so the next run recognises its own file.
struct RunSeries {
  std::string label;
  std::map<std::string, std::vector<std::pair<double, double>>> metrics;  // name -> (step, value) in file order
};

// Throws loom::Error naming the file when it is unreadable or holds no step lines.
RunSeries read_run_log(const std::string& path, const std::string& label);
std::string plot_svg(const std::vector<RunSeries>& runs, const std::vector<std::string>& metrics);
// The PNG bytes of `svg`, marked. Throws loom::Error when rsvg-convert is missing (naming
// the package) or fails (with its message).
std::string svg_to_png(const std::string& svg);

}  // namespace loom
