// GEMM operands B copied into oneDNN's blocked layouts (Backend::PackGemmB), the layouts its
// matmul kernels read B in. bf16 BA16a64b2a (AVX512-BF16 / AMX): blocks of 32 (K) x 64 (N),
// N-blocks outermost, K-blocks within; inside a block, 16 rows of 64 (k, k+1) pairs (row kp:
// B[2kp][n], B[2kp+1][n] for n = 0..63). fp32 BA16a64b: blocks of 16 x 64, row k of a block B[k][n].
// The padding (K to 32 or 16, N to 64) zero. oneDNN's own reorder into them ran at 4-10 GB/s (15
// ms a step on the small gpt2's bf16 weights); these are 16 x 16 transposes of 32-bit words.
#include <omp.h>

#include <cstdint>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_transpose.h"

namespace traind::engine::cpu {
namespace {

// Blocks (4 KiB each in both layouts) below which one thread packs: a copy runs at ~30 GB/s on one
// core here (`ops_bench pack`), and waking a sleeping OpenMP worker costs ~60 us under
// OMP_WAIT_POLICY=PASSIVE (bench/README.md), so a second thread pays off from a few MiB.
constexpr int64_t kMinParallelBlocks = 1024;

}  // namespace

TRAIND_CPU_CLONES void PackBA16a64b2a(void* dst, const uint16_t* b, bool tb, int64_t K, int64_t N,
                                      int64_t ldb, int nt) {
  const int64_t kblocks = (K + 31) / 32, nblocks = (N + 63) / 64;
  const int threads = kblocks * nblocks >= kMinParallelBlocks && !omp_in_parallel() ? nt : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t nb = 0; nb < nblocks; ++nb) {
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      uint32_t* blk = static_cast<uint32_t*>(dst) + (nb * kblocks + kb) * 1024;  // 32 x 64 bf16
      const int64_t n0 = nb * 64, k0 = kb * 32;
      const bool full = n0 + 64 <= N && k0 + 32 <= K;
      if (tb) {
        // B[k][n] = b[n * ldb + k]: the (k, k+1) pairs of row n are 32-bit words of b, so a block
        // is a 64 x 16 transpose of words (four 16 x 16 ones).
        if (full && ldb % 2 == 0) {
          const auto* src = reinterpret_cast<const float*>(b + n0 * ldb + k0);
          auto* out = reinterpret_cast<float*>(blk);
          for (int64_t q = 0; q < 4; ++q) {
            Transpose16(out + q * 16, 64, src + q * 16 * (ldb / 2), ldb / 2);
          }
          continue;
        }
        for (int64_t kp = 0; kp < 16; ++kp) {
          const int64_t k = k0 + 2 * kp;
          for (int64_t i = 0; i < 64; ++i) {
            const int64_t n = n0 + i;
            const uint32_t lo = n < N && k < K ? b[n * ldb + k] : 0;
            const uint32_t hi = n < N && k + 1 < K ? b[n * ldb + k + 1] : 0;
            blk[kp * 64 + i] = lo | hi << 16;
          }
        }
      } else {
        // B[k][n] = b[k * ldb + n]: rows k and k + 1 interleaved.
        for (int64_t kp = 0; kp < 16; ++kp) {
          const int64_t k = k0 + 2 * kp;
          uint32_t* out = blk + kp * 64;
          if (full) {
            const uint16_t* r0 = b + k * ldb + n0;
            const uint16_t* r1 = r0 + ldb;
            for (int64_t i = 0; i < 64; ++i) out[i] = r0[i] | static_cast<uint32_t>(r1[i]) << 16;
            continue;
          }
          for (int64_t i = 0; i < 64; ++i) {
            const int64_t n = n0 + i;
            const uint32_t lo = n < N && k < K ? b[k * ldb + n] : 0;
            const uint32_t hi = n < N && k + 1 < K ? b[(k + 1) * ldb + n] : 0;
            out[i] = lo | hi << 16;
          }
        }
      }
    }
  }
}

// fp32 BA16a64b: blocks of 16 (K) x 64 (N), N-blocks outermost; inside a block, row k holds B[k][n]
// for n = 0..63. The forward's B (tb: b is W, N x K) is then a 64 x 16 transpose per block.
TRAIND_CPU_CLONES void PackBA16a64b(void* dst, const float* b, bool tb, int64_t K, int64_t N,
                                    int64_t ldb, int nt) {
  const int64_t kblocks = (K + 15) / 16, nblocks = (N + 63) / 64;
  const int threads = kblocks * nblocks >= kMinParallelBlocks && !omp_in_parallel() ? nt : 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t nb = 0; nb < nblocks; ++nb) {
    for (int64_t kb = 0; kb < kblocks; ++kb) {
      float* blk = static_cast<float*>(dst) + (nb * kblocks + kb) * 1024;  // 16 x 64
      const int64_t n0 = nb * 64, k0 = kb * 16;
      const bool full = n0 + 64 <= N && k0 + 16 <= K;
      if (tb && full) {
        for (int64_t q = 0; q < 4; ++q) Transpose16(blk + q * 16, 64, b + (n0 + q * 16) * ldb + k0, ldb);
        continue;
      }
      for (int64_t kk = 0; kk < 16; ++kk) {
        const int64_t k = k0 + kk;
        float* out = blk + kk * 64;
        for (int64_t i = 0; i < 64; ++i) {
          const int64_t n = n0 + i;
          out[i] = n < N && k < K ? (tb ? b[n * ldb + k] : b[k * ldb + n]) : 0.0f;
        }
      }
    }
  }
}

}  // namespace traind::engine::cpu
