// Helpers of the optimizer parity tests: a set of hand-made parameter views over one flat buffer,
// seeded parameters and per-step gradients, the case files of reference/optim_case.py, and the
// relative error measure.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/param_info.h"
#include "trainer_test_util.h"

namespace traind::engine::testing {

// Views of the given shapes laid out back to back; >= 2-D views decay, vectors do not.
inline std::vector<ParamInfo> MakeParams(const std::vector<std::vector<int64_t>>& shapes,
                                         int64_t* num_params) {
  std::vector<ParamInfo> out;
  int64_t off = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamInfo p;
    p.hf_name = std::to_string(i);
    p.hf_name.insert(p.hf_name.begin(), 'p');  // not "p" + ...: GCC 12's -Wrestrict false positive
    p.shape = p.hf_shape = shapes[i];
    p.numel = 1;
    for (int64_t d : shapes[i]) p.numel *= d;
    p.offset = off;
    p.weight_decay = shapes[i].size() >= 2;
    off += p.numel;
    out.push_back(p);
  }
  *num_params = off;
  return out;
}

// n values ~ scale * N(0, 1) (+ offset), seeded.
inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = offset + scale * d(rng);
  return v;
}

inline void WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
}

inline std::vector<float> ReadFloats(const std::string& path) {
  const std::string s = ReadFile(path);
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

// Writes case.json / init.bin / grads.bin (optim_case.py) for `configs`.
inline void WriteOptimCase(const std::string& dir, const std::vector<ParamInfo>& params,
                           int64_t num_params, const std::vector<float>& init,
                           const std::vector<std::vector<float>>& grads,
                           const std::vector<double>& lrs, const std::vector<float>& grad_scales,
                           const nlohmann::json& configs) {
  nlohmann::json c;
  c["num_params"] = num_params;
  c["steps"] = grads.size();
  c["lrs"] = lrs;
  c["grad_scales"] = grad_scales;
  c["configs"] = configs;
  for (const ParamInfo& p : params) {
    c["params"].push_back({{"name", p.hf_name},
                           {"shape", p.shape},
                           {"offset", p.offset},
                           {"numel", p.numel},
                           {"decay", p.weight_decay}});
  }
  WriteFile(dir + "/case.json", c.dump());
  WriteFloats(dir + "/init.bin", init);
  std::vector<float> all;
  for (const auto& g : grads) all.insert(all.end(), g.begin(), g.end());
  WriteFloats(dir + "/grads.bin", all);
}

// max |a - b| / max |b| over each parameter view (the trainer tests' MaxRelDiff measure: relative
// to the tensor's scale, so elements that cancel to ~0 are not judged against their own size),
// and the worst view.
inline double MaxRelError(const std::vector<float>& a, const std::vector<float>& b,
                          const std::vector<ParamInfo>& params) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (const ParamInfo& p : params) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    worst = std::max(worst, scale > 0.0 ? diff / scale : diff);
  }
  return worst;
}

}  // namespace traind::engine::testing
