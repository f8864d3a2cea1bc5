// Plain C++ Gated DeltaNet kernels (kernels.h): the reference the vector versions are tested
// against. Everything in FP32, in the order the math is written.
#include <cmath>

#include "kernels/scalar/scalar.h"

namespace ellm::scalar {
namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// acc[j] += a * x[j], j < n
void axpy(float a, const float* x, float* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += a * x[j];
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
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= decay;
      e[j] -= row[j] * k[i];
    }
  }
  for (int64_t j = 0; j < dv; ++j) {
    e[j] *= beta;
    out[j] = 0;
  }
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    axpy(k[i], e, row, dv);
    axpy(q[i], row, out, dv);
  }
}

void gated_delta_chunk(float* S, int64_t dk, int64_t dv, const float* q, const float* k,
                       int64_t ldqk, const float* v, int64_t ldv, const float* g,
                       const float* beta, int64_t ldg, int64_t n, float* out, int64_t ldo,
                       float* scratch) {
  const int64_t C = kDeltaChunk;
  float* gamma = scratch;   // [C]  running sum of g
  float* A = gamma + C;     // [C][C]  strict lower: beta_t k_t.k_s exp(gamma_t - gamma_s)
  float* W = A + C * C;     // [C][dk]
  float* U = W + C * dk;    // [C][dv]  U, then V' = U - W S
  float* decay = U + C * dv;  // [C][C]  exp(gamma_t - gamma_s), s <= t
  auto K = [&](int64_t t) { return k + t * ldqk; };
  auto Q = [&](int64_t t) { return q + t * ldqk; };

  for (int64_t t = 0; t < n; ++t) gamma[t] = (t ? gamma[t - 1] : 0.0f) + g[t * ldg];
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s <= t; ++s) decay[t * C + s] = std::exp(gamma[t] - gamma[s]);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < t; ++s)
      A[t * C + s] = beta[t * ldg] * dot(K(t), K(s), dk) * decay[t * C + s];

  // Forward substitution through the unit lower-triangular I + A.
  for (int64_t t = 0; t < n; ++t) {
    float* u = U + t * dv;
    float* w = W + t * dk;
    const float b = beta[t * ldg];
    for (int64_t j = 0; j < dv; ++j) u[j] = b * v[t * ldv + j];
    const float bd = b * std::exp(gamma[t]);
    for (int64_t i = 0; i < dk; ++i) w[i] = bd * K(t)[i];
    for (int64_t s = 0; s < t; ++s) {
      axpy(-A[t * C + s], U + s * dv, u, dv);
      axpy(-A[t * C + s], W + s * dk, w, dk);
    }
  }
  // V' = U - W S; out = (Q exp(gamma)) S + causal (Q K^T * decay) V'
  for (int64_t t = 0; t < n; ++t) {
    float* u = U + t * dv;
    float* o = out + t * ldo;
    for (int64_t j = 0; j < dv; ++j) o[j] = 0;
    const float growth = std::exp(gamma[t]);
    for (int64_t i = 0; i < dk; ++i) {
      axpy(-W[t * dk + i], S + i * dv, u, dv);
      axpy(Q(t)[i] * growth, S + i * dv, o, dv);
    }
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s <= t; ++s)
      axpy(dot(Q(t), K(s), dk) * decay[t * C + s], U + s * dv, out + t * ldo, dv);
  // S = exp(gamma_last) S + sum_t (k_t exp(gamma_last - gamma_t)) V'_t^T
  const float last = gamma[n - 1], total = std::exp(last);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dv;
    for (int64_t j = 0; j < dv; ++j) row[j] *= total;
    for (int64_t t = 0; t < n; ++t) axpy(K(t)[i] * std::exp(last - gamma[t]), U + t * dv, row, dv);
  }
}

}  // namespace ellm::scalar
