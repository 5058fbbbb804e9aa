// Rotary position embedding (HF rotate-half convention), in place, forward or inverse rotation.
// inv_freq and the angles are formed in fp32 exactly as HF/PyTorch do:
//   inv_freq = 1.0 / (theta ** (torch.arange(0, HS, 2).float() / HS)),  angle = float(t) *
//   inv_freq.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/rope_freq.h"

namespace traind::engine::cpu {
namespace {

TRAIND_CPU_CLONES void RotateRow(float* x, const float* cs, const float* sn, int64_t n_heads,
                                 int64_t HS, bool inverse) {
  const int64_t half = HS / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* a = x + h * HS;
    float* b = a + half;
    if (!inverse) {
      for (int64_t i = 0; i < half; ++i) {
        float x1 = a[i], x2 = b[i];
        a[i] = x1 * cs[i] - x2 * sn[i];
        b[i] = x2 * cs[i] + x1 * sn[i];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {
        float y1 = a[i], y2 = b[i];
        a[i] = y1 * cs[i] + y2 * sn[i];
        b[i] = y2 * cs[i] - y1 * sn[i];
      }
    }
  }
}

}  // namespace

void Rope(float* x, int64_t B, int64_t T, int64_t n_heads, int64_t HS, int64_t row_stride,
          float theta, bool inverse, int64_t pos_offset, const RopeScaling& scaling, int nt,
          const int32_t* positions) {
  const int64_t half = HS / 2;
  // Packed rows: each row's position is positions[r] (an example restarts at 0 within its row),
  // read from the table of positions 0..Tt-1 (Tt: T, or past the largest position; negative
  // positions read position 0).
  int64_t Tt = T;
  if (positions != nullptr) {
    pos_offset = 0;
    for (int64_t r = 0; r < B * T; ++r) Tt = std::max<int64_t>(Tt, int64_t{positions[r]} + 1);
  }
  // Table of cos/sin per (t, i): (T, half) each, kept per thread and rebuilt only when the
  // positions, the head size or theta change (every layer's q and k, forward and backward, use the
  // same one: the table's libm cos/sin cost more than the rotation itself).
  struct Key {
    int64_t T = -1, half = -1, pos_offset = -1;
    float theta = 0.0f;
    RopeScaling scaling;
    bool operator==(const Key&) const = default;
  };
  static thread_local std::vector<float> table;
  static thread_local Key built;
  const Key key{Tt, half, pos_offset, theta, scaling};
  float* cs = nullptr;
  float* sn = nullptr;
  if (!(key == built)) {
    built = Key{};  // not valid while it is being rebuilt
    table.resize(static_cast<size_t>(2 * Tt * half));
    cs = table.data();
    sn = cs + Tt * half;
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq = RopeInvFreq(i, HS, theta, scaling);
      for (int64_t t = 0; t < Tt; ++t) {
        float ang = static_cast<float>(pos_offset + t) * inv_freq;
        cs[t * half + i] = std::cos(ang);
        sn[t * half + i] = std::sin(ang);
      }
    }
    built = key;
  }
  cs = table.data();
  sn = cs + Tt * half;
  const int64_t rows = B * T;
  const int threads = rows * n_heads * HS < 8192 ? 1 : nt;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = positions != nullptr ? std::max<int32_t>(positions[r], 0) : r % T;
    RotateRow(x + r * row_stride, cs + t * half, sn + t * half, n_heads, HS, inverse);
  }
}

}  // namespace traind::engine::cpu
