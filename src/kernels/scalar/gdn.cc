// Plain C++ Gated DeltaNet kernels (kernels.h): the reference the vector versions are tested
// against. Everything in FP32, in the order the math is written.
#include <algorithm>
#include <cmath>

#include "kernels/scalar/scalar.h"

namespace ellm::scalar {
namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// acc[j] += a * x[j], j < n
void axpy(float a, const float* x, float* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += a * x[j];
}

// Y = alpha A B + beta Y (beta 0: Y not read); A [m][k], B [k][n], row-major at their strides.
// With `lower`, A[i][s] = 0 for s > i and row i stops at column i.
void small_matmul(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
                  int64_t ldb, float* Y, int64_t ldy, float alpha, float beta, bool lower) {
  float acc[kMaxDeltaHeadDim];
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) acc[j] = 0.0f;
    for (int64_t s = 0; s < (lower ? std::min(k, i + 1) : k); ++s) axpy(A[i * lda + s], B + s * ldb, acc, n);
    for (int64_t j = 0; j < n; ++j)
      Y[i * ldy + j] = beta == 0 ? alpha * acc[j] : alpha * acc[j] + beta * Y[i * ldy + j];
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

void conv1d_silu(const float* x, int64_t n, int64_t ldx, float* window, const float* weight,
                 int64_t taps, int64_t channels, int64_t ld, float* out, int64_t ldo) {
  for (int64_t c = 0; c < channels; ++c) {
    float in[kMaxConvTaps];  // in[0, taps - 1): the previous inputs, oldest first
    for (int64_t j = 0; j + 1 < taps; ++j) in[j] = window[j * ld + c];
    for (int64_t t = 0; t < n; ++t) {
      in[taps - 1] = x[t * ldx + c];
      float sum = 0;
      for (int64_t j = 0; j < taps; ++j) sum += weight[j * ld + c] * in[j];
      out[t * ldo + c] = silu(sum);
      for (int64_t j = 0; j + 1 < taps; ++j) in[j] = in[j + 1];
    }
    for (int64_t j = 0; j + 1 < taps; ++j) window[j * ld + c] = in[j];
  }
}

void l2norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, float scale, float eps,
            float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float inv_norm = 1.0f / std::sqrt(dot(xr, xr, dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * ldo + i] = xr[i] * inv_norm * scale;
  }
}

void gated_rmsnorm(const float* x, const float* z, int64_t rows, int64_t dim, int64_t ldx,
                   int64_t ldz, const float* weight, float eps, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    const float* zr = z + r * ldz;
    float inv_rms = 1.0f / std::sqrt(dot(xr, xr, dim) / float(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * ldo + i] = weight[i] * (xr[i] * inv_rms) * silu(zr[i]);
  }
}

void gated_delta_step(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                      const float* v, float decay, float beta, float* out) {
  float e[kMaxDeltaHeadDim];  // v - S^T k, then beta times that
  for (int64_t j = 0; j < dv; ++j) e[j] = v[j];
  for (int64_t i = 0; i < dk; ++i)  // e = v - (decay S)^T k
    for (int64_t j = 0; j < dv; ++j) e[j] -= (S[i * dv + j] * decay) * k[i];
  for (int64_t j = 0; j < dv; ++j) {
    e[j] *= beta;
    out[j] = 0;
  }
  for (int64_t i = 0; i < dk; ++i) {  // S = decay S + k (beta e)^T; out = S^T q
    float* row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] = row[j] * decay + k[i] * e[j];
    axpy(q[i], row, out, dv);
  }
}

void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch) {
  const int64_t C = kDeltaChunk;
  const DeltaChunkScratch w(scratch, dk, dv);
  // gamma = cumsum(g); K, Q packed; K^T with zero columns beyond n.
  for (int64_t t = 0; t < n; ++t) {
    w.gamma[t] = (t ? w.gamma[t - 1] : 0.0f) + g[t * ldg];
    for (int64_t i = 0; i < dk; ++i) w.K[t * dk + i] = k[t * ldqk + i], w.Q[t * dk + i] = q[t * ldqk + i];
  }
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t t = 0; t < C; ++t) w.KT[i * C + t] = t < n ? w.K[t * dk + i] : 0.0f;
  // G = K K^T, P = Q K^T                                             [n][C]
  small_matmul(n, C, dk, w.K, dk, w.KT, C, w.G, C, 1.0f, 0.0f, false);
  small_matmul(n, C, dk, w.Q, dk, w.KT, C, w.P, C, 1.0f, 0.0f, false);
  // decay(t, s) = exp(gamma_t - gamma_s): A = beta_t G * decay (s < t, else 0),
  // P *= decay (s <= t, else 0)
  for (int64_t t = 0; t < n; ++t) {
    float *a = w.G + t * C, *p = w.P + t * C;
    for (int64_t s = 0; s < C; ++s) {
      const float decay = s <= t ? std::exp(w.gamma[t] - w.gamma[s]) : 0.0f;
      a[s] = s < t ? beta[t * ldg] * (a[s] * decay) : 0.0f;
      p[s] *= decay;
    }
  }
  // T = (I + A)^-1 by forward substitution: T_t = e_t - sum_{s<t} A_ts T_s   (lower, [n][C])
  for (int64_t t = 0; t < n; ++t) {
    float* row = w.T + t * C;
    for (int64_t c = 0; c < C; ++c) row[c] = c == t ? 1.0f : 0.0f;
    for (int64_t s = 0; s < t; ++s) axpy(-w.G[t * C + s], w.T + s * C, row, s + 1);
  }
  // B1 = diag(beta) V, B2 = diag(beta exp(gamma)) K; U = T B1, W = T B2; U -= W S  (V')
  for (int64_t t = 0; t < n; ++t) {
    const float b = beta[t * ldg], bd = b * std::exp(w.gamma[t]);
    for (int64_t j = 0; j < dv; ++j) w.B1[t * dv + j] = b * v[t * ldv + j];
    for (int64_t i = 0; i < dk; ++i) w.B2[t * dk + i] = bd * w.K[t * dk + i];
  }
  small_matmul(n, dv, n, w.T, C, w.B1, dv, w.U, dv, 1.0f, 0.0f, true);
  small_matmul(n, dk, n, w.T, C, w.B2, dk, w.W, dk, 1.0f, 0.0f, true);
  small_matmul(n, dv, dk, w.W, dk, S, dv, w.U, dv, -1.0f, 1.0f, false);
  // out = diag(exp(gamma)) Q S + P V'
  small_matmul(n, dv, dk, w.Q, dk, S, dv, out, ldo, 1.0f, 0.0f, false);
  for (int64_t t = 0; t < n; ++t) {
    const float growth = std::exp(w.gamma[t]);
    for (int64_t j = 0; j < dv; ++j) out[t * ldo + j] *= growth;
  }
  small_matmul(n, dv, n, w.P, C, w.U, dv, out, ldo, 1.0f, 1.0f, true);
  // S = exp(gamma_last) S + (K^T diag(exp(gamma_last - gamma))) V'
  const float last = w.gamma[n - 1];
  for (int64_t t = 0; t < n; ++t) w.gamma[t] = std::exp(last - w.gamma[t]);
  for (int64_t i = 0; i < dk; ++i)
    for (int64_t t = 0; t < n; ++t) w.KT[i * C + t] *= w.gamma[t];
  small_matmul(dk, dv, n, w.KT, C, w.U, dv, S, dv, 1.0f, std::exp(last), false);
}

}  // namespace ellm::scalar
