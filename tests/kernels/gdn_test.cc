// The Gated DeltaNet kernels: each against the math written out in double, the chunked form of
// the delta rule against its recurrence, and every tier against the scalar twin.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace ellm {
namespace {

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double tol,
                     const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " at " << i;
}

std::vector<double> widen(const std::vector<float>& x) { return {x.begin(), x.end()}; }

double silu(double x) { return x / (1 + std::exp(-x)); }

TEST(Gdn, Conv1dSiluIsTheCausalConvolutionAndCarriesItsWindow) {
  for (int64_t channels : {1, 8, 13, 64}) {
    const int64_t taps = 4, ld = channels + 3, n = 9;
    auto x = random_floats(n * channels, 1);
    auto weight = random_floats(taps * ld, 2);
    auto window0 = random_floats((taps - 1) * ld, 3);
    // in(t) for t in [-3, n): the window's rows, then x.
    auto in = [&](int64_t t, int64_t c) -> double {
      return t < 0 ? window0[(t + taps - 1) * ld + c] : x[t * channels + c];
    };
    std::vector<double> want(n * channels), want_window = widen(window0);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < channels; ++c) {
        double sum = 0;
        for (int64_t j = 0; j < taps; ++j) sum += double(weight[j * ld + c]) * in(t - taps + 1 + j, c);
        want[t * channels + c] = silu(sum);
      }
    for (int64_t j = 0; j < taps - 1; ++j)
      for (int64_t c = 0; c < channels; ++c) want_window[j * ld + c] = in(n - taps + 1 + j, c);
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      // At once, and in two runs (4 then 5 tokens) through the window.
      for (int64_t split : {n, int64_t(4)}) {
        auto window = window0;
        std::vector<float> out(n * channels);
        conv1d_silu(x.data(), split, channels, window.data(), weight.data(), taps, channels, ld,
                    out.data(), channels);
        conv1d_silu(x.data() + split * channels, n - split, channels, window.data(), weight.data(),
                    taps, channels, ld, out.data() + split * channels, channels);
        std::string what = std::string("conv1d_silu ") + isa_name(isa) + " split " + std::to_string(split);
        expect_near_all(out, want, 1e-5, what);
        expect_near_all(window, want_window, 0, what + " window");
      }
    }
  }
}

TEST(Gdn, L2normAndGatedRmsnormMatchTheirDefinitions) {
  for (int64_t dim : {8, 32, 37, 128}) {
    const int64_t rows = 3, ld = dim + 2;
    auto x = random_floats(rows * ld, 4, -2, 2);
    auto z = random_floats(rows * ld, 5, -4, 4);
    auto weight = random_floats(dim, 6, 0.5f, 1.5f);
    std::vector<double> want_l2(rows * dim), want_gated(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0;
      for (int64_t i = 0; i < dim; ++i) sum += double(x[r * ld + i]) * x[r * ld + i];
      for (int64_t i = 0; i < dim; ++i) {
        want_l2[r * dim + i] = x[r * ld + i] / std::sqrt(sum + 1e-6) * 0.25;
        want_gated[r * dim + i] =
            weight[i] * x[r * ld + i] / std::sqrt(sum / dim + 1e-6) * silu(z[r * ld + i]);
      }
    }
    for (Isa isa : supported_isas()) {
      IsaScope scope(isa);
      std::vector<float> l2(rows * dim), gated(rows * dim);
      l2norm(x.data(), rows, dim, ld, 0.25f, 1e-6f, l2.data(), dim);
      gated_rmsnorm(x.data(), z.data(), rows, dim, ld, ld, weight.data(), 1e-6f, gated.data(), dim);
      expect_near_all(l2, want_l2, 1e-5, std::string("l2norm ") + isa_name(isa));
      expect_near_all(gated, want_gated, 1e-5, std::string("gated_rmsnorm ") + isa_name(isa));
    }
  }
}

TEST(Gdn, RopePartialRotatesOnlyTheRotaryDims) {
  const int64_t heads = 2, head_dim = 64, rotary = 16, ld = 70;
  auto x = random_floats(heads * ld, 7);
  auto angle = random_floats(rotary / 2, 8, -3, 3);
  std::vector<float> cos(rotary / 2), sin(rotary / 2);
  for (int64_t i = 0; i < rotary / 2; ++i) {
    cos[i] = std::cos(angle[i]);
    sin[i] = std::sin(angle[i]);
  }
  std::vector<double> want = widen(x);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < rotary / 2; ++i) {
      double a = x[h * ld + i], b = x[h * ld + i + rotary / 2];
      want[h * ld + i] = a * cos[i] - b * sin[i];
      want[h * ld + i + rotary / 2] = b * cos[i] + a * sin[i];
    }
  for (Isa isa : supported_isas()) {
    IsaScope scope(isa);
    auto got = x;
    rope_partial(got.data(), heads, ld, rotary, cos.data(), sin.data());
    expect_near_all(got, want, 1e-6, std::string("rope_partial ") + isa_name(isa));
    for (int64_t i = rotary; i < head_dim; ++i) EXPECT_EQ(got[i], x[i]) << "dim " << i << " moved";
  }
}

// One head's tokens: q, k L2-normalised (as the layer feeds them), g < 0, beta in (0, 1).
struct DeltaInputs {
  int64_t n, dk, dv;
  std::vector<float> q, k, v, g, beta, S0;
  DeltaInputs(int64_t n_, int64_t dk_, int64_t dv_, uint32_t seed)
      : n(n_), dk(dk_), dv(dv_), q(random_floats(n * dk, seed)), k(random_floats(n * dk, seed + 1)),
        v(random_floats(n * dv, seed + 2, -2, 2)), g(random_floats(n, seed + 3, -0.6f, -0.01f)),
        beta(random_floats(n, seed + 4, 0.05f, 0.95f)), S0(random_floats(dk * dv, seed + 5, -0.5f, 0.5f)) {
    for (int64_t t = 0; t < n; ++t) {
      l2norm(q.data() + t * dk, 1, dk, dk, 1.0f / std::sqrt(float(dk)), 1e-6f, q.data() + t * dk, dk);
      l2norm(k.data() + t * dk, 1, dk, dk, 1.0f, 1e-6f, k.data() + t * dk, dk);
    }
  }
};

// The recurrence of docs/models/qwen35.md in double: decay, error against the decayed state, rank-1
// update, read-out.
void reference_delta(const DeltaInputs& in, std::vector<double>& S, std::vector<double>& out) {
  S = widen(in.S0);
  out.assign(in.n * in.dv, 0);
  for (int64_t t = 0; t < in.n; ++t) {
    const double alpha = std::exp(double(in.g[t]));
    for (double& s : S) s *= alpha;
    for (int64_t j = 0; j < in.dv; ++j) {
      double e = in.v[t * in.dv + j];
      for (int64_t i = 0; i < in.dk; ++i) e -= S[i * in.dv + j] * in.k[t * in.dk + i];
      for (int64_t i = 0; i < in.dk; ++i) S[i * in.dv + j] += in.k[t * in.dk + i] * in.beta[t] * e;
      double o = 0;
      for (int64_t i = 0; i < in.dk; ++i) o += S[i * in.dv + j] * in.q[t * in.dk + i];
      out[t * in.dv + j] = o;
    }
  }
}

TEST(Gdn, RecurrenceAndChunkedFormMatchTheDeltaRuleOnEveryTier) {
  for (auto [dk, dv] : {std::pair<int64_t, int64_t>{32, 32}, {128, 128}, {16, 40}})
    for (int64_t n : {1, 2, 7, 63, 64}) {
      DeltaInputs in(n, dk, dv, uint32_t(11 + n + dk));
      std::vector<double> want_S, want_out;
      reference_delta(in, want_S, want_out);
      std::vector<float> scratch(gated_delta_chunk_scratch_floats(dk, dv));
      for (Isa isa : supported_isas()) {
        IsaScope scope(isa);
        const std::string what = std::string(isa_name(isa)) + " dk " + std::to_string(dk) +
                                 " dv " + std::to_string(dv) + " n " + std::to_string(n);
        auto S = in.S0;
        std::vector<float> out(n * dv);
        for (int64_t t = 0; t < n; ++t)
          gated_delta_step(S.data(), dk, dv, in.q.data() + t * dk, in.k.data() + t * dk,
                           in.v.data() + t * dv, std::exp(in.g[t]), in.beta[t], out.data() + t * dv);
        expect_near_all(out, want_out, 2e-5, "recurrence out " + what);
        expect_near_all(S, want_S, 2e-5, "recurrence S " + what);

        S = in.S0;
        std::fill(out.begin(), out.end(), 0.0f);
        gated_delta_chunk(S.data(), dk, dv, in.q.data(), in.k.data(), dk, in.v.data(), dv,
                          in.g.data(), in.beta.data(), 1, n, out.data(), dv, scratch.data());
        expect_near_all(out, want_out, 2e-5, "chunked out " + what);
        expect_near_all(S, want_S, 2e-5, "chunked S " + what);
      }
    }
}

}  // namespace
}  // namespace ellm
