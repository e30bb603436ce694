// Note [Tensor-parallel overlap] and the per-op pricing of a unit's passes (unit_cost.h).
#include "loom/sim/unit_cost.h"

#include <algorithm>

namespace loom::sim {

namespace {

// Note [Tensor-parallel overlap]
// Megatron-core's --tp-comm-overlap splits each tensor-parallel all-gather / reduce-scatter
// (or all-reduce) into chunks pipelined with the GEMM next to it (userbuffers), so a
// unit's tp communication costs only what its GEMMs cannot cover and the GEMM time it takes
// (Note [Overlap contention]):
//   tp' = overlapped(tp, gemm)  per unit and pass (forward, backward, recompute),
// e.g. a block with 3 ms of GEMMs and 1 ms of tp collectives costs 3 ms instead of 4 (3.16 at
// overlap_cost 0.16). The
// chunking's own overhead is not priced. Off by default (loom's engine and Megatron-LM
// before core run them in turn).
void hide_tp(const DeviceSpec& d, Pass& p) { p.tp = overlapped_s(d, p.tp, p.gemm); }

void add_forward(const ClusterSpec& c, const Places& pl, const std::vector<Op>& ops, Pass& p, bool core_only = false) {
  double attention_s = 0;  // the last attention kernel's time (Note [Ring attention pricing])
  for (const Op& o : ops) {
    if (core_only && !o.attention_core) continue;
    if (o.kind == Op::Kind::kComm && o.ring_steps > 0) {
      const double shifts = (o.ring_steps - 1) * collective_time_s(c, o.coll, o.bytes, pl.cp);
      p.cp += overlapped_s(c.device, shifts, attention_s);  // the hidden part costs its contention
    } else if (o.kind == Op::Kind::kComm) {
      const double t = collective_time_s(c, o.coll, o.bytes, o.axis == Axis::kCp ? pl.cp : pl.tp);
      (o.axis == Axis::kCp ? p.cp : p.tp) += t;
    } else {
      const double t = kernel_time_s(c.device, o);
      p.compute += t;
      if (o.kind == Op::Kind::kGemm) p.gemm += t;
      if (o.kind == Op::Kind::kAttention) attention_s = t;
    }
  }
}

// Backward: a GEMM becomes dX and dW (two GEMMs of its size, times the device's measured
// gemm_backward_factor where it has one), a memory-bound kernel moves
// about twice its bytes, a collective is replaced by its conjugate of the same size.
// wgt (optional): also add the dW GEMMs' half there.
void add_backward(const ClusterSpec& c, const Places& pl, const std::vector<Op>& ops, Pass& p, Pass* wgt) {
  double attention_s = 0;  // Note [Ring attention pricing]
  for (const Op& o : ops) {
    if (o.kind == Op::Kind::kAttention) {
      // loom's backward kernel does about twice the forward's work; flash attention's and
      // loom's ring attention's recompute the scores too (2.5x, Dao et al.).
      const bool rescore = o.name == "flash_attention" || o.name == "ring_attention";
      attention_s = (rescore ? 2.5 : 2.0) * kernel_time_s(c.device, o);
      p.compute += attention_s;
    } else if (o.kind == Op::Kind::kComm && o.ring_steps > 0) {
      const double shift = collective_time_s(c, o.coll, o.bytes, pl.cp);
      p.cp += overlapped_s(c.device, (o.ring_steps - 1) * shift, attention_s) + o.ring_steps * shift;
    } else if (o.kind == Op::Kind::kGemm) {
      const Curve& f = c.device.gemm_backward_factor;
      const double t = 2 * gemm_time_s(c.device, o.flops, o.bytes, o.width, o.fp8, o.fp4) * (f.points.empty() ? 1.0 : f.at(o.flops));
      p.compute += t;
      p.gemm += t;
      if (wgt) wgt->compute += t / 2;
    } else if (o.kind == Op::Kind::kMemory) {
      if (o.backward_bytes >= 0) p.compute += memory_time_s(c.device, o.backward_bytes);  // Note [fp8 GEMMs]'s casts
      else if (o.backward) p.compute += memory_class_time_s(c.device, o, true);
    } else {
      OpKind conj = o.coll;
      if (o.coll == OpKind::kAllGather) conj = OpKind::kReduceScatter;
      else if (o.coll == OpKind::kReduceScatter) conj = OpKind::kAllGather;
      const double t = collective_time_s(c, conj, o.bytes, o.axis == Axis::kCp ? pl.cp : pl.tp) +
                       (o.regather ? collective_time_s(c, o.coll, o.bytes, pl.cp) : 0.0);  // Note [Context-parallel pricing]
      (o.axis == Axis::kCp ? p.cp : p.tp) += t;
    }
  }
}

}  // namespace

void add_to(Pass& to, const Pass& p, double times) {
  to.compute += times * p.compute, to.tp += times * p.tp, to.cp += times * p.cp, to.zero += times * p.zero;
  to.vocab += times * p.vocab, to.gemm += times * p.gemm;
}

Pass minus(Pass a, const Pass& b) {
  a.compute -= b.compute, a.tp -= b.tp, a.cp -= b.cp, a.zero -= b.zero, a.vocab -= b.vocab;
  return a;
}

std::vector<Op> full_recompute_ops(const std::vector<Op>& ops, bool stops_early) {
  if (!stops_early) return ops;
  const auto fc2 = std::find_if(ops.begin(), ops.end(), [](const Op& o) { return o.name.rfind("fc2", 0) == 0; });
  return std::vector<Op>(ops.begin(), fc2);
}

UnitCost unit_cost(const ClusterSpec& c, const Places& pl, const std::vector<Op>& ops, Recompute r, bool tp_overlap,
                   bool weights, bool stops_early) {
  UnitCost u;
  add_forward(c, pl, ops, u.fwd);
  add_backward(c, pl, ops, u.bwd, weights ? &u.wgt : nullptr);
  if (r == Recompute::kFull) add_forward(c, pl, full_recompute_ops(ops, stops_early), u.recompute);
  if (r == Recompute::kSelective) add_forward(c, pl, ops, u.recompute, true);
  if (tp_overlap)
    for (Pass* p : {&u.fwd, &u.bwd, &u.recompute}) hide_tp(c.device, *p);
  return u;
}

void fuse_backward_into_forward(UnitCost& u) {
  u.fwd.compute += u.bwd.compute, u.fwd.tp += u.bwd.tp, u.fwd.cp += u.bwd.cp, u.fwd.zero += u.bwd.zero;
  u.fwd.gemm += u.bwd.gemm;
  u.bwd = Pass{};
}

void add_unit(ChunkCost& ch, const UnitCost& u, double times) {
  for (auto [dst, src] : {std::pair{&ch.fwd, &u.fwd}, std::pair{&ch.bwd, &u.bwd}, std::pair{&ch.bwd, &u.recompute},
                          std::pair{&ch.wgt, &u.wgt}}) {
    dst->compute += times * src->compute;
    dst->tp += times * src->tp;
    dst->cp += times * src->cp;
  }
  ch.recompute += times * u.recompute.total();
  ch.act_bytes += times * u.act_bytes;
  ch.transient_bytes = std::max(ch.transient_bytes, u.transient_bytes);
}

double flops_of(const std::vector<Op>& ops, bool core_only) {
  double f = 0;
  for (const Op& o : ops)
    if (!core_only || o.attention_core) f += o.flops;
  return f;
}


}  // namespace loom::sim
