// How loom's OpenMP threads wait between parallel regions (Note [OpenMP wait policy]).
#pragma once

#include <string>

namespace loom {

// Note [OpenMP wait policy]
// Every CPU kernel, OpenBLAS (its OpenMP build) and oneDNN run their threads through one
// libgomp. By default a libgomp thread that has finished its part of a parallel region spins
// (GOMP_SPINCOUNT, 300,000 turns) before it sleeps. On a machine whose cores are shared with
// other processes, the peer it waits for is often descheduled, and the spinner burns the
// time slice that peer needs. Measured on 2 cores (AMD EPYC) beside two busy-looping
// processes, the README tour's 60 steps (`loom train --set train.steps=60`, 2 threads) took
// 94 s by default, 26 s with GOMP_SPINCOUNT=10000 and 21 s with threads that sleep at once
// (OMP_WAIT_POLICY=passive). Alone on the machine the difference is within the runs' noise:
// the tour's model, five runs each, median 35,709 tokens/s by default against 35,140 passive
// (each spread over 32-40 thousand); config B in fp32 1,086-1,179 for both, in bf16 2,036 /
// 1,999 (medians of three).
// libgomp reads the policy from the environment as it loads, before main, so the loom binary
// sets OMP_WAIT_POLICY=passive and executes itself again, once, when the environment sets
// neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT. A user's own setting of either is kept. Ranks
// launched by `loom train --nproc` inherit the setting; the test suite sets it for its
// programs.

// Whether loom re-executes itself for the passive policy, given the two variables (null:
// unset).
bool wants_passive_reexec(const char* omp_wait_policy, const char* gomp_spincount);
// Re-executes this binary (/proc/self/exe) with argv and OMP_WAIT_POLICY=passive when
// wants_passive_reexec says so; returns otherwise, and when the exec fails (then libgomp's
// default stays: slower on a shared machine, the same results).
void reexec_for_passive_omp_wait(char** argv);
// The policy in force, for the run's header: "OMP_WAIT_POLICY=passive", "GOMP_SPINCOUNT=N",
// or "libgomp's default wait".
std::string omp_wait_summary();

}  // namespace loom
