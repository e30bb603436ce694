// Naive reference kernels, templated on the scalar so that gradient checks can run them in
// double precision. loom::ref (ops.h) is the float instantiation. Straight loops, one loop
// nest per formula, double accumulators. Contracts: ops.inc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace loom::ref::tmpl {


template <typename S>
void embedding_forward(S* out, const int32_t* tokens, const S* wte, const S* wpe,
                       int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < C; c++) {
        S v = wte[tokens[b * T + t] * C + c];
        if (wpe) v += wpe[t * C + c];
        out[(b * T + t) * C + c] = v;
      }
}

template <typename S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < C; c++) {
        S g = dout[(b * T + t) * C + c];
        dwte[tokens[b * T + t] * C + c] += g;
        if (dwpe) dwpe[t * C + c] += g;
      }
}

template <typename S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* inp, const S* w,
                       const S* b, int64_t N, int64_t C, S eps) {
  for (int64_t i = 0; i < N; i++) {
    const S* x = inp + i * C;
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; c++) mu += x[c];
    mu /= C;
    for (int64_t c = 0; c < C; c++) var += (x[c] - mu) * (x[c] - mu);
    var /= C;
    double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t c = 0; c < C; c++) out[i * C + c] = S((x[c] - mu) * rs * w[c] + b[c]);
    mean[i] = S(mu);
    rstd[i] = S(rs);
  }
}

template <typename S>
void layernorm_backward(S* dinp, S* dw, S* db, const S* dout, const S* inp,
                        const S* w, const S* mean, const S* rstd, int64_t N, int64_t C) {
  // xhat = (x - mu) rstd; dxhat = dout * w;
  // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
  for (int64_t i = 0; i < N; i++) {
    const S* x = inp + i * C;
    const S* dy = dout + i * C;
    double m1 = 0, m2 = 0;
    for (int64_t c = 0; c < C; c++) {
      double xhat = (x[c] - mean[i]) * double(rstd[i]);
      double dxhat = double(dy[c]) * w[c];
      m1 += dxhat;
      m2 += dxhat * xhat;
      dw[c] += S(dy[c] * xhat);
      db[c] += dy[c];
    }
    m1 /= C;
    m2 /= C;
    for (int64_t c = 0; c < C; c++) {
      double xhat = (x[c] - mean[i]) * double(rstd[i]);
      double dxhat = double(dy[c]) * w[c];
      dinp[i * C + c] += S(rstd[i] * (dxhat - m1 - xhat * m2));
    }
  }
}

template <typename S>
void rmsnorm_forward(S* out, S* rstd, const S* inp, const S* w, int64_t N, int64_t C,
                     S eps) {
  for (int64_t i = 0; i < N; i++) {
    const S* x = inp + i * C;
    double ss = 0;
    for (int64_t c = 0; c < C; c++) ss += double(x[c]) * x[c];
    double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; c++) out[i * C + c] = S(x[c] * rs * w[c]);
    rstd[i] = S(rs);
  }
}

template <typename S>
void rmsnorm_backward(S* dinp, S* dw, const S* dout, const S* inp, const S* w,
                      const S* rstd, int64_t N, int64_t C) {
  // y = x r w, r = (mean(x^2)+eps)^-1/2; dx = r (dy w) - x r^3 mean(dy w x)
  for (int64_t i = 0; i < N; i++) {
    const S* x = inp + i * C;
    const S* dy = dout + i * C;
    double r = rstd[i], dot = 0;
    for (int64_t c = 0; c < C; c++) {
      dot += double(dy[c]) * w[c] * x[c];
      dw[c] += S(dy[c] * x[c] * r);
    }
    dot /= C;
    for (int64_t c = 0; c < C; c++) dinp[i * C + c] += S(r * dy[c] * w[c] - x[c] * r * r * r * dot);
  }
}

template <typename S>
void matmul_forward(S* out, const S* inp, const S* w, const S* bias, int64_t N,
                    int64_t IC, int64_t OC) {
  for (int64_t i = 0; i < N; i++)
    for (int64_t o = 0; o < OC; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int64_t k = 0; k < IC; k++) s += double(inp[i * IC + k]) * w[o * IC + k];
      out[i * OC + o] = S(s);
    }
}

template <typename S>
void matmul_backward(S* dinp, S* dw, S* dbias, const S* dout, const S* inp,
                     const S* w, int64_t N, int64_t IC, int64_t OC, bool fresh = false) {
  if (dinp)
    for (int64_t i = 0; i < N; i++)
      for (int64_t k = 0; k < IC; k++) {
        double s = 0;
        for (int64_t o = 0; o < OC; o++) s += double(dout[i * OC + o]) * w[o * IC + k];
        dinp[i * IC + k] = S(s);
      }
  for (int64_t o = 0; o < OC; o++) {
    for (int64_t k = 0; k < IC; k++) {
      double s = 0;
      for (int64_t i = 0; dw && i < N; i++) s += double(dout[i * OC + o]) * inp[i * IC + k];
      if (dw) dw[o * IC + k] = fresh ? S(s) : dw[o * IC + k] + S(s);
    }
    if (dbias) {
      double s = 0;
      for (int64_t i = 0; i < N; i++) s += dout[i * OC + o];
      dbias[o] = fresh ? S(s) : dbias[o] + S(s);
    }
  }
}

namespace detail {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace detail

template <typename S>
void gelu_forward(S* out, const S* inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double x = inp[i];
    out[i] = S(0.5 * x * (1.0 + std::tanh(detail::kSqrt2OverPi * (x + detail::kGeluCubic * x * x * x))));
  }
}

template <typename S>
void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double x = inp[i];
    double u = detail::kSqrt2OverPi * (x + detail::kGeluCubic * x * x * x);
    double th = std::tanh(u);
    double du = detail::kSqrt2OverPi * (1.0 + 3.0 * detail::kGeluCubic * x * x);
    dinp[i] += S(dout[i] * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du));
  }
}

template <typename S>
void swiglu_forward(S* out, const S* inp, int64_t N, int64_t F) {
  for (int64_t i = 0; i < N; i++)
    for (int64_t f = 0; f < F; f++) {
      double g = inp[i * 2 * F + f], u = inp[i * 2 * F + F + f];
      out[i * F + f] = S(g / (1.0 + std::exp(-g)) * u);
    }
}

template <typename S>
void swiglu_backward(S* dinp, const S* inp, const S* dout, int64_t N, int64_t F) {
  for (int64_t i = 0; i < N; i++)
    for (int64_t f = 0; f < F; f++) {
      double g = inp[i * 2 * F + f], u = inp[i * 2 * F + F + f], dy = dout[i * F + f];
      double sig = 1.0 / (1.0 + std::exp(-g));
      double silu = g * sig;
      dinp[i * 2 * F + f] += S(dy * u * (sig + g * sig * (1.0 - sig)));
      dinp[i * 2 * F + F + f] += S(dy * silu);
    }
}

namespace detail {
// Rotates every q and k head of qkv by +angle (sign = 1) or -angle (sign = -1).
template <typename S>
void rope_rotate(S* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, S theta,
                 double sign, const int32_t* pos) {
  const int64_t row = (H + 2 * KV) * hd, half = hd / 2;
  for (int64_t b = 0; b < B; b++)
    for (int64_t t = 0; t < T; t++)
      for (int64_t h = 0; h < H + KV; h++) {  // q heads then k heads are contiguous
        S* x = qkv + (b * T + t) * row + h * hd;
        for (int64_t i = 0; i < half; i++) {
          double angle = double(pos ? pos[t] : t) * std::pow(double(theta), -2.0 * double(i) / double(hd));
          double c = std::cos(angle), s = sign * std::sin(angle);
          double x1 = x[i], x2 = x[i + half];
          x[i] = S(x1 * c - x2 * s);
          x[i + half] = S(x2 * c + x1 * s);
        }
      }
}
}  // namespace detail

template <typename S>
void rope_forward(S* qkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, S theta,
                  const int32_t* pos = nullptr) {
  detail::rope_rotate<S>(qkv, B, T, H, KV, hd, theta, 1.0, pos);
}

template <typename S>
void rope_backward(S* dqkv, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, S theta,
                   const int32_t* pos = nullptr) {
  detail::rope_rotate<S>(dqkv, B, T, H, KV, hd, theta, -1.0, pos);
}

namespace detail {

// Attention of Tq query rows (stride qrow) against Tk key / value rows (stride kvrow; k and v
// point at kv head 0 of batch 0); row t sees keys lo .. hi, hi = q_pos[t] (t when q_pos is
// null: the causal sequence itself). round_p(x): each probability as P V reads and backward
// sees it (identity in fp32; the bf16 reference rounds it, Note [bf16 attention
// probabilities]).
template <typename S, typename RoundP>
void attend_rows(S* out, S* probs, const S* q, int64_t qrow, const S* k, const S* v, int64_t kvrow,
                 const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd,
                 const int32_t* doc_start, RoundP round_p) {
  const int64_t group = H / KV;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> s(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t kh = h / group;
      for (int64_t t = 0; t < Tq; t++) {
        const S* qr = q + (b * Tq + t) * qrow + h * hd;
        const int64_t lo = doc_start ? doc_start[b * Tq + t] : 0, hi = q_pos ? q_pos[t] : t;
        double mx = -INFINITY;
        for (int64_t j = lo; j <= hi; j++) {
          const S* kr = k + (b * Tk + j) * kvrow + kh * hd;
          double d = 0;
          for (int64_t e = 0; e < hd; e++) d += double(qr[e]) * kr[e];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = lo; j <= hi; j++) z += std::exp(s[size_t(j)] - mx);
        S* p = probs + ((b * H + h) * Tq + t) * Tk;
        for (int64_t j = 0; j < Tk; j++) p[j] = j >= lo && j <= hi ? round_p(S(std::exp(s[size_t(j)] - mx) / z)) : S(0);
        for (int64_t e = 0; e < hd; e++) {
          double acc = 0;
          for (int64_t j = 0; j <= hi; j++) acc += double(p[j]) * v[(b * Tk + j) * kvrow + kh * hd + e];
          out[(b * Tq + t) * H * hd + h * hd + e] = S(acc);
        }
      }
    }
}

// attend_rows' backward: dL/dQ added at dq (stride qrow), dL/dK and dL/dV at dk, dv (stride
// kvrow).
template <typename S>
void attend_rows_backward(S* dq, S* dk, S* dv, const S* dout, const S* q, int64_t qrow, const S* k, const S* v,
                          int64_t kvrow, const S* probs, const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk,
                          int64_t H, int64_t KV, int64_t hd) {
  const int64_t group = H / KV;
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<double> dp(static_cast<size_t>(Tk)), ds(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      const int64_t kh = h / group;
      for (int64_t t = 0; t < Tq; t++) {
        const int64_t hi = q_pos ? q_pos[t] : t;
        const S* p = probs + ((b * H + h) * Tq + t) * Tk;
        const S* dy = dout + (b * Tq + t) * H * hd + h * hd;
        double pdp = 0;
        for (int64_t j = 0; j <= hi; j++) {
          const S* vr = v + (b * Tk + j) * kvrow + kh * hd;
          double d = 0;
          for (int64_t e = 0; e < hd; e++) d += double(dy[e]) * vr[e];
          dp[size_t(j)] = d;
          pdp += p[j] * d;
          S* dvr = dv + (b * Tk + j) * kvrow + kh * hd;
          for (int64_t e = 0; e < hd; e++) dvr[e] += S(p[j] * double(dy[e]));
        }
        for (int64_t j = 0; j <= hi; j++) ds[size_t(j)] = p[j] * (dp[size_t(j)] - pdp) * scale;
        const S* qr = q + (b * Tq + t) * qrow + h * hd;
        S* dqr = dq + (b * Tq + t) * qrow + h * hd;
        for (int64_t j = 0; j <= hi; j++) {
          const S* kr = k + (b * Tk + j) * kvrow + kh * hd;
          S* dkr = dk + (b * Tk + j) * kvrow + kh * hd;
          for (int64_t e = 0; e < hd; e++) {
            dqr[e] += S(ds[size_t(j)] * kr[e]);
            dkr[e] += S(ds[size_t(j)] * qr[e]);
          }
        }
      }
    }
}

}  // namespace detail

template <typename S, typename RoundP = S (*)(S)>
void attention_forward(S* out, S* probs, const S* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd, const int32_t* doc_start = nullptr,
                       RoundP round_p = [](S x) { return x; }) {
  const int64_t row = (H + 2 * KV) * hd;
  detail::attend_rows(out, probs, qkv, row, qkv + H * hd, qkv + (H + KV) * hd, row, nullptr, B, T, T, H, KV, hd,
                      doc_start, round_p);
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* probs,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  const int64_t row = (H + 2 * KV) * hd;
  detail::attend_rows_backward(dqkv, dqkv + H * hd, dqkv + (H + KV) * hd, dout, qkv, row, qkv + H * hd,
                               qkv + (H + KV) * hd, row, probs, nullptr, B, T, T, H, KV, hd);
}

// Note [Context-parallel attention] (ops.inc): local query rows against gathered keys.
template <typename S, typename RoundP = S (*)(S)>
void cp_attention_forward(S* out, S* probs, const S* qkv, const S* kv, const int32_t* q_pos, int64_t B, int64_t Tq,
                          int64_t Tk, int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start = nullptr,
                          RoundP round_p = [](S x) { return x; }) {
  detail::attend_rows(out, probs, qkv, (H + 2 * KV) * hd, kv, kv + KV * hd, 2 * KV * hd, q_pos, B, Tq, Tk, H, KV, hd,
                      doc_start, round_p);
}

template <typename S>
void cp_attention_backward(S* dqkv, S* dkv, const S* dout, const S* qkv, const S* kv, const S* probs,
                           const int32_t* q_pos, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd) {
  detail::attend_rows_backward(dqkv, dkv, dkv + KV * hd, dout, qkv, (H + 2 * KV) * hd, kv, kv + KV * hd, 2 * KV * hd,
                               probs, q_pos, B, Tq, Tk, H, KV, hd);
}

// Note [Ring attention] (ops.inc): one block of keys with the online softmax; scores in fp64.
template <typename S>
double ring_score(const S* qr, const S* kr, int64_t hd) {
  double d = 0;
  for (int64_t e = 0; e < hd; e++) d += double(qr[e]) * kr[e];
  return d / std::sqrt(double(hd));
}

template <typename S>
void ring_attention_step(S* acc, S* ml, const S* qkv, const S* kv, const int32_t* q_pos, const int32_t* k_pos,
                         int64_t B, int64_t Tq, int64_t Tb, int64_t H, int64_t KV, int64_t hd,
                         const int32_t* doc_start) {
  const int64_t group = H / KV, row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd;
  std::vector<double> s(static_cast<size_t>(Tb)), a(static_cast<size_t>(hd));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < Tq; t++) {
        const int64_t lo = doc_start ? doc_start[b * Tq + t] : 0, hi = q_pos[t], kh = h / group;
        const S* qr = qkv + (b * Tq + t) * row + h * hd;
        double mx = -INFINITY;
        for (int64_t u = 0; u < Tb; u++) {
          if (k_pos[u] < lo || k_pos[u] > hi) continue;
          s[size_t(u)] = ring_score(qr, kv + (b * Tb + u) * kvrow + kh * hd, hd);
          mx = std::max(mx, s[size_t(u)]);
        }
        if (mx == -INFINITY) continue;  // no key of this block is visible
        S* st = ml + ((b * H + h) * Tq + t) * 2;
        S* out = acc + (b * Tq + t) * H * hd + h * hd;
        const double m = std::max(double(st[0]), mx), c = std::exp(double(st[0]) - m);
        double l = double(st[1]) * c;
        for (int64_t e = 0; e < hd; e++) a[size_t(e)] = double(out[e]) * c;
        for (int64_t u = 0; u < Tb; u++) {
          if (k_pos[u] < lo || k_pos[u] > hi) continue;
          const double w = std::exp(s[size_t(u)] - m);
          l += w;
          const S* vr = kv + (b * Tb + u) * kvrow + (KV + kh) * hd;
          for (int64_t e = 0; e < hd; e++) a[size_t(e)] += w * vr[e];
        }
        for (int64_t e = 0; e < hd; e++) out[e] = S(a[size_t(e)]);
        st[0] = S(m), st[1] = S(l);
      }
}

template <typename S>
void ring_attention_finish(S* out, S* lse, const S* acc, const S* ml, int64_t B, int64_t Tq, int64_t H, int64_t hd) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < Tq; t++) {
        const S* st = ml + ((b * H + h) * Tq + t) * 2;
        const double m = st[0], l = st[1];
        lse[(b * H + h) * Tq + t] = S(m + std::log(l));
        const int64_t at = (b * Tq + t) * H * hd + h * hd;
        for (int64_t e = 0; e < hd; e++) out[at + e] = S(double(acc[at + e]) / l);
      }
}

template <typename S>
void ring_attention_backward_step(S* dqkv, S* dkv, const S* dout, const S* D, const S* qkv, const S* kv, const S* lse,
                                  const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tb,
                                  int64_t H, int64_t KV, int64_t hd, const int32_t* doc_start) {
  const int64_t group = H / KV, row = (H + 2 * KV) * hd, kvrow = 2 * KV * hd;
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < Tq; t++) {
        const int64_t kh = h / group, lo = doc_start ? doc_start[b * Tq + t] : 0;
        const S* dy = dout + (b * Tq + t) * H * hd + h * hd;
        const S* qr = qkv + (b * Tq + t) * row + h * hd;
        S* dq = dqkv + (b * Tq + t) * row + h * hd;
        const double Dt = D[(b * H + h) * Tq + t], L = lse[(b * H + h) * Tq + t];
        for (int64_t u = 0; u < Tb; u++) {
          if (k_pos[u] < lo || k_pos[u] > q_pos[t]) continue;
          const S* kr = kv + (b * Tb + u) * kvrow + kh * hd;
          const S* vr = kv + (b * Tb + u) * kvrow + (KV + kh) * hd;
          S* dk = dkv + (b * Tb + u) * kvrow + kh * hd;
          S* dv = dkv + (b * Tb + u) * kvrow + (KV + kh) * hd;
          const double pj = std::exp(ring_score(qr, kr, hd) - L);
          double dp = 0;
          for (int64_t e = 0; e < hd; e++) dp += double(dy[e]) * vr[e];
          const double ds = pj * (dp - Dt) * scale;
          for (int64_t e = 0; e < hd; e++) {
            dv[e] += S(pj * double(dy[e]));
            dq[e] += S(ds * kr[e]);
            dk[e] += S(ds * qr[e]);
          }
        }
      }
}

template <typename S>
void residual_forward(S* out, const S* a, const S* b, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template <typename S>
void crossentropy_forward(S* losses, const S* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
  for (int64_t i = 0; i < N; i++) {
    const S* l = logits + i * V;
    if (targets[i] < 0) {
      losses[i] = S(0);
      continue;
    }
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; j++) mx = std::max(mx, double(l[j]));
    for (int64_t j = 0; j < V; j++) z += std::exp(l[j] - mx);
    losses[i] = S(std::log(z) + mx - l[targets[i]]);
  }
}

template <typename S>
void crossentropy_backward_inplace(S* logits, const int32_t* targets, const S* dloss,
                                   int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; i++) {
    S* l = logits + i * V;
    if (targets[i] < 0) {
      std::fill(l, l + V, S(0));
      continue;
    }
    double mx = -INFINITY, z = 0;
    for (int64_t j = 0; j < V; j++) mx = std::max(mx, double(l[j]));
    for (int64_t j = 0; j < V; j++) z += std::exp(l[j] - mx);
    for (int64_t j = 0; j < V; j++) {
      double p = std::exp(l[j] - mx) / z;
      l[j] = S((p - (j == targets[i] ? 1.0 : 0.0)) * dloss[i]);
    }
  }
}

template <typename S>
void lm_head_loss(S* losses, S* dx, S* dw, const S* x, const S* w,
                  const int32_t* targets, int64_t N, int64_t C, int64_t V, S dloss_scale) {
  std::vector<S> logits(size_t(N) * V);
  matmul_forward<S>(logits.data(), x, w, nullptr, N, C, V);
  crossentropy_forward<S>(losses, logits.data(), targets, N, V);
  if (!dx) return;
  std::vector<S> dloss(N, dloss_scale);
  crossentropy_backward_inplace<S>(logits.data(), targets, dloss.data(), N, V);
  matmul_backward<S>(dx, dw, nullptr, logits.data(), x, w, N, C, V);
}

template <typename S>
void lm_head_logits_row(S* logits, const S* x, const S* w, int64_t C, int64_t V) {
  matmul_forward<S>(logits, x, w, nullptr, 1, C, V);
}

template <typename S>
void adamw_update(S* params, const S* grads, S* m, S* v, int64_t n, S lr,
                  S beta1, S beta2, S eps, S weight_decay, int64_t step, S grad_scale = S(1)) {
  double bc1 = 1.0 - std::pow(double(beta1), double(step));
  double bc2 = 1.0 - std::pow(double(beta2), double(step));
  for (int64_t i = 0; i < n; i++) {
    double g = S(grads[i] * grad_scale);  // the scaled gradient as the caller's type holds it
    double mi = beta1 * double(m[i]) + (1.0 - beta1) * g;
    double vi = beta2 * double(v[i]) + (1.0 - beta2) * g * g;
    m[i] = S(mi);
    v[i] = S(vi);
    double upd = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    params[i] = S(params[i] - lr * (upd + weight_decay * params[i]));
  }
}

template <typename S>
double sum_squares(const S* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += double(x[i]) * x[i];
  return s;
}

template <typename S>
void scale_inplace(S* x, int64_t n, S s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

}  // namespace loom::ref::tmpl
