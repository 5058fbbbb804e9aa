// Helpers shared by the CPU backend tests: seeded random vectors, closeness checks with stated
// tolerances, and central finite differences of double-precision reference functions.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace traind::engine::testing {

inline std::vector<float> RandVec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Expects |got[i] - want[i]| <= atol + rtol * |want[i]| for all i; reports the worst element.
inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double rtol,
                        double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::abs(got[i] - want[i]) - (atol + rtol * std::abs(want[i]));
    if (std::isnan(got[i]) || excess > worst) {
      worst = std::isnan(got[i]) ? INFINITY : excess;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << worst_i << " got " << got[worst_i] << " want "
                        << want[worst_i] << " (rtol " << rtol << ", atol " << atol << ")";
}

// Central differences of scalar f at x (double precision), step h.
inline std::vector<double> NumGrad(const std::function<double(const std::vector<double>&)>& f,
                                   std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double DotD(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace traind::engine::testing
