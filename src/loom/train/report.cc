#include "loom/train/report.h"

#include "loom/train/tensorboard.h"

#include <cmath>
#include <cstdio>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

namespace loom {

namespace {

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const int64_t t = int64_t(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << ":" << std::setw(2) << std::setfill('0') << (t / 60) % 60;
  else os << t / 60;
  os << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return os.str();
}

}  // namespace

void Reporter::info(const std::string& line) { *o_.err << line << "\n"; }

void Reporter::step(const StepLine& s) {
  const int64_t step = s.step;
  if (tb_) {
    std::vector<std::pair<std::string, double>> v = {
        {"train/loss", s.loss}, {"train/lr", s.lr}, {"train/grad_norm", s.norm}, {"train/tokens_per_s", s.tok_s}};
    if (s.loss_scale > 0) v.push_back({"train/loss_scale", s.loss_scale});
    if (s.padding >= 0) v.push_back({"train/padding", s.padding});
    for (const auto& [name, share] : s.mix) v.push_back({"data/mix/" + name, share});
    tb_->scalars(step + 1, v);
  }
  const bool print = s.log_line || s.skipped;
  const double eta = s.elapsed / double(step + 1) * double(steps_ - step - 1);
  if (o_.csv) {
    if (!print) return;
    csv_row({double(step + 1), s.loss, s.lr, s.norm, s.tok_s, s.elapsed, eta, s.loss_scale > 0 ? s.loss_scale : NAN,
             s.padding >= 0 ? s.padding : NAN, s.skipped ? 1.0 : NAN, NAN, NAN});
  } else if (o_.json) {
    if (!print) return;
    nlohmann::json j = {{"step", step + 1}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.norm},
                        {"tokens_per_s", s.tok_s}, {"elapsed_s", s.elapsed}, {"eta_s", eta}};
    if (s.padding >= 0) j["padding"] = s.padding;
    if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale;
    if (s.skipped) j["skipped"] = true;
    for (const auto& [name, share] : s.mix) j["mix"][name] = share;
    *o_.out << j.dump() << "\n" << std::flush;
  } else if (o_.progress) {
    const int width = 24, filled = int(width * (step + 1) / steps_);
    std::ostringstream os;
    os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << step + 1 << "/"
       << steps_ << "  loss " << std::fixed << std::setprecision(4) << s.loss << "  " << std::setprecision(0)
       << s.tok_s << " tok/s  ETA " << fmt_duration(eta) << "   ";
    *o_.err << os.str() << std::flush;
    bar_open_ = true;
  } else if (print) {
    std::ostringstream os;
    os << "step " << step + 1 << "/" << steps_ << "  loss " << std::fixed << std::setprecision(4) << s.loss
       << "  lr " << std::scientific << std::setprecision(2) << s.lr << "  grad_norm " << std::fixed
       << std::setprecision(3) << s.norm << "  " << std::setprecision(0) << s.tok_s << " tok/s";
    if (s.padding >= 0) os << " (" << std::setprecision(1) << 100 * s.padding << "% padding)";
    if (s.loss_scale > 0) os << "  loss_scale " << std::defaultfloat << std::setprecision(6) << s.loss_scale;
    if (s.skipped) os << "  SKIPPED (gradient overflow)";
    os << "  ETA " << fmt_duration(eta);
    *o_.out << os.str() << "\n" << std::flush;
  }
}

void Reporter::val(int64_t step, double val_loss, double bytes_per_token) {
  const double bpb = bytes_per_token > 0 ? val_loss / std::log(2.0) / bytes_per_token : 0;
  if (tb_) {
    std::vector<std::pair<std::string, double>> v = {{"val/loss", val_loss}};
    if (bpb > 0) v.push_back({"val/bpb", bpb});
    tb_->scalars(step + 1, v);
  }
  if (o_.csv) {
    csv_row({double(step + 1), NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, val_loss, bpb > 0 ? bpb : NAN});
    return;
  }
  if (o_.json) {
    nlohmann::json j{{"step", step + 1}, {"val_loss", val_loss}};
    if (bpb > 0) j["val_bpb"] = bpb;
    *o_.out << j.dump() << "\n" << std::flush;
    return;
  }
  std::ostringstream os;
  os << "step " << step + 1 << "/" << steps_ << "  val_loss " << std::fixed << std::setprecision(4) << val_loss;
  if (bpb > 0) os << "  val_bpb " << bpb;
  end_bar();
  (o_.progress ? *o_.err : *o_.out) << os.str() << "\n" << std::flush;
}

// --csv: the JSON lines' fields as columns (an empty cell where a line has no such field),
// each value printed to round-trip (%.17g).
void Reporter::csv_row(const std::array<double, 12>& cells) {
  if (!csv_header_) {
    *o_.out << "step,loss,lr,grad_norm,tokens_per_s,elapsed_s,eta_s,loss_scale,padding,skipped,val_loss,val_bpb\n";
    csv_header_ = true;
  }
  std::string row;
  char buf[32];
  for (size_t i = 0; i < cells.size(); i++) {
    if (i) row += ',';
    if (std::isnan(cells[i])) continue;
    std::snprintf(buf, sizeof buf, "%.17g", cells[i]);
    row += buf;
  }
  *o_.out << row << "\n" << std::flush;
}

void Reporter::end_bar() {
  if (bar_open_) *o_.err << "\n";
  bar_open_ = false;
}

}  // namespace loom
