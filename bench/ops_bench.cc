// ops_bench: microbenchmarks of single engine pieces on this CPU (no peer: tools for profiling,
// not claims; the claims come from gpt2_step_bench / gpt2_table_bench beside PyTorch).
//   ops_bench cast   [--quick]   Cast throughput f32<->bf16/f16 at 1 and 2 threads
//   ops_bench step   [--small] [--quick]   model step time fp32 vs bf16 vs f16 (ZeroGrad, Forward,
//                                Backward, AdamW, weight refresh), median after 2 warm-up steps
//   ops_bench gemm   [--quick]   the lm_head-shaped GEMM (2048 x 50304 x 384) with fp32/bf16/f16
//                                inputs, and the Cast of its (N, Vp) gradient to bf16
//   ops_bench xent   [--quick]   softmax + cross-entropy of 512 x 50304 logits: the fp32 gradient
//                                in place + Cast to bf16 against the fused bf16 gradient
//   ops_bench gemms  [--quick]   the tiny gpt2 step's fp32 GEMM shapes (1024 tokens, C 256) with
//                                oneDNN and with OpenBLAS (our row split), 2 threads, best of 20
//   ops_bench layouts            the tiny and small steps' fp32 GEMM dimensions in all four
//                                layouts (NN/NT/TN/TT) through cpu::Sgemm, oneDNN, 2 threads
//   ops_bench linear [--quick]   a linear layer's forward at the tiny, llama_tiny and small
//                                steps' shapes, fp32 and bf16: with a bias, the GEMM then a bias
//                                pass against oneDNN's matmul adding it as it stores
//                                (cpu::DnnlMatmul); without one, the GEMM against the matmul
//   ops_bench gelubwd [--quick]  GELU's backward over 1024 x 1024 then the bias gradient (and the
//                                16-bit rounding), against the fused cpu::GeluBackwardBias
//   ops_bench gelufwd [--quick]  the MLP up projection's forward under bf16 (matmul with the bias,
//                                then the GELU pass rounding to bf16) and each part alone; fp32:
//                                matmul with the bias then GELU against sgemm then bias + GELU
//   ops_bench pack   [--quick]   cpu::PackBA16a64b2a (bf16 B into oneDNN's blocked layout) at the
//                                small step's shapes: a layer input (K rows x N, plain) and a
//                                weight (W^T, transposed), GB/s read, 2 threads, median of 21
//   ops_bench attn   [--quick]   causal self-attention forward and backward, fp32 and bf16
//                                operands, at the step table's shapes: tiny (B 8, T 128, 4 heads
//                                of 64; 4 and 2 kv heads), small (T 256, 6 heads) and small at
//                                T 1024, 2 threads
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "models/model.h"
#include "optim/adamw.h"

namespace traind::bench {
namespace {

using engine::DType;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <typename F>
double Best(int reps, F&& f) {
  double t = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    t = std::min(t, Since(t0));
  }
  return t;
}

int Cast(bool quick) {
  const int64_t n = quick ? (1 << 16) : (1 << 24);
  std::vector<float> f(n), g(n);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  for (float& x : f) x = d(rng);
  std::vector<uint16_t> h(n);
  for (int nt : {1, 2}) {
    auto time = [&](const char* name, auto fn) {
      const double s = Best(quick ? 2 : 10, fn);
      std::printf("RESULT cast nt=%d %-10s %.2f G elements/s\n", nt, name, n / s / 1e9);
    };
    time("f32->bf16", [&] { engine::cpu::Cast(h.data(), DType::kBF16, f.data(), DType::kF32, n, nt); });
    time("bf16->f32", [&] { engine::cpu::Cast(g.data(), DType::kF32, h.data(), DType::kBF16, n, nt); });
    time("f32->f16", [&] { engine::cpu::Cast(h.data(), DType::kF16, f.data(), DType::kF32, n, nt); });
    time("f16->f32", [&] { engine::cpu::Cast(g.data(), DType::kF32, h.data(), DType::kF16, n, nt); });
  }
  return 0;
}

int Step(bool small, bool quick) {
  engine::ModelConfig c;
  c.arch = engine::Arch::kGpt2;
  c.vocab_size = small ? 50304 : 256;
  c.n_positions = 1024;
  c.n_embd = small ? 384 : (quick ? 64 : 256);
  c.n_layer = small ? 6 : (quick ? 2 : 4);
  c.n_head = small ? 6 : 4;
  const int64_t B = quick ? 2 : 8, T = small ? 256 : (quick ? 32 : 128);
  const int steps = quick ? 1 : (small ? 5 : 10);
  double fp32_median = 0;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(2);
    engine::DeviceArena arena(be.get(), 0);
    engine::ModelOptions o;
    o.micro_batch = B;
    o.seq_len = T;
    o.compute_type = t;
    auto model = engine::Model::Create(c, o, &arena);
    auto opt = model.ok() ? engine::AdamWOptimizer::Create((*model)->params(), (*model)->num_params(),
                                                           engine::AdamWOptions{}, &arena)
                          : Result<std::unique_ptr<engine::AdamWOptimizer>>(model.status());
    if (!opt.ok()) {
      std::fprintf(stderr, "%s\n", opt.status().ToString().c_str());
      return 1;
    }
    engine::Model& m = **model;
    m.InitRandom(1);
    std::mt19937 rng(1);
    std::vector<int32_t> ids(B * T), targets(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      ids[i] = static_cast<int32_t>(rng() % c.vocab_size);
      targets[i] = static_cast<int32_t>(rng() % c.vocab_size);
    }
    be->CopyHostToDevice(m.inputs(), ids.data(), ids.size() * 4);
    be->CopyHostToDevice(m.targets(), targets.data(), targets.size() * 4);
    std::vector<double> times;
    double loss = 0;
    for (int s = 0; s < steps + 2; ++s) {
      const auto t0 = Clock::now();
      m.ZeroGrad();
      loss = m.Forward(true, 1.0f);
      m.Backward();
      (*opt)->Step(m.param_data(), m.grad_data(), 1e-4, 1.0f);
      m.ParamsChanged();
      be->Synchronize();
      if (s >= 2) times.push_back(Since(t0));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (t == DType::kF32) fp32_median = median;
    std::printf("RESULT step %s L=%lld C=%lld T=%lld B=%lld V=%lld %s: %.1f ms median, %.0f tok/s, "
                "%.0f GFLOP/s, %.2fx fp32, loss %.4f, peak %.1f MiB\n",
                small ? "small" : "tiny", static_cast<long long>(c.n_layer),
                static_cast<long long>(c.n_embd), static_cast<long long>(T), static_cast<long long>(B),
                static_cast<long long>(c.vocab_size), engine::DTypeName(t), 1e3 * median,
                B * T / median, engine::Model::TrainingFlops(c, B, T) / median / 1e9,
                fp32_median / median, loss, arena.peak_bytes() / 1048576.0);
  }
  return 0;
}

int Gemm(bool quick) {
  std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(2);
  const int64_t M = quick ? 64 : 2048, K = 384, N = quick ? 1024 : 50304;
  std::vector<float> a(M * K, 0.01f), b(N * K, 0.02f), c(M * N);
  std::vector<uint16_t> a16(M * K), b16(N * K), c16(M * N);
  const int reps = quick ? 1 : 5;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const void* A = a.data();
    const void* B = b.data();
    if (t != DType::kF32) {
      be->Cast(a16.data(), t, a.data(), DType::kF32, M * K);
      be->Cast(b16.data(), t, b.data(), DType::kF32, N * K);
      A = a16.data();
      B = b16.data();
    }
    const double s = Best(reps, [&] {
      be->Gemm(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, c.data(), N, t, DType::kF32);
    });
    std::printf("RESULT gemm %lldx%lldx%lld %s inputs: %.1f ms, %.0f GFLOP/s\n",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                engine::DTypeName(t), 1e3 * s, 2.0 * M * N * K / s / 1e9);
  }
  const double cs = Best(reps, [&] { be->Cast(c16.data(), DType::kBF16, c.data(), DType::kF32, M * N); });
  std::printf("RESULT cast f32->bf16 of %lld elements: %.1f ms, %.2f Gelem/s\n",
              static_cast<long long>(M * N), 1e3 * cs, M * N / cs / 1e9);
  return 0;
}

// The lm head's loss + gradient on a chunk of 512 rows x 50304 (GPT-2's padded vocabulary): the
// fp32 gradient in place followed by its Cast to bf16 (two passes over memory) against the fused
// 16-bit gradient (Backend::SoftmaxCrossEntropy's grad16), wall and process CPU time, best of 5.
int Xent(bool quick) {
  std::unique_ptr<engine::Backend> be = engine::MakeCpuBackend(2);
  const int64_t N = quick ? 16 : 512, V = 50257, Vp = 50304;
  std::vector<float> logits(static_cast<size_t>(N * Vp)), work(logits.size()), losses(N);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (float& x : logits) x = u(rng);
  std::vector<int32_t> tg(N);
  for (int64_t n = 0; n < N; ++n) tg[n] = static_cast<int32_t>((n * 7919) % V);
  std::vector<uint16_t> g16(logits.size());
  const int reps = quick ? 1 : 5;
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  for (int fused = 0; fused < 2; ++fused) {
    double best = 1e30, cpu = 0.0;
    for (int r = 0; r < reps; ++r) {
      std::memcpy(work.data(), logits.data(), logits.size() * sizeof(float));
      const double c0 = cpu_now();
      const auto t0 = Clock::now();
      if (fused) {
        be->SoftmaxCrossEntropy(work.data(), losses.data(), tg.data(), N, V, Vp, 1.0f, true,
                                nullptr, g16.data(), DType::kBF16);
      } else {
        be->SoftmaxCrossEntropy(work.data(), losses.data(), tg.data(), N, V, Vp, 1.0f, true,
                                nullptr);
        be->Cast(g16.data(), DType::kBF16, work.data(), DType::kF32, N * Vp);
      }
      best = std::min(best, Since(t0));
      cpu += cpu_now() - c0;
    }
    std::printf("RESULT xent %lldx%lld %s: %.2f ms (best of %d), %.2f CPU-ms (mean)\n",
                static_cast<long long>(N), static_cast<long long>(Vp),
                fused ? "fused bf16 gradient" : "in place + cast", 1e3 * best, reps,
                1e3 * cpu / reps);
  }
  return 0;
}

// The fp32 GEMMs of the tiny gpt2's step (N = 1024 tokens, C = 256, 4C = 1024, 3C = 768), as
// gpt2_step_bench --profile names them (trans_a trans_b M x N x K), through cpu::Sgemm with either
// library: GFLOP/s, best of 20 calls.
int Gemms(bool quick) {
  struct Shape {
    bool ta, tb;
    int64_t M, N, K;
  };
  const Shape shapes[] = {{true, false, 256, 1024, 1024}, {false, true, 1024, 256, 1024},
                          {false, false, 1024, 1024, 256}, {true, false, 1024, 256, 1024},
                          {false, true, 1024, 1024, 256}, {false, false, 1024, 256, 1024},
                          {false, true, 1024, 768, 256},  {true, false, 768, 256, 1024},
                          {false, false, 1024, 256, 768}, {false, true, 1024, 256, 256},
                          {true, false, 256, 256, 1024},  {false, false, 1024, 256, 256},
                          {false, false, 1024, 1024, 1024}};
  const int reps = quick ? 1 : 20;
  std::vector<float> a(1 << 20), b(1 << 20), c(1 << 20);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto* x : {&a, &b})
    for (float& e : *x) e = u(rng);
  // One library over every shape, then the other (switching per call made oneDNN run some
  // shapes at one thread's rate).
  const size_t ns = sizeof(shapes) / sizeof(shapes[0]);
  std::vector<double> gf(2 * ns, 0.0);
  for (int lib = 0; lib < 2; ++lib) {
    if (!engine::cpu::SetGemmLibraryForTesting(lib == 0)) continue;
    for (size_t i = 0; i < ns; ++i) {
      const Shape& s = shapes[i];
      const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      const double t = Best(reps, [&] {
        engine::cpu::Sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                           c.data(), s.N, 2);
      });
      gf[lib * ns + i] = 2.0 * s.M * s.N * s.K / t / 1e9;
    }
  }
  for (size_t i = 0; i < ns; ++i) {
    const Shape& s = shapes[i];
    std::printf("RESULT gemm %c%c %lldx%lldx%lld  onednn %.1f GFLOP/s  openblas %.1f GFLOP/s\n",
                s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', static_cast<long long>(s.M),
                static_cast<long long>(s.N), static_cast<long long>(s.K), gf[i], gf[ns + i]);
  }
  engine::cpu::SetGemmLibraryForTesting(true);
  return 0;
}

// The tiny and small steps' fp32 GEMM dimensions in all four layouts (NN, NT, TN, TT) through
// cpu::Sgemm as the step calls it (a transposed narrow B repacked first), oneDNN, 2 threads, best
// of 20: which layouts the library runs slowly.
int GemmLayouts() {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{256, 1024, 1024}, {1024, 256, 1024}, {1024, 1024, 256},
                          {1024, 768, 256},  {768, 256, 1024},  {1024, 256, 768},
                          {1024, 256, 256},  {256, 256, 1024},  {2048, 384, 1536},
                          {2048, 384, 384}};
  std::vector<float> a(1 << 22), b(1 << 22), c(1 << 22);
  for (auto* x : {&a, &b})
    for (float& e : *x) e = 0.5f;
  for (const Shape& s : shapes) {
    std::printf("RESULT gemm %lldx%lldx%lld GFLOP/s:", static_cast<long long>(s.M),
                static_cast<long long>(s.N), static_cast<long long>(s.K));
    for (int v = 0; v < 4; ++v) {
      const bool ta = (v & 2) != 0, tb = (v & 1) != 0;
      const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
      const double t = Best(20, [&] {
        engine::cpu::Sgemm(ta, tb, s.M, s.N, s.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                           c.data(), s.N, 2);
      });
      std::printf("  %c%c %.1f", ta ? 'T' : 'N', tb ? 'T' : 'N', 2.0 * s.M * s.N * s.K / t / 1e9);
    }
    std::printf("\n");
  }
  return 0;
}

int LinearBias(bool quick) {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1024, 768, 256},  {1024, 256, 256},  {1024, 1024, 256},
                          {1024, 256, 1024}, {1024, 1376, 256}, {1024, 256, 688},
                          {1024, 512, 256},  {2048, 1152, 384}, {2048, 384, 384},
                          {2048, 1536, 384}, {2048, 384, 1536}};
  const int reps = quick ? 1 : 20;
  std::vector<float> a(1 << 22, 0.5f), b(1 << 22, 0.5f), c(1 << 22), bias(4096, 0.25f);
  std::vector<uint16_t> a16(1 << 22, 0x3f00), b16(1 << 22, 0x3f00);  // bf16 0.5
  for (const Shape& s : shapes) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const bool f32 = t == DType::kF32;
      const void* A = f32 ? static_cast<const void*>(a.data()) : a16.data();
      const void* B = f32 ? static_cast<const void*>(b.data()) : b16.data();
      const double apart = Best(reps, [&] {
        engine::cpu::Gemm(false, true, s.M, s.N, s.K, 1.0f, A, s.K, B, s.K, 0.0f, c.data(), s.N,
                          t, DType::kF32, 2);
        engine::cpu::AddBias(c.data(), bias.data(), s.M, s.N, 2);
      });
      bool fused_ok = true;
      const double fused = Best(reps, [&] {
        fused_ok = engine::cpu::DnnlMatmul(false, true, s.M, s.N, s.K, 1.0f, A, s.K, B, s.K, 0.0f,
                                           c.data(), s.N, t, DType::kF32, bias.data(), 2);
      });
      const double plain = Best(reps, [&] {
        engine::cpu::Gemm(false, true, s.M, s.N, s.K, 1.0f, A, s.K, B, s.K, 0.0f, c.data(), s.N,
                          t, DType::kF32, 2);
      });
      const double plain_mm = Best(reps, [&] {
        fused_ok = fused_ok && engine::cpu::DnnlMatmul(false, true, s.M, s.N, s.K, 1.0f, A, s.K, B,
                                                       s.K, 0.0f, c.data(), s.N, t, DType::kF32,
                                                       nullptr, 2);
      });
      if (!fused_ok) {
        std::printf("RESULT linear %s %lldx%lldx%lld  oneDNN's matmul refused the case\n",
                    f32 ? "f32 " : "bf16", static_cast<long long>(s.M),
                    static_cast<long long>(s.N), static_cast<long long>(s.K));
        continue;
      }
      std::printf(
          "RESULT linear %s %lldx%lldx%lld  with a bias: gemm + bias pass %.3f ms, matmul %.3f ms;"
          "  without: gemm %.3f ms, matmul %.3f ms\n",
          f32 ? "f32 " : "bf16", static_cast<long long>(s.M), static_cast<long long>(s.N),
          static_cast<long long>(s.K), apart * 1e3, fused * 1e3, plain * 1e3, plain_mm * 1e3);
    }
  }
  return 0;
}

int GeluBwd(bool quick) {
  const int64_t N = 1024, OC = 1024, n = N * OC;
  const int reps = quick ? 1 : 30;
  std::vector<float> inp(n, 0.3f), dout(n, 0.7f), dinp(n), db(OC);
  std::vector<uint16_t> d16(n);
  for (DType t : {DType::kF32, DType::kBF16}) {
    const bool f32 = t == DType::kF32;
    const double apart = Best(reps, [&] {
      engine::cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n, 2);
      if (f32) {
        engine::cpu::BiasBackward(db.data(), dinp.data(), N, OC, 2);
      } else {
        engine::cpu::BiasBackwardRounded(db.data(), dinp.data(), N, OC, d16.data(), t, 2);
      }
    });
    const double fused = Best(reps, [&] {
      engine::cpu::GeluBackwardBias(dinp.data(), inp.data(), dout.data(), db.data(), N, OC,
                                    f32 ? nullptr : d16.data(), t, 2);
    });
    std::printf("RESULT gelu_bwd %s 1024x1024  gelu_bwd + bias_bwd %.3f ms  fused %.3f ms\n",
                f32 ? "f32 " : "bf16", apart * 1e3, fused * 1e3);
  }
  return 0;
}

// The MLP's up projection forward as the 16-bit steps run it (LinearForwardRoundedAct on the CPU:
// oneDNN's matmul adding the bias, then one pass of GELU rounding the activation to bf16) against
// its parts: the matmul alone and the GELU pass alone on a pre-activation already in cache.
int GeluFwd(bool quick) {
  struct Shape {
    int64_t N, C, OC;
  };
  const Shape shapes[] = {{1024, 256, 1024}, {2048, 384, 1536}};
  const int reps = quick ? 1 : 20;
  for (const Shape& s : shapes) {
    std::vector<uint16_t> inp(s.N * s.C, 0x3f00), w(s.OC * s.C, 0x3c00);  // bf16 0.5, 0.0078
    std::vector<float> bias(s.OC, 0.25f), pre(s.N * s.OC);
    std::vector<uint16_t> act(s.N * s.OC);
    const double matmul = Best(reps, [&] {
      engine::cpu::LinearGemm(pre.data(), inp.data(), w.data(), bias.data(), s.N, s.C, s.OC,
                              DType::kBF16, 2);
    });
    const double gelu = Best(reps, [&] {
      engine::cpu::BiasGelu(pre.data(), nullptr, s.N, s.OC, act.data(), DType::kBF16, 2);
    });
    const double both = Best(reps, [&] {
      engine::cpu::LinearGemm(pre.data(), inp.data(), w.data(), bias.data(), s.N, s.C, s.OC,
                              DType::kBF16, 2);
      engine::cpu::BiasGelu(pre.data(), nullptr, s.N, s.OC, act.data(), DType::kBF16, 2);
    });
    std::printf("RESULT gelu_fwd bf16 %lldx%lldx%lld  matmul+bias %.3f ms, gelu pass %.3f ms "
                "(%.2f Gelem/s), both %.3f ms\n",
                static_cast<long long>(s.N), static_cast<long long>(s.OC),
                static_cast<long long>(s.C), matmul * 1e3, gelu * 1e3,
                s.N * s.OC / gelu / 1e9, both * 1e3);
    // fp32: oneDNN's matmul adding the bias then the GELU pass, against sgemm with the bias added
    // in the GELU pass (what LinearForward runs in fp32 past cpu::LinearGemm's widest matmul).
    std::vector<float> inp32(s.N * s.C, 0.5f), w32(s.OC * s.C, 0.0078125f), act32(s.N * s.OC);
    bool matmul_ok = true;
    const double via_matmul = Best(reps, [&] {
      matmul_ok = engine::cpu::DnnlMatmul(false, true, s.N, s.OC, s.C, 1.0f, inp32.data(), s.C,
                                          w32.data(), s.C, 0.0f, pre.data(), s.OC, DType::kF32,
                                          DType::kF32, bias.data(), 2);
      engine::cpu::BiasGelu(pre.data(), nullptr, s.N, s.OC, act32.data(), DType::kF32, 2);
    });
    const double via_sgemm = Best(reps, [&] {
      engine::cpu::Gemm(false, true, s.N, s.OC, s.C, 1.0f, inp32.data(), s.C, w32.data(), s.C,
                        0.0f, pre.data(), s.OC, DType::kF32, DType::kF32, 2);
      engine::cpu::BiasGelu(pre.data(), bias.data(), s.N, s.OC, act32.data(), DType::kF32, 2);
    });
    std::printf("RESULT gelu_fwd f32  %lldx%lldx%lld  matmul+bias then gelu %.3f ms%s, sgemm then "
                "bias+gelu %.3f ms\n",
                static_cast<long long>(s.N), static_cast<long long>(s.OC),
                static_cast<long long>(s.C), via_matmul * 1e3,
                matmul_ok ? "" : " (oneDNN's matmul refused it: sgemm)", via_sgemm * 1e3);
  }
  return 0;
}

// Causal self-attention (cpu::AttentionForward / AttentionBackward) at the step table's shapes,
// fp32 operands and bf16 ones (the bf16 steps' request: dot-product tiles where the CPU has
// AVX512-BF16, else fp32): ms per call and GFLOP/s counting the full T x T products (as the step's
// model FLOPs do: 4 B NH T^2 HS forward, twice that backward), best of 20 calls. "w256": the same
// T1024 shape with a 256-key sliding window (mistral's mask; the key blocks outside it skipped;
// GFLOP/s still count the full square).
int Attn(bool quick) {
  struct Shape {
    const char* name;
    int64_t B, T, NH, NKV, HS;
    bool causal = true;
    int64_t window = 0;
  };
  const Shape shapes[] = {{"tiny", 8, 128, 4, 4, 64},
                          {"llama_tiny", 8, 128, 4, 2, 64},
                          {"small", 8, 256, 6, 6, 64},
                          {"small T1024", 2, 1024, 6, 6, 64},
                          {"T1024 w256", 2, 1024, 6, 6, 64, true, 256},
                          {"bert T512", 2, 512, 12, 12, 64, false}};
  const int reps = quick ? 1 : 20;
  auto run = [&](const Shape& s, DType operands, bool print) {
    // q, k, v side by side in one (N, W) buffer, as the model's fused qkv projection leaves them.
    const int64_t C = s.NH * s.HS, KV = s.NKV * s.HS, W = C + 2 * KV, N = s.B * s.T;
    std::vector<float> qkv(N * W), out(N * C), lse(s.B * s.NH * s.T), dout(N * C), dqkv(N * W);
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto* x : {&qkv, &dout})
      for (float& e : *x) e = d(rng);
    const float* q = qkv.data();
    const float* k = q + C;
    const float* v = k + KV;
    const double fwd = Best(reps, [&] {
      engine::cpu::AttentionForward(out.data(), lse.data(), q, k, v, s.B, s.T, s.NH, s.NKV, s.HS,
                                    W, W, s.causal, nullptr, operands, s.window, 2);
    });
    const double bwd = Best(reps, [&] {
      engine::cpu::AttentionBackward(dqkv.data(), dqkv.data() + C, dqkv.data() + C + KV,
                                     dout.data(), out.data(), lse.data(), q, k, v, s.B, s.T, s.NH,
                                     s.NKV, s.HS, W, W, s.causal, nullptr, operands, s.window, 2);
    });
    const double flops = 4.0 * s.B * s.NH * s.T * s.T * s.HS;
    if (!print) return;
    std::printf("RESULT attn %-12s %s fwd %.3f ms (%.1f GFLOP/s)  bwd %.3f ms (%.1f GFLOP/s)\n",
                s.name, operands == DType::kF32 ? "f32 " : "bf16", 1e3 * fwd, flops / fwd / 1e9,
                1e3 * bwd, 2 * flops / bwd / 1e9);
  };
  // A first pass unprinted: the first shape timed in a cold process ran up to 2x slower.
  for (bool print : {false, true})
    for (const Shape& s : shapes)
      for (DType t : {DType::kF32, DType::kBF16}) run(s, t, print);
  return 0;
}

// The packer Backend::PackGemmB runs on a bf16 B: the small gpt2 step's layer inputs (2048
// rows of 384 or 1536; the lm head's 512-row chunks) and a weight read transposed.
int Pack(bool quick) {
  struct Shape {
    const char* name;
    int64_t K, N;
    bool tb;
  };
  const Shape shapes[] = {{"input 1024x256", 1024, 256, false},
                          {"input 1024x1024", 1024, 1024, false},
                          {"input 2048x384", 2048, 384, false},
                          {"input 2048x1536", 2048, 1536, false},
                          {"input 512x384", 512, 384, false},
                          {"weight^T 384x1536", 384, 1536, true}};
  const int reps = quick ? 5 : 21;
  for (const Shape& s : shapes) {
    std::vector<uint16_t> b(static_cast<size_t>(s.K * s.N), 0x3f80);
    const int64_t bytes = (s.K + 31) / 32 * 32 * ((s.N + 63) / 64 * 64) * 2;
    std::vector<char> dst(static_cast<size_t>(bytes));
    const int64_t ldb = s.tb ? s.K : s.N;
    std::vector<double> ts;
    for (int r = 0; r < reps + 2; ++r) {
      const auto t0 = Clock::now();
      engine::cpu::PackBA16a64b2a(dst.data(), b.data(), s.tb, s.K, s.N, ldb, 2);
      if (r >= 2) ts.push_back(Since(t0));
    }
    std::sort(ts.begin(), ts.end());
    const double t = ts[ts.size() / 2];
    std::printf("RESULT pack %-18s %.3f ms  %.1f GB/s read\n", s.name, 1e3 * t,
                static_cast<double>(b.size() * 2) / t / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace traind::bench

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  bool quick = false, small = false;
  for (int i = 2; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    small |= std::strcmp(argv[i], "--small") == 0;
  }
  if (what == "cast") return traind::bench::Cast(quick);
  if (what == "step") return traind::bench::Step(small, quick);
  if (what == "gemm") return traind::bench::Gemm(quick);
  if (what == "xent") return traind::bench::Xent(quick);
  if (what == "attn") return traind::bench::Attn(quick);
  if (what == "pack") return traind::bench::Pack(quick);
  if (what == "gemms") return traind::bench::Gemms(quick);
  if (what == "layouts") return traind::bench::GemmLayouts();
  if (what == "linear") return traind::bench::LinearBias(quick);
  if (what == "gelubwd") return traind::bench::GeluBwd(quick);
  if (what == "gelufwd") return traind::bench::GeluFwd(quick);
  std::fprintf(stderr,
               "usage: ops_bench cast|step|gemm|gemms|layouts|linear|gelubwd|gelufwd|xent|attn|"
               "pack "
               "[--quick] [--small]\n");
  return 2;
}
