// Chrome-trace (Perfetto) timelines of a run: one process track per rank with a compute
// thread (kernel groups: embedding, each block's forward and backward, head, optimizer;
// pipeline steps F, B, W and pipedream / pipemare's updates U; 2bw's update work inside the
// stream, U of category "update" (Note [Measured bubble]); idle gaps; waits on offload
// chunk transfers, category "io") and a communication thread (every collective and transfer
// from the rank's ledger), plus memory counters (resident bytes per category).
//
// Note [Trace schema]
// Events are Chrome "X" (complete) events with ts/dur in microseconds, pid = global rank,
// tid 0 = compute, tid 1 = communication; "C" counter events named "memory" carry one
// series per category in MiB; "M" metadata names the tracks. Times are steady-clock
// microseconds minus the earliest rank's start, so ranks on one machine line up. The
// simulator writes the same schema (issue 5), which is what makes the two comparable.
// A step span ("step" category) of a stream schedule that flushes (Note [PipeDream-2BW])
// carries args {"flush": 1}: it ramps down as 1F1B does, which the stream's steady step,
// the one the simulator prices, does not (Note [Measured bubble] in cli/compare_cmd.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

namespace comm {
class Ledger;
class Group;
}  // namespace comm

class Trace {
 public:
  // `origin_steady_us`: what t = 0 of this rank's times is (the ledger's origin).
  Trace(int rank, double origin_steady_us);
  double now_us() const;
  // `args`: integer fields of the span's "args" (e.g. {"flush", 1}).
  using Args = std::vector<std::pair<std::string, int64_t>>;
  void begin(const std::string& name, const std::string& cat, Args args = {});
  void span(const std::string& name, const std::string& cat, double t0_us, double t1_us, int tid = 0, Args args = {});
  void end();
  void counter(double t_us, const std::vector<std::pair<std::string, int64_t>>& bytes);
  // Adds every collective and transfer of the ledger (same origin) on the comm thread.
  void add_ledger(const comm::Ledger& ledger);
  // Marks gaps of at least min_gap_us between compute spans as "idle".
  void add_idle(double min_gap_us = 50);
  // Writes all ranks' events to `path` from global rank 0; collective over `world` (null:
  // this rank alone).
  void write(const std::string& path, comm::Group* world) const;

 private:
  struct Event {
    std::string name, cat;
    char ph;
    double ts, dur;
    int tid;
    Args values;  // a counter's bytes per series; an X event's args
  };
  std::string events_json(double shift_us) const;
  int rank_;
  double origin_;
  std::vector<Event> events_;
  struct Open {
    std::string name, cat;
    double start;
    Args args;
  };
  std::vector<Open> open_;  // begin() stack
};

// Trace spans (Note [Trace schema]) when a trace is being written; no-ops otherwise.
class Spans {
 public:
  explicit Spans(Trace* t) : t_(t) {}
  class Scope {
   public:
    explicit Scope(Trace* t) : t_(t) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope();

   private:
    Trace* t_;
  };
  // Opens a span that closes when the returned scope ends; `args` as Trace::begin's.
  Scope open(const std::string& name, const char* category, Trace::Args args = {}) const;

 private:
  Trace* t_;
};

}  // namespace loom
