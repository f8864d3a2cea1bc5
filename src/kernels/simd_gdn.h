#pragma once
// The Gated DeltaNet kernels (kernels.h), written once over a vector-traits type V
// (kernels/vec_*.h) and instantiated by each SIMD tier. They vectorise along the channels (conv)
// or along a head's dims (norms, delta rule); a width that is not a whole number of vectors
// goes to the scalar twin, so on every Qwen3.5 shape (dims 128, conv channels a multiple of 8)
// the vector code runs.
#include <algorithm>
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
// state's rows stream through: twice, the first time only read (the state of a 128 x 128 head
// is 64 KiB, beyond L1, and of a whole layer megabytes: its traffic is what a step costs).
template <class V, int B>
void delta_step_columns(float* S, int64_t dk, int64_t dv, int64_t j, const float* q,
                        const float* k, const float* v, float decay, float beta, float* out) {
  using F = typename V::F;
  constexpr int64_t L = V::kLanes;
  F e[B], o[B];
  const F vdecay = V::set1(decay);
  for (int b = 0; b < B; ++b) e[b] = V::load(v + j + b * L);
  for (int64_t i = 0; i < dk; ++i) {  // e = v - (decay S)^T k, S only read
    const float* row = S + i * dv + j;
    const F ki = V::set1(k[i]);
    for (int b = 0; b < B; ++b) e[b] = V::fnmadd(V::mul(V::load(row + b * L), vdecay), ki, e[b]);
  }
  for (int b = 0; b < B; ++b) {
    e[b] = V::mul(e[b], V::set1(beta));
    o[b] = V::zero();
  }
  for (int64_t i = 0; i < dk; ++i) {  // S = decay S + k (beta e)^T; out = S^T q
    float* row = S + i * dv + j;
    const F ki = V::set1(k[i]), qi = V::set1(q[i]);
    for (int b = 0; b < B; ++b) {
      F s = V::fmadd(ki, e[b], V::mul(V::load(row + b * L), vdecay));
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

// Y = alpha A B + beta Y for rows [0, m) and R rows x NV vectors at a time: the accumulators
// stay in registers while a row of B streams through. A [m][k] at lda, B [k][n] at ldb (n whole
// vectors), Y at ldy; beta 0 does not read Y. With `lower`, A is lower triangular (A[i][s] = 0
// for s > i) and row block i stops at column i + R of A.
template <class V, int R, int NV>
inline void matmul_block(int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb,
                         float* Y, int64_t ldy, float alpha, float beta) {
  using F = typename V::F;
  constexpr int64_t L = V::kLanes;
  // Fully unrolled, or GCC keeps acc[] in memory and the loop runs at store forwarding's pace.
  F acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[r][v] = V::zero();
  for (int64_t s = 0; s < k; ++s) {
    F b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = V::load(B + s * ldb + v * L);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const F a = V::set1(A[r * lda + s]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[r][v] = V::fmadd(a, b[v], acc[r][v]);
    }
  }
  const F va = V::set1(alpha), vb = V::set1(beta);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* y = Y + r * ldy + v * L;
      V::store(y, beta == 0 ? V::mul(va, acc[r][v]) : V::fmadd(va, acc[r][v], V::mul(vb, V::load(y))));
    }
}

template <class V, int R>
inline void matmul_rows(int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
                        int64_t ldb, float* Y, int64_t ldy, float alpha, float beta) {
  constexpr int64_t L = V::kLanes;
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) matmul_block<V, R, 2>(k, A, lda, B + j, ldb, Y + j, ldy, alpha, beta);
  for (; j < n; j += L) matmul_block<V, R, 1>(k, A, lda, B + j, ldb, Y + j, ldy, alpha, beta);
}

template <class V>
void small_matmul(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* Y, int64_t ldy, float alpha, float beta, bool lower) {
  constexpr int R = V::kLanes == 16 ? 8 : 4;  // 2R accumulators of 2 vectors, of 32 or 16 registers
  int64_t i = 0;
  for (; i + R <= m; i += R)
    matmul_rows<V, R>(n, lower ? std::min(k, i + R) : k, A + i * lda, lda, B, ldb, Y + i * ldy, ldy, alpha, beta);
  for (; i < m; ++i)
    matmul_rows<V, 1>(n, lower ? std::min(k, i + 1) : k, A + i * lda, lda, B, ldb, Y + i * ldy, ldy, alpha, beta);
}

// The chunked form as matrix products (the order of the scalar twin, kernels/scalar/gdn.cc):
// the C x C matrices of one chunk and the [C][dk] x [dk][dv] products with the state. Token rows
// beyond n are left out of the products over tokens; the columns of K^T beyond n are zero.
template <class V>
void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch) {
  constexpr int64_t L = V::kLanes;
  const int64_t C = kDeltaChunk;
  if (dk % L || dv % L)
    return scalar_kernels.gated_delta_chunk(S, dk, dv, q, k, ldqk, v, ldv, g, beta, ldg, n, out,
                                            ldo, scratch);
  const DeltaChunkScratch w(scratch, dk, dv);
  // gamma = cumsum(g) (0 beyond n); K, Q packed; K^T with zero columns beyond n.
  std::fill(w.gamma, w.gamma + C, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    w.gamma[t] = (t ? w.gamma[t - 1] : 0.0f) + g[t * ldg];
    for (int64_t i = 0; i < dk; i += L) {
      V::store(w.K + t * dk + i, V::load(k + t * ldqk + i));
      V::store(w.Q + t * dk + i, V::load(q + t * ldqk + i));
    }
  }
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t t = 0; t < C; ++t) w.KT[i * C + t] = t < n ? w.K[t * dk + i] : 0.0f;
  // G = K K^T, P = Q K^T                                             [n][C]
  small_matmul<V>(n, C, dk, w.K, dk, w.KT, C, w.G, C, 1.0f, 0.0f, false);
  small_matmul<V>(n, C, dk, w.Q, dk, w.KT, C, w.P, C, 1.0f, 0.0f, false);
  // decay(t, s) = exp(gamma_t - gamma_s): A = beta_t G * decay (s < t, else 0),
  // P *= decay (s <= t, else 0)
  for (int64_t t = 0; t < n; ++t) {
    const auto gt = V::set1(w.gamma[t]), bt = V::set1(beta[t * ldg]);
    float *a = w.G + t * C, *p = w.P + t * C;
    int64_t s = 0;
    for (; s <= t; s += L) {
      const auto decay = exp<V>(V::sub(gt, V::load(w.gamma + s)));
      V::store(a + s, V::mul(bt, V::mul(V::load(a + s), decay)));
      V::store(p + s, V::mul(V::load(p + s), decay));
    }
    std::fill(a + t, a + C, 0.0f);
    std::fill(p + t + 1, p + C, 0.0f);
  }
  // T = (I + A)^-1 by forward substitution: T_t = e_t - sum_{s<t} A_ts T_s   (lower, [n][C])
  for (int64_t t = 0; t < n; ++t) {
    float* row = w.T + t * C;
    for (int64_t c = 0; c < C; c += L) V::store(row + c, V::zero());
    row[t] = 1.0f;
    for (int64_t s = 0; s < t; ++s) axpy<V>(-w.G[t * C + s], w.T + s * C, row, (s / L + 1) * L);
  }
  // B1 = diag(beta) V, B2 = diag(beta exp(gamma)) K; U = T B1, W = T B2; U -= W S  (V')
  for (int64_t t = 0; t < n; ++t) {
    const float b = beta[t * ldg], bd = b * std::exp(w.gamma[t]);
    for (int64_t j = 0; j < dv; j += L) V::store(w.B1 + t * dv + j, V::mul(V::set1(b), V::load(v + t * ldv + j)));
    for (int64_t i = 0; i < dk; i += L) V::store(w.B2 + t * dk + i, V::mul(V::set1(bd), V::load(w.K + t * dk + i)));
  }
  small_matmul<V>(n, dv, n, w.T, C, w.B1, dv, w.U, dv, 1.0f, 0.0f, true);
  small_matmul<V>(n, dk, n, w.T, C, w.B2, dk, w.W, dk, 1.0f, 0.0f, true);
  small_matmul<V>(n, dv, dk, w.W, dk, S, dv, w.U, dv, -1.0f, 1.0f, false);
  // out = diag(exp(gamma)) Q S + P V'
  small_matmul<V>(n, dv, dk, w.Q, dk, S, dv, out, ldo, 1.0f, 0.0f, false);
  for (int64_t t = 0; t < n; ++t) {
    const auto growth = V::set1(std::exp(w.gamma[t]));
    for (int64_t j = 0; j < dv; j += L) V::store(out + t * ldo + j, V::mul(growth, V::load(out + t * ldo + j)));
  }
  small_matmul<V>(n, dv, n, w.P, C, w.U, dv, out, ldo, 1.0f, 1.0f, true);
  // S = exp(gamma_last) S + (K^T diag(exp(gamma_last - gamma))) V'
  const float last = w.gamma[n - 1];
  for (int64_t t = 0; t < n; ++t) w.gamma[t] = std::exp(last - w.gamma[t]);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t t = 0; t < n; ++t) w.KT[i * C + t] *= w.gamma[t];
  small_matmul<V>(dk, dv, n, w.KT, C, w.U, dv, S, dv, 1.0f, std::exp(last), false);
}

}  // namespace ellm::simd
