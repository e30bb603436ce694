// A simulated step as pictures: the Chrome trace the engine writes (Note [Trace schema]
// in train/trace.h: pid = global rank, tid 0 compute, tid 1 communication, "memory"
// counters in MiB, idle gaps) and an SVG timeline with one lane per pipeline rank.
#pragma once

#include <string>

#include "loom/sim/simulator.h"

namespace loom::sim {

// Throws loom::Error naming the path when it cannot be written.
void write_sim_trace(const std::string& path, const SimResult& r);
void write_sim_svg(const std::string& path, const SimResult& r, const std::string& title);

}  // namespace loom::sim
