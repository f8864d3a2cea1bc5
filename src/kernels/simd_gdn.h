#pragma once
// The Gated DeltaNet kernels (kernels.h), written once over a vector-traits type V
// (kernels/vec_*.h) and instantiated by each SIMD tier. They vectorise along the channels (conv)
// or along a head's dims (norms, delta rule); a width that is not a whole number of vectors
// goes to the scalar twin, so on every Qwen3.5 shape (dims 128, conv channels a multiple of 8)
// the vector code runs.
#include <cmath>
#include <cstdint>

#include "kernels/kernel_table.h"
#include "kernels/simd_elementwise.h"

namespace ellm::simd {

template <class V>
inline typename V::F silu(typename V::F x) {
  return V::div(x, V::add(V::set1(1.0f), exp<V>(V::sub(V::zero(), x))));
}

// acc[j] += a * x[j], j < n (whole vectors)
template <class V>
inline void axpy(float a, const float* x, float* acc, int64_t n) {
  const auto va = V::set1(a);
  for (int64_t j = 0; j < n; j += V::kLanes) V::store(acc + j, V::fmadd(va, V::load(x + j), V::load(acc + j)));
}

template <class V>
inline float dot(const float* a, const float* b, int64_t n) {
  auto s0 = V::zero(), s1 = V::zero();
  int64_t i = 0;
  for (; i + 2 * V::kLanes <= n; i += 2 * V::kLanes) {
    s0 = V::fmadd(V::load(a + i), V::load(b + i), s0);
    s1 = V::fmadd(V::load(a + i + V::kLanes), V::load(b + i + V::kLanes), s1);
  }
  for (; i < n; i += V::kLanes) s0 = V::fmadd(V::load(a + i), V::load(b + i), s0);
  return V::hsum(V::add(s0, s1));
}

template <class V>
inline bool whole_vectors(int64_t n) {
  return n % V::kLanes == 0;
}

template <class V>
void conv1d_silu(const float* x, int64_t n, int64_t ldx, float* window, const float* weight,
                 int64_t taps, int64_t channels, int64_t ld, float* out, int64_t ldo) {
  using F = typename V::F;
  constexpr int64_t L = V::kLanes;
  int64_t c = 0;
  for (; c + L <= channels; c += L) {
    F in[kMaxConvTaps], w[kMaxConvTaps];  // in[0, taps - 1): the previous inputs, oldest first
    for (int64_t j = 0; j < taps; ++j) w[j] = V::load(weight + j * ld + c);
    for (int64_t j = 0; j + 1 < taps; ++j) in[j] = V::load(window + j * ld + c);
    for (int64_t t = 0; t < n; ++t) {
      in[taps - 1] = V::load(x + t * ldx + c);
      F sum = V::mul(w[0], in[0]);
      for (int64_t j = 1; j < taps; ++j) sum = V::fmadd(w[j], in[j], sum);
      V::store(out + t * ldo + c, silu<V>(sum));
      for (int64_t j = 0; j + 1 < taps; ++j) in[j] = in[j + 1];
    }
    for (int64_t j = 0; j + 1 < taps; ++j) V::store(window + j * ld + c, in[j]);
  }
  if (c < channels)
    scalar_kernels.conv1d_silu(x + c, n, ldx, window + c, weight + c, taps, channels - c, ld,
                               out + c, ldo);
}

template <class V>
void l2norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, float scale, float eps,
            float* out, int64_t ldo) {
  if (!whole_vectors<V>(dim)) return scalar_kernels.l2norm(x, rows, dim, ldx, scale, eps, out, ldo);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    const auto inv = V::set1(1.0f / std::sqrt(dot<V>(xr, xr, dim) + eps)), vscale = V::set1(scale);
    for (int64_t i = 0; i < dim; i += V::kLanes)
      V::store(out + r * ldo + i, V::mul(V::mul(V::load(xr + i), inv), vscale));
  }
}

template <class V>
void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, int64_t ldx,
                   int64_t ldz, const float* weight, float eps, float* out, int64_t ldo) {
  if (!whole_vectors<V>(dim))
    return scalar_kernels.gated_rmsnorm(x, z, rows, dim, ldx, ldz, weight, eps, out, ldo);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    const auto inv = V::set1(1.0f / std::sqrt(dot<V>(xr, xr, dim) / float(dim) + eps));
    for (int64_t i = 0; i < dim; i += V::kLanes) {
      auto normed = V::mul(V::load(weight + i), V::mul(V::load(xr + i), inv));
      V::store(out + r * ldo + i, V::mul(normed, silu<V>(V::load(z + r * ldz + i))));
    }
  }
}

// The recurrence over B vectors of dv at a time, so that e and out stay in registers while the
// state's rows stream through.
template <class V, int B>
void delta_step_columns(float* S, int64_t dk, int64_t dv, int64_t j, const float* q,
                        const float* k, const float* v, float decay, float beta, float* out) {
  using F = typename V::F;
  constexpr int64_t L = V::kLanes;
  F e[B], o[B];
  const F vdecay = V::set1(decay);
  for (int b = 0; b < B; ++b) e[b] = V::load(v + j + b * L);
  for (int64_t i = 0; i < dk; ++i) {  // S = decay S; e = v - S^T k
    float* row = S + i * dv + j;
    const F ki = V::set1(k[i]);
    for (int b = 0; b < B; ++b) {
      F s = V::mul(V::load(row + b * L), vdecay);
      V::store(row + b * L, s);
      e[b] = V::fnmadd(s, ki, e[b]);
    }
  }
  for (int b = 0; b < B; ++b) {
    e[b] = V::mul(e[b], V::set1(beta));
    o[b] = V::zero();
  }
  for (int64_t i = 0; i < dk; ++i) {  // S += k (beta e)^T; out = S^T q
    float* row = S + i * dv + j;
    const F ki = V::set1(k[i]), qi = V::set1(q[i]);
    for (int b = 0; b < B; ++b) {
      F s = V::fmadd(ki, e[b], V::load(row + b * L));
      V::store(row + b * L, s);
      o[b] = V::fmadd(qi, s, o[b]);
    }
  }
  for (int b = 0; b < B; ++b) V::store(out + j + b * L, o[b]);
}

template <class V>
void gated_delta_step(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                      const float* v, float decay, float beta, float* out) {
  constexpr int64_t L = V::kLanes;
  if (!whole_vectors<V>(dv)) return scalar_kernels.gated_delta_step(S, dk, dv, q, k, v, decay, beta, out);
  int64_t j = 0;
  for (; j + 4 * L <= dv; j += 4 * L) delta_step_columns<V, 4>(S, dk, dv, j, q, k, v, decay, beta, out);
  for (; j < dv; j += L) delta_step_columns<V, 1>(S, dk, dv, j, q, k, v, decay, beta, out);
}

// The chunked form, step for step the scalar twin's (kernels/scalar/gdn.cc), each row operation
// a vector axpy or dot over dk or dv.
template <class V>
void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch) {
  if (!whole_vectors<V>(dk) || !whole_vectors<V>(dv))
    return scalar_kernels.gated_delta_chunk(S, dk, dv, q, k, ldqk, v, ldv, g, beta, ldg, n, out,
                                            ldo, scratch);
  const int64_t C = kDeltaChunk;
  float* gamma = scratch;  // [C]
  float* A = gamma + C;    // [C][C]
  float* W = A + C * C;    // [C][dk]
  float* U = W + C * dk;   // [C][dv]
  float* decay = U + C * dv;  // [C][C]  exp(gamma_t - gamma_s), s <= t
  auto K = [&](int64_t t) { return k + t * ldqk; };
  auto Q = [&](int64_t t) { return q + t * ldqk; };

  for (int64_t t = 0; t < n; ++t) gamma[t] = (t ? gamma[t - 1] : 0.0f) + g[t * ldg];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s <= t; ++s) decay[t * C + s] = std::exp(gamma[t] - gamma[s]);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < t; ++s)
      A[t * C + s] = beta[t * ldg] * dot<V>(K(t), K(s), dk) * decay[t * C + s];

  for (int64_t t = 0; t < n; ++t) {  // forward substitution through I + A
    float* u = U + t * dv;
    float* w = W + t * dk;
    const float b = beta[t * ldg], bd = b * std::exp(gamma[t]);
    for (int64_t j = 0; j < dv; j += V::kLanes) V::store(u + j, V::mul(V::set1(b), V::load(v + t * ldv + j)));
    for (int64_t i = 0; i < dk; i += V::kLanes) V::store(w + i, V::mul(V::set1(bd), V::load(K(t) + i)));
    for (int64_t s = 0; s < t; ++s) {
      axpy<V>(-A[t * C + s], U + s * dv, u, dv);
      axpy<V>(-A[t * C + s], W + s * dk, w, dk);
    }
  }
  for (int64_t t = 0; t < n; ++t) {  // V' = U - W S; out = (Q exp(gamma)) S
    float* u = U + t * dv;
    float* o = out + t * ldo;
    for (int64_t j = 0; j < dv; j += V::kLanes) V::store(o + j, V::zero());
    const float growth = std::exp(gamma[t]);
    for (int64_t i = 0; i < dk; ++i) {
      axpy<V>(-W[t * dk + i], S + i * dv, u, dv);
      axpy<V>(Q(t)[i] * growth, S + i * dv, o, dv);
    }
  }
  for (int64_t t = 0; t < n; ++t)  // out += causal (Q K^T * decay) V'
    for (int64_t s = 0; s <= t; ++s)
      axpy<V>(dot<V>(Q(t), K(s), dk) * decay[t * C + s], U + s * dv, out + t * ldo, dv);
  const float last = gamma[n - 1], total = std::exp(last);  // S = exp(gamma_last) S + ...
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    for (int64_t j = 0; j < dv; j += V::kLanes) V::store(row + j, V::mul(V::load(row + j), V::set1(total)));
    for (int64_t t = 0; t < n; ++t) axpy<V>(K(t)[i] * std::exp(last - gamma[t]), U + t * dv, row, dv);
  }
}

}  // namespace ellm::simd
