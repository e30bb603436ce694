// Expected goodput under failures, and the save interval that maximises it (Note [Goodput]).
#pragma once

#include <cstdint>
#include <string>

namespace loom::sim {

// Note [Goodput]
// A job of N nodes, each failing independently at a mean time between failures of M_node,
// fails with a mean of M = M_node / N (exponential failures). It saves a checkpoint every tau
// seconds of training, each save costing delta seconds, and a failure costs a restart of R
// seconds plus the work since the last save. Daly's model of the expected wall time T_w of
// T_s seconds of training ("A higher order estimate of the optimum checkpoint interval for
// restart dumps", FGCS 22(3), 2006):
//   T_w = M e^(R / M) (e^((tau + delta) / M) - 1) T_s / tau,
// so goodput (useful share of the wall time) is tau / (M e^(R / M) (e^((tau + delta) / M) - 1)).
// The interval that maximises it is, to first order, Young's sqrt(2 delta M) (Young 1974), and
// to higher order Daly's
//   tau = sqrt(2 delta M) (1 + sqrt(delta / (2M)) / 3 + (delta / (2M)) / 9) - delta  (delta < 2M),
//   tau = M                                                                        (delta >= 2M).
// `loom plan` and `loom simulate` round it to whole steps of the layout's predicted step time
// and report the goodput at that many steps.
struct FailureModel {
  double node_mtbf_s = 0;  // <= 0: no failure model
  double save_s = 0, restart_s = 0;
};

double young_interval_s(double save_s, double mtbf_s);
double daly_interval_s(double save_s, double mtbf_s);
// The useful share of the wall time when saving every `interval_s` of training.
double expected_goodput(double interval_s, double save_s, double restart_s, double mtbf_s);

struct GoodputReport {
  int64_t nodes = 0;
  double job_mtbf_s = 0;
  double daly_s = 0, young_s = 0;
  int64_t save_every = 0;  // steps: Daly's interval in whole steps (at least 1)
  double goodput = 0;      // at save_every
};
GoodputReport goodput_report(const FailureModel& f, int64_t nodes, double step_s);
// "goodput: ..." one line for the reports.
std::string goodput_text(const GoodputReport& g, int64_t nodes);

}  // namespace loom::sim
