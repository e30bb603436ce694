#include "loom/train/report.h"

#include <cmath>
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

void Reporter::step(int64_t step, double loss, double lr, double norm, double tok_s, double elapsed, bool log_line,
                    double padding) {
  const double eta = elapsed / double(step + 1) * double(steps_ - step - 1);
  if (o_.json) {
    if (!log_line) return;
    nlohmann::json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                        {"tokens_per_s", tok_s}, {"elapsed_s", elapsed}, {"eta_s", eta}};
    if (padding >= 0) j["padding"] = padding;
    *o_.out << j.dump() << "\n" << std::flush;
  } else if (o_.progress) {
    const int width = 24, filled = int(width * (step + 1) / steps_);
    std::ostringstream os;
    os << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] step " << step + 1 << "/"
       << steps_ << "  loss " << std::fixed << std::setprecision(4) << loss << "  " << std::setprecision(0) << tok_s
       << " tok/s  ETA " << fmt_duration(eta) << "   ";
    *o_.err << os.str() << std::flush;
    bar_open_ = true;
  } else if (log_line) {
    std::ostringstream os;
    os << "step " << step + 1 << "/" << steps_ << "  loss " << std::fixed << std::setprecision(4) << loss
       << "  lr " << std::scientific << std::setprecision(2) << lr << "  grad_norm " << std::fixed
       << std::setprecision(3) << norm << "  " << std::setprecision(0) << tok_s << " tok/s";
    if (padding >= 0) os << " (" << std::setprecision(1) << 100 * padding << "% padding)";
    os << "  ETA " << fmt_duration(eta);
    *o_.out << os.str() << "\n" << std::flush;
  }
}

void Reporter::val(int64_t step, double val_loss, double bytes_per_token) {
  const double bpb = bytes_per_token > 0 ? val_loss / std::log(2.0) / bytes_per_token : 0;
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

void Reporter::end_bar() {
  if (bar_open_) *o_.err << "\n";
  bar_open_ = false;
}

}  // namespace loom
