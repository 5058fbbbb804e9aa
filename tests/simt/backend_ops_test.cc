// The op table: every compute op of the Backend interface (backend.h's TRAIND_BACKEND_OPS), as
// cases with shapes, dtypes and ragged sizes (not multiples of any block size), run on every device
// present against the CPU reference (the CPU backend with one thread):
//   - "cpu" (2 threads): threading must not change results beyond reassociation;
//   - the device under test: "simt" (the CUDA kernels on the CPU; CI), or "cuda:0" in the gpu_*
//     build of this file (device_under_test.h).
// Tolerances per case (absolute + relative, per element): fp32 elementwise 1e-6 + 1e-5;
// reductions and norms 1e-5 + 1e-4; attention 2e-5 + 2e-4 (different summation orders over T);
// casts exact to the bit (NaN payloads aside); sums of squares 1e-10 relative.
// The CPU backend's own correctness is tested against independent references elsewhere
// (cpu_ops_test and cpu_attention_test: hand computations; model_gradcheck_test: finite differences;
// model_parity_test: PyTorch).
// A new op: a row in TRAIND_BACKEND_OPS, then a case here (EveryOpHasACase fails until it has one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/quant4.h"
#include "core/half.h"
#include "device_under_test.h"
#include "optim/quant8.h"
#include "random_inputs.h"

namespace traind::engine {
namespace {

using testing::Random;

std::vector<int32_t> RandomIds(size_t n, int32_t below, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(below));
  return v;
}

std::vector<uint16_t> To16(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = t == DType::kBF16 ? F32ToBF16(v[i]) : F32ToF16(v[i]);
  return out;
}

// 16-bit codes of type t (bf16 or f16, as doubles from Dev::Get) as the values they stand for.
std::vector<double> Widen16(const std::vector<double>& codes, DType t) {
  std::vector<double> v(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) {
    const auto h = static_cast<uint16_t>(codes[i]);
    v[i] = t == DType::kBF16 ? BF16ToF32(h) : F16ToF32(h);
  }
  return v;
}

// Named outputs of one case run on one backend, as doubles (16-bit codes as their integer value).
using Outputs = std::vector<std::pair<std::string, std::vector<double>>>;

// Buffers on one backend for one case run; freed at the end of the run.
class Dev {
 public:
  explicit Dev(Backend* be) : be_(be) {}
  ~Dev() {
    be_->Synchronize();
    for (void* p : allocs_) be_->Free(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  Backend* operator->() const { return be_; }

  template <typename T>
  T* Up(const std::vector<T>& v) {
    T* p = static_cast<T*>(Alloc(v.size() * sizeof(T)));
    be_->CopyHostToDevice(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <typename T = float>
  T* Zeros(size_t n) {
    T* p = static_cast<T*>(Alloc(n * sizeof(T)));
    be_->Memset0(p, n * sizeof(T));
    return p;
  }
  template <typename T>
  std::vector<double> Get(const T* p, size_t n) {
    std::vector<T> host(n);
    be_->CopyDeviceToHost(host.data(), p, n * sizeof(T));
    return std::vector<double>(host.begin(), host.end());
  }

 private:
  void* Alloc(size_t bytes) {
    void* p = be_->Alloc(bytes == 0 ? 4 : bytes);
    allocs_.push_back(p);
    return p;
  }
  Backend* be_;
  std::vector<void*> allocs_;
};

struct OpCase {
  Op op;
  std::string label;  // shapes and variant
  double atol, rtol;
  std::function<Outputs(Dev&)> run;
};

constexpr double kElem[2] = {1e-6, 1e-5};
constexpr double kReduce[2] = {1e-5, 1e-4};
constexpr double kAttn[2] = {2e-5, 2e-4};

void Add(std::vector<OpCase>* cases, Op op, std::string label, const double* tol,
         std::function<Outputs(Dev&)> run) {
  cases->push_back({op, std::move(label), tol[0], tol[1], std::move(run)});
}

std::string Dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

// An attention case's label suffix: causal or not, the key mask, the window.
std::string AttnModeLabel(bool causal, int mask, int64_t window) {
  return std::string(causal ? "" : " bidirectional") +
         (mask == 1 ? " random mask" : mask == 2 ? " tail mask" : "") +
         (window > 0 ? " window " + std::to_string(window) : "");
}

// Its key mask (B*T; empty for mask 0): 1 random, sequence 1 empty, key 0 masked; 2 padded tails
// (sequence 0 two thirds, sequence 1 all, later ones one key).
std::vector<int32_t> AttnMask(int64_t B, int64_t T, int mask, uint64_t seed) {
  std::vector<int32_t> m;
  if (mask == 0) return m;
  std::mt19937_64 rng(seed);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = b == 0 ? T - T / 3 : b == 1 ? T : 1;  // tails
    for (int64_t j = 0; j < T; ++j) {
      const bool keep = mask == 2 ? j < len : b != 1 && j != 0 && rng() % 4 != 0;
      m.push_back(keep ? 1 : 0);
    }
  }
  return m;
}

std::vector<OpCase> AllCases() {
  std::vector<OpCase> c;
  // ---- GEMM: every transpose pair, padded leading dimensions, fp32 and 16-bit inputs ----
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{13, 37, 29}, {64, 48, 96}, {1, 5, 1}}) {
      for (int tr = 0; tr < 4; ++tr) {
        const bool ta = tr & 1, tb = tr & 2;
        Add(&c, Op::kGemm, Dims({M, N, K}) + " " + DTypeName(t) + (ta ? " At" : "") + (tb ? " Bt" : ""),
            kReduce, [=](Dev& d) {
              const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
              const int64_t arows = ta ? K : M, brows = tb ? N : K;
              const auto a = Random(arows * lda, 1), b = Random(brows * ldb, 2),
                         c0 = Random(M * ldc, 3);
              const void* A = t == DType::kF32 ? static_cast<const void*>(d.Up(a))
                                               : static_cast<const void*>(d.Up(To16(a, t)));
              const void* B = t == DType::kF32 ? static_cast<const void*>(d.Up(b))
                                               : static_cast<const void*>(d.Up(To16(b, t)));
              float* C = d.Up(c0);
              d->Gemm(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C, ldc, t, DType::kF32);
              return Outputs{{"C", d.Get(C, M * ldc)}};
            });
      }
    }
  }
  // ---- linear layer forward (GEMM + bias (+ GELU)) ----
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int variant = 0; variant < 3; ++variant) {  // 0: no bias; 1: bias; 2: bias + GELU
      const int64_t N = 19, C = 40, OC = 24;
      Add(&c, Op::kLinearForward, Dims({N, C, OC}) + " " + DTypeName(t) + " variant " + std::to_string(variant),
          kReduce, [=](Dev& d) {
            const auto inp = Random(N * C, 4), w = Random(OC * C, 5), bias = Random(OC, 6);
            const void* I = t == DType::kF32 ? static_cast<const void*>(d.Up(inp))
                                             : static_cast<const void*>(d.Up(To16(inp, t)));
            const void* W = t == DType::kF32 ? static_cast<const void*>(d.Up(w))
                                             : static_cast<const void*>(d.Up(To16(w, t)));
            float* pre = d.Zeros(N * OC);
            float* act = variant == 2 ? d.Zeros(N * OC) : nullptr;
            d->LinearForward(pre, act, I, W, variant > 0 ? d.Up(bias) : nullptr, N, C, OC, t);
            Outputs o{{"pre", d.Get(pre, N * OC)}};
            if (act != nullptr) o.push_back({"act", d.Get(act, N * OC)});
            return o;
          });
    }
  }
  // ---- linear forward with the GELU rounded to 16 bits (exact bits of the rounding aside, the
  // activation is a 16-bit value: compared after widening, at bf16/f16's relative step) ----
  for (DType at : {DType::kBF16, DType::kF16}) {
    for (bool with_bias : {false, true}) {
      const int64_t N = 19, C = 40, OC = 24;
      const double tol16[2] = {4e-3, 4e-3};
      Add(&c, Op::kLinearForwardRoundedAct,
          Dims({N, C, OC}) + " " + DTypeName(at) + (with_bias ? " bias" : ""), tol16, [=](Dev& d) {
            const auto inp = Random(N * C, 140), w = Random(OC * C, 141), bias = Random(OC, 142);
            float* pre = d.Zeros(N * OC);
            auto* act = d.Zeros<uint16_t>(N * OC);
            d->LinearForwardRoundedAct(pre, act, at, d.Zeros(N * OC), d.Up(To16(inp, at)),
                                       d.Up(To16(w, at)), with_bias ? d.Up(bias) : nullptr, N, C,
                                       OC, at);
            return Outputs{{"pre", d.Get(pre, N * OC)}, {"act", Widen16(d.Get(act, N * OC), at)}};
          });
    }
  }
  // ---- embedding ----
  for (auto [N, C, V] : {std::tuple<int64_t, int64_t, int64_t>{13, 37, 50}, {64, 256, 9}, {1, 1, 1}}) {
    for (bool acc : {false, true}) {
      Add(&c, Op::kEmbeddingForward, Dims({N, C, V}) + (acc ? " accumulate" : ""), kElem, [=](Dev& d) {
        float* out = d.Up(Random(N * C, 7));
        d->EmbeddingForward(out, d.Up(RandomIds(N, static_cast<int32_t>(V), 8)), d.Up(Random(V * C, 9)),
                            N, C, acc);
        return Outputs{{"out", d.Get(out, N * C)}};
      });
    }
    Add(&c, Op::kEmbeddingBackward, Dims({N, C, V}), kReduce, [=](Dev& d) {
      float* dtable = d.Up(Random(V * C, 10));
      d->EmbeddingBackward(dtable, d.Up(Random(N * C, 11)),
                           d.Up(RandomIds(N, static_cast<int32_t>(V), 12)), N, C);
      return Outputs{{"dtable", d.Get(dtable, V * C)}};
    });
  }
  // ---- bias, add, scale ----
  for (auto [N, OC] : {std::pair<int64_t, int64_t>{7, 33}, {130, 64}, {1, 1}}) {
    Add(&c, Op::kAddBias, Dims({N, OC}), kElem, [=](Dev& d) {
      float* out = d.Up(Random(N * OC, 13));
      d->AddBias(out, d.Up(Random(OC, 14)), N, OC);
      return Outputs{{"out", d.Get(out, N * OC)}};
    });
    Add(&c, Op::kBiasBackward, Dims({N, OC}), kReduce, [=](Dev& d) {
      float* db = d.Up(Random(OC, 15));
      d->BiasBackward(db, d.Up(Random(N * OC, 16)), N, OC);
      return Outputs{{"dbias", d.Get(db, OC)}};
    });
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      // GELU's backward in place with the bias gradient (and, 16-bit, the rounded gradient).
      Add(&c, Op::kGeluBackwardBias, Dims({N, OC}) + " " + DTypeName(t), kReduce, [=](Dev& d) {
        float* g = d.Up(Random(N * OC, 17));
        float* db = d.Up(Random(OC, 18));
        auto* d16 = t == DType::kF32 ? nullptr : d.Zeros<uint16_t>(N * OC);
        d->GeluBackwardBias(g, d.Up(Random(N * OC, 19, -6, 6)), g, db, N, OC, d16, t);
        Outputs out{{"dbias", d.Get(db, OC)}};
        // 16-bit: dinp is scratch (unspecified afterwards); the rounded gradient is the output.
        if (d16 == nullptr) out.push_back({"dinp", d.Get(g, N * OC)});
        if (d16 != nullptr) out.push_back({"dinp16", Widen16(d.Get(d16, N * OC), t)});
        return out;
      });
    }
    for (DType t : {DType::kBF16, DType::kF16}) {
      Add(&c, Op::kBiasBackwardRounded, Dims({N, OC}) + " " + DTypeName(t), kReduce, [=](Dev& d) {
        float* db = d.Up(Random(OC, 15));
        auto* d16 = d.Zeros<uint16_t>(N * OC);
        d->BiasBackwardRounded(db, d.Up(Random(N * OC, 16)), N, OC, d16, t);
        // The rounding of the same dout: within kReduce means the same codes (one step of a
        // 16-bit value is 2^-8 or 2^-11 relative).
        return Outputs{{"dbias", d.Get(db, OC)}, {"dout16", Widen16(d.Get(d16, N * OC), t)}};
      });
    }
    Add(&c, Op::kScaleRows, Dims({N, OC}), kElem, [=](Dev& d) {
      float* x = d.Up(Random(N * OC, 150));
      d->ScaleRows(x, d.Up(Random(N, 151)), N, OC);
      return Outputs{{"out", d.Get(x, N * OC)}};
    });
    Add(&c, Op::kRowDot, Dims({N, OC}), kReduce, [=](Dev& d) {
      float* out = d.Up(Random(N, 152));
      d->RowDot(out, d.Up(Random(N * OC, 153)), d.Up(Random(N * OC, 154)), N, OC);
      return Outputs{{"out", d.Get(out, N)}};
    });
  }
  for (int64_t n : {1, 1000, 70001}) {
    Add(&c, Op::kAdd, Dims({n}) + " aliasing a", kElem, [=](Dev& d) {
      float* a = d.Up(Random(n, 17));
      d->Add(a, a, d.Up(Random(n, 18)), n);
      return Outputs{{"out", d.Get(a, n)}};
    });
    Add(&c, Op::kScale, Dims({n}), kElem, [=](Dev& d) {
      float* x = d.Up(Random(n, 19));
      d->Scale(x, -1.25f, n);
      return Outputs{{"x", d.Get(x, n)}};
    });
    const double sq[2] = {0.0, 1e-10};
    Add(&c, Op::kSumSquares, Dims({n}), sq, [=](Dev& d) {
      return Outputs{{"sum", {d->SumSquares(d.Up(Random(n, 20)), n)}}};
    });
    Add(&c, Op::kAccumulateSumSquares, Dims({n}), sq, [=](Dev& d) {
      double* acc = d.Up(std::vector<double>{0.5});
      d->AccumulateSumSquares(acc, d.Up(Random(n, 21)), n);
      d->AccumulateSumSquares(acc, d.Up(Random(n, 22)), n);
      return Outputs{{"acc", d.Get(acc, 1)}};
    });
    Add(&c, Op::kAccumulateSum, Dims({n}), sq, [=](Dev& d) {
      double* acc = d.Up(std::vector<double>{-2.0});
      d->AccumulateSum(acc, d.Up(Random(n, 23)), n, d.Up(std::vector<float>{0.25f}));
      return Outputs{{"acc", d.Get(acc, 1)}};
    });
    for (int where : {-1, 0, static_cast<int>(n - 1)}) {  // -1: all finite
      for (float bad : {NAN, INFINITY}) {
        if (where < 0 && std::isinf(bad)) continue;
        const double exact[2] = {0.0, 0.0};
        Add(&c, Op::kHasNonFinite, Dims({n}) + " at " + std::to_string(where) + " " + std::to_string(bad),
            exact, [=](Dev& d) {
              auto x = Random(n, 24);
              if (where >= 0) x[static_cast<size_t>(where)] = bad;
              return Outputs{{"flag", {d->HasNonFinite(d.Up(x), n) ? 1.0 : 0.0}}};
            });
      }
    }
  }
  // ---- QLoRA's 4-bit base: rows of a dequantized weight, exact (bitsandbytes' bits) ----
  // 37 x 71 (odd n; blocks of 64 cross row ends), rows [5, 33) into a scratch of row stride 80;
  // NF4 and FP4, with and without double quantization, each output type; zeros and a huge
  // outlier in the weight.
  for (Quant4Type qt : {Quant4Type::kNF4, Quant4Type::kFP4}) {
    for (bool nested : {false, true}) {
      for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
        const double exact[2] = {0.0, 0.0};
        Add(&c, Op::kDequantize4bit,
            std::string(Quant4TypeName(qt)) + (nested ? " nested" : "") + " 37x71 rows 5..33 ->" +
                DTypeName(to),
            exact, [=](Dev& d) {
              constexpr int64_t rows = 37, cols = 71, r0 = 5, r1 = 33, ld = 80;
              auto w = Random(rows * cols, 27, -0.5f, 0.5f);
              for (int64_t i = 128; i < 192; ++i) w[static_cast<size_t>(i)] = 0.0f;  // a zero block
              w[300] = 1e4f;
              const cpu::Quant4Host h = cpu::Quantize4bitHost(w.data(), DType::kF32, rows * cols, qt, nested, 1);
              Quant4View q;
              q.type = qt;
              q.n = h.n;
              q.codes = d.Up(h.codes);
              if (nested) {
                q.qabsmax = d.Up(h.qabsmax);
                q.nested_absmax = d.Up(h.nested_absmax);
                const float* code = h.View().nested_code;
                q.nested_code = d.Up(std::vector<float>(code, code + 256));
                q.offset = h.offset;
              } else {
                q.absmax = d.Up(h.absmax);
              }
              const size_t n_out = static_cast<size_t>((r1 - r0) * ld);
              void* out = to == DType::kF32 ? static_cast<void*>(d.Zeros<float>(n_out))
                                            : static_cast<void*>(d.Zeros<uint16_t>(n_out));
              d->Dequantize4bit(q, cols, r0, r1, out, ld, to);
              return Outputs{{"out", to == DType::kF32 ? d.Get(static_cast<float*>(out), n_out)
                                                       : d.Get(static_cast<uint16_t*>(out), n_out)}};
            });
      }
    }
  }
  // ---- casts: every pair, exact (round to nearest even), specials included ----
  for (DType from : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16}) {
      const double exact[2] = {0.0, 0.0};
      Add(&c, Op::kCast, std::string(DTypeName(from)) + "->" + DTypeName(to), exact, [=](Dev& d) {
        auto x = Random(5003, 25, -70000.0f, 70000.0f);
        const auto small = Random(1000, 26, -1e-6f, 1e-6f);
        std::copy(small.begin(), small.end(), x.begin());
        x[1000] = NAN;
        x[1001] = INFINITY;
        x[1002] = -0.0f;
        const int64_t n = static_cast<int64_t>(x.size());
        const void* src = from == DType::kF32 ? static_cast<const void*>(d.Up(x))
                                              : static_cast<const void*>(d.Up(To16(x, from)));
        void* dst = to == DType::kF32 ? static_cast<void*>(d.Zeros<float>(n))
                                      : static_cast<void*>(d.Zeros<uint16_t>(n));
        d->Cast(dst, to, src, from, n);
        // Bit patterns, exactly; every NaN as one NaN (payloads may differ: CUDA's canonical NaN
        // is 0x7FFF where the CPU keeps the input's quieted payload).
        std::vector<double> bits(n);
        if (to != DType::kF32) {
          const std::vector<double> codes = d.Get(static_cast<uint16_t*>(dst), n);
          const uint32_t inf = to == DType::kBF16 ? 0x7F80u : 0x7C00u;
          for (int64_t i = 0; i < n; ++i) {
            const uint32_t c = static_cast<uint32_t>(codes[i]);
            bits[i] = (c & 0x7FFFu) > inf ? std::nan("") : codes[i];
          }
          return Outputs{{"codes", bits}};
        }
        std::vector<float> f(n);
        d->CopyDeviceToHost(f.data(), dst, n * 4);
        for (int64_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, &f[i], 4);
          bits[i] = std::isnan(f[i]) ? std::nan("") : u;
        }
        return Outputs{{"bits", bits}};
      });
    }
  }
  // ---- dropout (LoRA): the mask is a hash of (key, stream, index), so the outputs are exact ----
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (auto [n, p, acc] : {std::tuple<int64_t, float, bool>{1, 0.5f, false}, {70001, 0.1f, false},
                             {4099, 0.3f, true}, {1000, 0.0f, false}}) {
      if (acc && t != DType::kF32) continue;
      const double exact[2] = {0.0, 0.0};
      Add(&c, Op::kDropout, Dims({n}) + " " + DTypeName(t) + " p " + std::to_string(p) +
          (acc ? " accumulate" : ""), exact, [=](Dev& d) {
            const auto x = Random(n, 200);
            const void* I = t == DType::kF32 ? static_cast<const void*>(d.Up(x))
                                             : static_cast<const void*>(d.Up(To16(x, t)));
            float* out = d.Up(Random(n, 201));
            const uint64_t* key = d.Up(std::vector<uint64_t>{0x123456789abcdefull + n});
            d->Dropout(out, I, t, n, p, key, /*stream=*/7, acc);
            return Outputs{{"out", d.Get(out, n)}};
          });
    }
  }
  // ---- norms ----
  for (auto [N, C] : {std::pair<int64_t, int64_t>{7, 33}, {64, 768}, {3, 1}}) {
    Add(&c, Op::kLayerNormForward, Dims({N, C}), kReduce, [=](Dev& d) {
      float *out = d.Zeros(N * C), *mean = d.Zeros(N), *rstd = d.Zeros(N);
      d->LayerNormForward(out, mean, rstd, d.Up(Random(N * C, 27, -2, 3)), d.Up(Random(C, 28)),
                          d.Up(Random(C, 29)), N, C, 1e-5f);
      return Outputs{{"out", d.Get(out, N * C)}, {"mean", d.Get(mean, N)}, {"rstd", d.Get(rstd, N)}};
    });
    for (DType t : {DType::kBF16, DType::kF16}) {
      // The output rounded to 16 bits (a flip of the last bit between backends is within the
      // 16-bit step, so compared widened at that step); the statistics as LayerNormForward's.
      const double tol16[2] = {4e-3, 4e-3};
      Add(&c, Op::kLayerNormForwardRounded, Dims({N, C}) + " " + DTypeName(t), tol16, [=](Dev& d) {
        float *mean = d.Zeros(N), *rstd = d.Zeros(N);
        auto* out = d.Zeros<uint16_t>(N * C);
        d->LayerNormForwardRounded(out, t, d.Zeros(N * C), mean, rstd,
                                   d.Up(Random(N * C, 27, -2, 3)), d.Up(Random(C, 28)),
                                   d.Up(Random(C, 29)), N, C, 1e-5f);
        return Outputs{{"out", Widen16(d.Get(out, N * C), t)},
                       {"mean", d.Get(mean, N)},
                       {"rstd", d.Get(rstd, N)}};
      });
      Add(&c, Op::kRmsNormForwardRounded, Dims({N, C}) + " " + DTypeName(t), tol16, [=](Dev& d) {
        float* rstd = d.Zeros(N);
        auto* out = d.Zeros<uint16_t>(N * C);
        d->RmsNormForwardRounded(out, t, d.Zeros(N * C), rstd, d.Up(Random(N * C, 37, -2, 3)),
                                 d.Up(Random(C, 38)), N, C, 1e-6f);
        return Outputs{{"out", Widen16(d.Get(out, N * C), t)}, {"rstd", d.Get(rstd, N)}};
      });
    }
    // The residual add and the norm after it (LayerNorm / RMSNorm, fp32 or rounded out).
    for (bool rms : {false, true}) {
      for (DType t : {DType::kF32, DType::kBF16}) {
        static constexpr double kTol16[2] = {4e-3, 4e-3};
        const bool f32 = t == DType::kF32;
        Add(&c, Op::kResidualNormForward,
            Dims({N, C}) + (rms ? " rms " : " layernorm ") + DTypeName(t), f32 ? kReduce : kTol16,
            [=](Dev& d) {
              float *res = d.Zeros(N * C), *mean = d.Zeros(N), *rstd = d.Zeros(N);
              float* out32 = f32 ? d.Zeros(N * C) : nullptr;
              uint16_t* out16 = f32 ? nullptr : d.Zeros<uint16_t>(N * C);
              d->ResidualNormForward(res, f32 ? static_cast<void*>(out32) : out16, t,
                                     d.Zeros(N * C), mean, rstd, d.Up(Random(N * C, 201, -2, 3)),
                                     d.Up(Random(N * C, 202)), d.Up(Random(C, 28)),
                                     d.Up(Random(C, 29)), N, C, 1e-5f, rms);
              Outputs o{{"res", d.Get(res, N * C)}, {"rstd", d.Get(rstd, N)}};
              o.push_back({"out", f32 ? d.Get(out32, N * C) : Widen16(d.Get(out16, N * C), t)});
              if (!rms) o.push_back({"mean", d.Get(mean, N)});
              return o;
            });
      }
    }
    Add(&c, Op::kLayerNormBackward, Dims({N, C}), kReduce, [=](Dev& d) {
      const auto inp = Random(N * C, 30, -2, 3), w = Random(C, 31), b = Random(C, 32);
      float *out = d.Zeros(N * C), *mean = d.Zeros(N), *rstd = d.Zeros(N);
      float *I = d.Up(inp), *W = d.Up(w);
      d->LayerNormForward(out, mean, rstd, I, W, d.Up(b), N, C, 1e-5f);  // this backend's statistics
      float *dinp = d.Up(Random(N * C, 33)), *dw = d.Up(Random(C, 34)), *db = d.Up(Random(C, 35));
      d->LayerNormBackward(dinp, dw, db, d.Up(Random(N * C, 36)), I, W, mean, rstd, N, C);
      return Outputs{{"dinp", d.Get(dinp, N * C)}, {"dweight", d.Get(dw, C)}, {"dbias", d.Get(db, C)}};
    });
    Add(&c, Op::kRmsNormForward, Dims({N, C}), kReduce, [=](Dev& d) {
      float *out = d.Zeros(N * C), *rstd = d.Zeros(N);
      d->RmsNormForward(out, rstd, d.Up(Random(N * C, 37, -2, 3)), d.Up(Random(C, 38)), N, C, 1e-6f);
      return Outputs{{"out", d.Get(out, N * C)}, {"rstd", d.Get(rstd, N)}};
    });
    Add(&c, Op::kRmsNormBackward, Dims({N, C}), kReduce, [=](Dev& d) {
      float *out = d.Zeros(N * C), *rstd = d.Zeros(N);
      float *I = d.Up(Random(N * C, 39, -2, 3)), *W = d.Up(Random(C, 40));
      d->RmsNormForward(out, rstd, I, W, N, C, 1e-6f);
      float *dinp = d.Up(Random(N * C, 41)), *dw = d.Up(Random(C, 42));
      d->RmsNormBackward(dinp, dw, d.Up(Random(N * C, 43)), I, W, rstd, N, C);
      return Outputs{{"dinp", d.Get(dinp, N * C)}, {"dweight", d.Get(dw, C)}};
    });
  }
  // Per-head RMSNorm over a strided fused row (qwen3's q or k heads of a qkv row): the columns
  // past the heads must come back untouched.
  for (auto [N, NH, HS] : {std::tuple<int64_t, int64_t, int64_t>{7, 3, 8}, {33, 2, 64}, {1, 1, 1}}) {
    const int64_t stride = NH * HS + 5;
    Add(&c, Op::kHeadRmsNormForward, Dims({N, NH, HS}), kReduce, [=](Dev& d) {
      float *x = d.Up(Random(N * stride, 151, -2, 3)), *saved = d.Zeros(N * NH * HS);
      float* rstd = d.Zeros(N * NH);
      d->HeadRmsNormForward(x, saved, rstd, d.Up(Random(HS, 152)), N, NH, HS, stride, 1e-6f);
      return Outputs{{"x", d.Get(x, N * stride)}, {"saved", d.Get(saved, N * NH * HS)},
                     {"rstd", d.Get(rstd, N * NH)}};
    });
    Add(&c, Op::kHeadRmsNormBackward, Dims({N, NH, HS}), kReduce, [=](Dev& d) {
      float *x = d.Up(Random(N * stride, 153, -2, 3)), *saved = d.Zeros(N * NH * HS);
      float *rstd = d.Zeros(N * NH), *W = d.Up(Random(HS, 154));
      d->HeadRmsNormForward(x, saved, rstd, W, N, NH, HS, stride, 1e-6f);
      float *dx = d.Up(Random(N * stride, 155)), *dw = d.Up(Random(HS, 156));
      d->HeadRmsNormBackward(dx, dw, saved, W, rstd, N, NH, HS, stride);
      return Outputs{{"dx", d.Get(dx, N * stride)}, {"dweight", d.Get(dw, HS)}};
    });
  }
  // ---- activations ----
  for (int64_t n : {1, 1001, 65536 + 7}) {
    Add(&c, Op::kGeluForward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* x = d.Up(Random(n, 44, -6, 6));
      d->GeluForward(x, x, n);
      return Outputs{{"out", d.Get(x, n)}};
    });
    Add(&c, Op::kGeluBackward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* g = d.Up(Random(n, 45));
      d->GeluBackward(g, d.Up(Random(n, 46, -6, 6)), g, n);
      return Outputs{{"dinp", d.Get(g, n)}};
    });
    Add(&c, Op::kGeluErfForward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* x = d.Up(Random(n, 144, -8, 8));
      d->GeluErfForward(x, x, n);
      return Outputs{{"out", d.Get(x, n)}};
    });
    Add(&c, Op::kGeluErfBackward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* g = d.Up(Random(n, 145));
      d->GeluErfBackward(g, d.Up(Random(n, 146, -8, 8)), g, n);
      return Outputs{{"dinp", d.Get(g, n)}};
    });
    Add(&c, Op::kTanhForward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* x = d.Up(Random(n, 147, -6, 6));
      d->TanhForward(x, x, n);
      return Outputs{{"out", d.Get(x, n)}};
    });
    Add(&c, Op::kTanhBackward, Dims({n}) + " in place", kElem, [=](Dev& d) {
      float* g = d.Up(Random(n, 148));
      d->TanhBackward(g, d.Up(Random(n, 149, -1, 1)), g, n);
      return Outputs{{"dinp", d.Get(g, n)}};
    });
  }
  for (auto [N, H] : {std::pair<int64_t, int64_t>{5, 37}, {64, 172}, {1, 1}}) {
    Add(&c, Op::kSwiGluForward, Dims({N, H}), kElem, [=](Dev& d) {
      float* out = d.Zeros(N * H);
      d->SwiGluForward(out, d.Up(Random(N * 2 * H, 47, -5, 5)), N, H);
      return Outputs{{"out", d.Get(out, N * H)}};
    });
    Add(&c, Op::kSwiGluBackward, Dims({N, H}), kElem, [=](Dev& d) {
      float* dinp = d.Zeros(N * 2 * H);
      d->SwiGluBackward(dinp, d.Up(Random(N * 2 * H, 48, -5, 5)), d.Up(Random(N * H, 49)), N, H);
      return Outputs{{"dinp", d.Get(dinp, N * 2 * H)}};
    });
    Add(&c, Op::kGeGluForward, Dims({N, H}), kElem, [=](Dev& d) {
      float* out = d.Zeros(N * H);
      d->GeGluForward(out, d.Up(Random(N * 2 * H, 157, -6, 6)), N, H);
      return Outputs{{"out", d.Get(out, N * H)}};
    });
    Add(&c, Op::kGeGluBackward, Dims({N, H}), kElem, [=](Dev& d) {
      float* dinp = d.Zeros(N * 2 * H);
      d->GeGluBackward(dinp, d.Up(Random(N * 2 * H, 158, -6, 6)), d.Up(Random(N * H, 159)), N, H);
      return Outputs{{"dinp", d.Get(dinp, N * 2 * H)}};
    });
    // 16-bit outputs: compared after widening, at bf16/f16's relative step (as
    // LinearForwardRoundedAct's activation).
    for (DType t : {DType::kBF16, DType::kF16}) {
      const double tol16[2] = {4e-3, 4e-3};
      Add(&c, Op::kSwiGluForwardRounded, Dims({N, H}) + " " + DTypeName(t), tol16, [=](Dev& d) {
        auto* out = d.Zeros<uint16_t>(N * H);
        d->SwiGluForwardRounded(out, t, d.Zeros(N * H), d.Up(Random(N * 2 * H, 47, -5, 5)), N, H);
        return Outputs{{"out", Widen16(d.Get(out, N * H), t)}};
      });
      Add(&c, Op::kSwiGluBackwardRounded, Dims({N, H}) + " " + DTypeName(t), tol16, [=](Dev& d) {
        float* dinp = d.Zeros(N * 2 * H);
        auto* d16 = d.Zeros<uint16_t>(N * 2 * H);
        d->SwiGluBackwardRounded(dinp, d16, t, d.Up(Random(N * 2 * H, 48, -5, 5)),
                                 d.Up(Random(N * H, 49)), N, H);
        // dinp is the op's scratch (unspecified afterwards): only the rounded gradient counts.
        return Outputs{{"dinp16", Widen16(d.Get(d16, N * 2 * H), t)}};
      });
    }
  }
  // ---- rotary embedding: a strided fused row, forward and inverse ----
  for (auto [B, T, NH, HS] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 13, 3, 8}, {1, 70, 2, 64}}) {
    for (bool inverse : {false, true}) {
      Add(&c, Op::kRope, Dims({B, T, NH, HS}) + (inverse ? " inverse" : ""), kElem, [=](Dev& d) {
        const int64_t stride = NH * HS + 5;
        float* x = d.Up(Random(B * T * stride, 50));
        d->Rope(x, B, T, NH, HS, stride, 10000.0f, inverse);
        return Outputs{{"x", d.Get(x, B * T * stride)}};
      });
    }
  }
  // Decoding rows at positions 37.. (the rows after a cached prefix).
  Add(&c, Op::kRope, "pos_offset 37 " + Dims({1, 3, 4, 16}), kElem, [=](Dev& d) {
    const int64_t stride = 4 * 16 * 3;
    float* x = d.Up(Random(3 * stride, 50));
    d->Rope(x, 1, 3, 4, 16, stride, 500000.0f, false, 37);
    return Outputs{{"x", d.Get(x, 3 * stride)}};
  });
  // HF rope_scaling: Llama 3.1's llama3 (an original context of 64 puts HS 16's frequencies in
  // every regime) and linear, forward and inverse, after a cached prefix.
  for (int32_t kind : {int32_t{RopeScaling::kLlama3}, int32_t{RopeScaling::kLinear}}) {
    for (bool inverse : {false, true}) {
      RopeScaling sc;
      sc.kind = kind;
      sc.factor = kind == RopeScaling::kLlama3 ? 8.0f : 2.5f;
      sc.original_max_positions = 64.0f;
      Add(&c, Op::kRope,
          std::string(kind == RopeScaling::kLlama3 ? "llama3 " : "linear ") + Dims({2, 9, 3, 16}) +
              (inverse ? " inverse" : ""),
          kElem, [=](Dev& d) {
            const int64_t stride = 3 * 16 + 3;
            float* x = d.Up(Random(2 * 9 * stride, 51));
            d->Rope(x, 2, 9, 3, 16, stride, 500000.0f, inverse, 11, sc);
            return Outputs{{"x", d.Get(x, 2 * 9 * stride)}};
          });
    }
  }
  // ---- attention: GQA, fused qkv rows and separate strided ones; causal or not, key masks
  // (random with a fully masked sequence and key 0 masked, or padded tails), sliding windows ----
  struct AttnCase {
    int64_t B, T, NH, NKV, HS;
    bool fused;
    bool causal = true;
    int mask = 0;  // 0: none; 1: random, sequence 1 empty, key 0 masked; 2: padded tails
    int64_t window = 0;  // sliding window (HF Mistral), 0: none
  };
  for (const AttnCase a : {AttnCase{2, 37, 4, 2, 16, true}, AttnCase{1, 70, 2, 1, 40, false},
                           AttnCase{1, 5, 1, 1, 160, false}, AttnCase{1, 1, 3, 3, 8, true},
                           AttnCase{1, 130, 4, 1, 64, true}, AttnCase{1, 75, 4, 2, 128, true},
                           AttnCase{2, 33, 2, 1, 100, false},
                           // Not causal, with and without masks, every kernel family (HS 16:
                           // 1 lane per row, 40/64: 2, 128: 4, 160/200: one thread per row).
                           AttnCase{2, 37, 4, 2, 16, true, false, 1},
                           AttnCase{2, 70, 2, 1, 40, false, false, 2},
                           AttnCase{1, 130, 4, 1, 64, true, false, 0},
                           AttnCase{3, 75, 4, 2, 128, true, false, 1},
                           AttnCase{2, 5, 1, 1, 160, false, false, 1},
                           AttnCase{1, 20, 2, 2, 200, false, false, 0},
                           // Causal with masks (the first query of sequence 0 sees no key).
                           AttnCase{2, 75, 4, 2, 128, true, true, 2},
                           AttnCase{2, 33, 2, 1, 100, false, true, 1},
                           AttnCase{3, 66, 2, 1, 16, true, true, 1},
                           AttnCase{2, 9, 2, 1, 160, false, true, 2},
                           // Sliding windows, every kernel family: window 1 (the diagonal only),
                           // under a 32/64-row tile, across tiles (the first key tiles skipped),
                           // T - 1, over T; with masks (a window of masked keys sees nothing)
                           // and bidirectional (the window bounds the past).
                           AttnCase{2, 37, 4, 2, 16, true, true, 0, 1},
                           AttnCase{2, 150, 4, 2, 16, true, true, 1, 20},
                           AttnCase{1, 200, 2, 1, 40, false, true, 0, 70},
                           AttnCase{2, 70, 2, 1, 64, false, true, 2, 5},
                           AttnCase{1, 130, 4, 1, 64, true, true, 0, 129},
                           AttnCase{2, 75, 4, 2, 128, true, true, 1, 33},
                           AttnCase{1, 140, 4, 2, 128, false, true, 0, 100},
                           AttnCase{2, 100, 2, 1, 160, false, true, 2, 17},
                           AttnCase{1, 70, 2, 2, 200, false, true, 0, 1},
                           AttnCase{2, 37, 4, 2, 16, true, false, 1, 6},
                           AttnCase{1, 150, 2, 1, 128, false, false, 0, 40},
                           AttnCase{1, 20, 2, 2, 200, false, false, 0, 50}}) {
    const std::string label = Dims({a.B, a.T, a.NH, a.NKV, a.HS}) + (a.fused ? " fused" : "") +
                              AttnModeLabel(a.causal, a.mask, a.window);
    const std::vector<int32_t> mask = AttnMask(a.B, a.T, a.mask, 70 + a.T);
    const int64_t rows = a.B * a.T;
    const int64_t qs = a.fused ? (a.NH + 2 * a.NKV) * a.HS : a.NH * a.HS + 3;  // +3: a gap
    const int64_t kvs = a.fused ? qs : a.NKV * a.HS + 5;
    const int64_t koff = a.fused ? a.NH * a.HS : 0, voff = a.fused ? (a.NH + a.NKV) * a.HS : 0;
    auto forward = [=](Dev& d, float** q, const float** k, const float** v, float** out, float** lse) {
      *q = d.Up(Random(rows * qs, 51));
      float* kb = a.fused ? *q : d.Up(Random(rows * kvs, 52));
      float* vb = a.fused ? *q : d.Up(Random(rows * kvs, 53));
      *k = kb + koff;
      *v = vb + voff;
      *out = d.Zeros(rows * a.NH * a.HS);
      *lse = d.Zeros(a.B * a.NH * a.T);
      const int32_t* km = mask.empty() ? nullptr : d.Up(mask);
      d->AttentionForward(*out, *lse, *q, *k, *v, a.B, a.T, a.NH, a.NKV, a.HS, qs, kvs, a.causal,
                          km, DType::kF32, a.window);
      return km;
    };
    Add(&c, Op::kAttentionForward, label, kAttn, [=](Dev& d) {
      float *q, *out, *lse;
      const float *k, *v;
      forward(d, &q, &k, &v, &out, &lse);
      return Outputs{{"out", d.Get(out, rows * a.NH * a.HS)}, {"lse", d.Get(lse, a.B * a.NH * a.T)}};
    });
    Add(&c, Op::kAttentionBackward, label, kAttn, [=](Dev& d) {
      float *q, *out, *lse;
      const float *k, *v;
      const int32_t* km = forward(d, &q, &k, &v, &out, &lse);
      // Sentinels: parts of a row outside the heads must stay untouched.
      float* dq = d.Up(std::vector<float>(rows * qs, 7.0f));
      float* dk = a.fused ? dq + koff : d.Up(std::vector<float>(rows * kvs, 7.0f));
      float* dv = a.fused ? dq + voff : d.Up(std::vector<float>(rows * kvs, 7.0f));
      d->AttentionBackward(dq, dk, dv, d.Up(Random(rows * a.NH * a.HS, 54)), out, lse, q, k, v, a.B,
                           a.T, a.NH, a.NKV, a.HS, qs, kvs, a.causal, km, DType::kF32, a.window);
      Outputs o{{"dq", d.Get(dq, rows * qs)}};
      if (!a.fused) o.push_back({"dk", d.Get(dk, rows * kvs)}), o.push_back({"dv", d.Get(dv, rows * kvs)});
      return o;
    });
  }
  // ---- attention on 16-bit tensors (bf16/fp16 jobs): fused qkv rows and separate ones (strides a
  // multiple of 8: simt/CUDA's tensor-core kernel for head sizes 64..256; a gap of 3, or head size
  // 40: the fp32 kernel on widened tensors), GQA, masks, windows, T not a multiple of any tile.
  // out is 16-bit (compared widened); dq, dk, dv fp32 with sentinels outside the heads. Against the
  // CPU's products on the same 16-bit values: the tensor-core kernel also rounds P and dS (as
  // attention_tc_test bounds), and out is rounded, so about two steps of the type (bf16 2^-8,
  // fp16 2^-11) per element (measured on simt: bf16 out 3.9e-3, dq 3.7e-3; fp16 4.9e-4, 4.7e-4;
  // the widened fp32 path within 2.5e-4).
  struct Attn16Case {
    int64_t B, T, NH, NKV, HS;
    int layout;  // 0: fused qkv rows; 1: separate, stride + 8; 2: separate, stride + 3
    bool causal = true;
    int mask = 0;  // as AttnCase
    int64_t window = 0;
  };
  for (DType t : {DType::kBF16, DType::kF16}) {
    const double tol16[2] = {t == DType::kBF16 ? 8e-3 : 1e-3, t == DType::kBF16 ? 8e-3 : 1e-3};
    for (const Attn16Case a : {Attn16Case{2, 37, 4, 2, 64, 0}, Attn16Case{1, 75, 2, 1, 128, 1, false, 1},
                               Attn16Case{2, 70, 2, 1, 40, 2, true, 2},
                               Attn16Case{1, 130, 4, 2, 64, 0, true, 0, 33},
                               Attn16Case{2, 21, 2, 2, 80, 0, true, 2},
                               Attn16Case{1, 40, 2, 1, 64, 2, true, 1}}) {
      const std::string label = Dims({a.B, a.T, a.NH, a.NKV, a.HS}) + " " + DTypeName(t) +
                                (a.layout == 0 ? " fused" : a.layout == 1 ? " strided" : " gap") +
                                AttnModeLabel(a.causal, a.mask, a.window);
      const std::vector<int32_t> mask = AttnMask(a.B, a.T, a.mask, 90 + a.T);
      const int64_t rows = a.B * a.T, QW = a.NH * a.HS, KW = a.NKV * a.HS;
      const int64_t gap = a.layout == 1 ? 8 : 3;
      const int64_t qs = a.layout == 0 ? QW + 2 * KW : QW + gap;
      const int64_t kvs = a.layout == 0 ? qs : KW + gap;
      const int64_t koff = a.layout == 0 ? QW : 0, voff = a.layout == 0 ? QW + KW : 0;
      auto forward = [=](Dev& d, const uint16_t** q, const uint16_t** k, const uint16_t** v,
                         uint16_t** out, float** lse) {
        *q = d.Up(To16(Random(rows * qs, 81), t));
        const uint16_t* kb = a.layout == 0 ? *q : d.Up(To16(Random(rows * kvs, 82), t));
        const uint16_t* vb = a.layout == 0 ? *q : d.Up(To16(Random(rows * kvs, 83), t));
        *k = kb + koff;
        *v = vb + voff;
        *out = d.Zeros<uint16_t>(rows * QW);
        *lse = d.Zeros(a.B * a.NH * a.T);
        const int32_t* km = mask.empty() ? nullptr : d.Up(mask);
        d->AttentionForward16(*out, *lse, *q, *k, *v, t, a.B, a.T, a.NH, a.NKV, a.HS, qs, kvs,
                              a.causal, km, a.window);
        return km;
      };
      Add(&c, Op::kAttentionForward16, label, tol16, [=](Dev& d) {
        const uint16_t *q, *k, *v;
        uint16_t* out;
        float* lse;
        forward(d, &q, &k, &v, &out, &lse);
        return Outputs{{"out", Widen16(d.Get(out, rows * QW), t)},
                       {"lse", d.Get(lse, a.B * a.NH * a.T)}};
      });
      Add(&c, Op::kAttentionBackward16, label, tol16, [=](Dev& d) {
        const uint16_t *q, *k, *v;
        uint16_t* out;
        float* lse;
        const int32_t* km = forward(d, &q, &k, &v, &out, &lse);
        float* dq = d.Up(std::vector<float>(rows * qs, 7.0f));
        float* dk = a.layout == 0 ? dq + koff : d.Up(std::vector<float>(rows * kvs, 7.0f));
        float* dv = a.layout == 0 ? dq + voff : d.Up(std::vector<float>(rows * kvs, 7.0f));
        d->AttentionBackward16(dq, dk, dv, d.Up(To16(Random(rows * QW, 84), t)), out, lse, q, k, v,
                               t, a.B, a.T, a.NH, a.NKV, a.HS, qs, kvs, a.causal, km, a.window);
        Outputs o{{"dq", d.Get(dq, rows * qs)}};
        if (a.layout != 0) o.push_back({"dk", d.Get(dk, rows * kvs)}), o.push_back({"dv", d.Get(dv, rows * kvs)});
        return o;
      });
    }
  }
  // ---- attention of one new row per sequence against a cache (generation): GQA, k|v rows; sliding
  // windows (the last `window` rows) ----
  struct DecodeCase {
    int64_t B, T, cache_rows, NH, NKV, HS;
    int64_t window = 0;
  };
  for (const DecodeCase a : {DecodeCase{1, 1, 4, 2, 2, 8}, DecodeCase{2, 37, 40, 4, 2, 16},
                             DecodeCase{1, 300, 300, 3, 1, 64}, DecodeCase{3, 9, 64, 2, 1, 100},
                             DecodeCase{2, 37, 40, 4, 2, 16, 1},
                             DecodeCase{1, 300, 300, 3, 1, 64, 100},
                             DecodeCase{3, 9, 64, 2, 1, 100, 9},
                             DecodeCase{1, 5, 8, 2, 2, 8, 64}}) {
    Add(&c, Op::kAttentionDecode,
        Dims({a.B, a.T, a.cache_rows, a.NH, a.NKV, a.HS}) +
            (a.window > 0 ? " window " + std::to_string(a.window) : ""),
        kAttn, [=](Dev& d) {
          const int64_t qs = a.NH * a.HS + 3, kvs = 2 * a.NKV * a.HS;  // cache rows: [k | v]
          const float* q = d.Up(Random(a.B * qs, 61));
          const float* kv = d.Up(Random(a.B * a.cache_rows * kvs, 62));
          float* out = d.Zeros(a.B * a.NH * a.HS);
          d->AttentionDecode(out, q, kv, kv + a.NKV * a.HS, a.B, a.T, a.cache_rows, a.NH, a.NKV,
                             a.HS, qs, kvs, a.window);
          return Outputs{{"out", d.Get(out, a.B * a.NH * a.HS)}};
        });
  }
  // ---- softmax + cross-entropy (padded vocab, an ignored row, a device-side scale) ----
  for (auto [N, V, Vp] : {std::tuple<int64_t, int64_t, int64_t>{6, 37, 48}, {3, 1000, 1000}, {1, 1, 8}}) {
    for (int variant = 0; variant < 3; ++variant) {  // 0: loss only; 1: grad; 2: grad, device scale
      const double ce[2] = {1e-6, 1e-4};
      Add(&c, Op::kSoftmaxCrossEntropy, Dims({N, V, Vp}) + " variant " + std::to_string(variant), ce,
          [=](Dev& d) {
            float* logits = d.Up(Random(N * Vp, 55, -8, 8));
            auto targets = RandomIds(N, static_cast<int32_t>(V), 56);
            if (N > 1) targets[1] = -1;
            float* losses = d.Zeros(N);
            const float* scale = variant == 2 ? d.Up(std::vector<float>{0.125f}) : nullptr;
            d->SoftmaxCrossEntropy(logits, losses, d.Up(targets), N, V, Vp, 0.5f, variant > 0, scale);
            return Outputs{{"losses", d.Get(losses, N)}, {"logits", d.Get(logits, N * Vp)}};
          });
    }
  }
  // ---- AdamW, host scalars (3 steps) and device scalars (clip, loss scale, fp16 skip) ----
  for (int64_t n : {1, 1000, 5003}) {
    Add(&c, Op::kAdamW, Dims({n}) + " 3 steps", kElem, [=](Dev& d) {
      float *p = d.Up(Random(n, 57)), *g = d.Up(Random(n, 58)), *m = d.Up(Random(n, 59, -0.1f, 0.1f)),
            *v = d.Up(Random(n, 60, 0, 0.01f));
      for (int step = 1; step <= 3; ++step) {
        const float bc1 = 1.0f - std::pow(0.9f, step), bc2 = 1.0f - std::pow(0.999f, step);
        d->AdamW(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2, 0.5f);
      }
      return Outputs{{"param", d.Get(p, n)}, {"m", d.Get(m, n)}, {"v", d.Get(v, n)}};
    });
  }
  struct ScalarCase {
    float loss_scale, max_norm;
    bool overflow;
  };
  for (const ScalarCase s : {ScalarCase{1.0f, 1.0f, false}, ScalarCase{1.0f, 0.0f, false},
                             ScalarCase{1024.0f, 1e9f, false}, ScalarCase{1.0f, 1.0f, true}}) {
    const int64_t n = 3001;
    Add(&c, Op::kAdamWFromScalars,
        std::string("loss_scale ") + std::to_string(s.loss_scale) + " max_norm " + std::to_string(s.max_norm) +
            (s.overflow ? " overflow" : ""),
        kElem, [=](Dev& d) {
          const auto grad = Random(n, 61);
          StepScalars sc;
          for (float x : grad) sc.grad_sq += double{x} * x;
          if (s.overflow) sc.grad_sq = INFINITY;
          sc.lr = 1e-3f;
          sc.bias_correction1 = 0.1f;
          sc.bias_correction2 = 0.001f;
          sc.loss_scale = s.loss_scale;
          sc.max_grad_norm = s.max_norm;
          sc.skip_nonfinite = 1;
          float *p = d.Up(Random(n, 62)), *m = d.Up(Random(n, 63, -0.1f, 0.1f)),
                *v = d.Up(Random(n, 64, 0, 0.01f));
          auto* dev_sc = static_cast<StepScalars*>(static_cast<void*>(d.Zeros<unsigned char>(sizeof(sc))));
          d->CopyHostToDevice(dev_sc, &sc, sizeof(sc));
          d->AdamWFromScalars(p, d.Up(grad), m, v, n, dev_sc, 0.9f, 0.999f, 1e-8f, 0.1f);
          return Outputs{{"param", d.Get(p, n)}, {"m", d.Get(m, n)}, {"v", d.Get(v, n)}};
        });
  }
  // Several runs at once (their own decay, one of 1 element, runs not in offset order).
  Add(&c, Op::kAdamWRunsFromScalars, "4 runs, max_norm 1", kElem, [=](Dev& d) {
    const int64_t n = 7001;
    const auto grad = Random(n, 160);
    StepScalars sc;
    for (float x : grad) sc.grad_sq += double{x} * x;
    sc.lr = 1e-3f;
    sc.bias_correction1 = 0.1f;
    sc.bias_correction2 = 0.001f;
    sc.max_grad_norm = 1.0f;
    float *p = d.Up(Random(n, 161)), *m = d.Up(Random(n, 162, -0.1f, 0.1f)),
          *v = d.Up(Random(n, 163, 0, 0.01f));
    auto* dev_sc = static_cast<StepScalars*>(static_cast<void*>(d.Zeros<unsigned char>(sizeof(sc))));
    d->CopyHostToDevice(dev_sc, &sc, sizeof(sc));
    const AdamWRun runs[] = {{5000, 2001, 0.0f}, {0, 1, 0.1f}, {1, 4095, 0.0f}, {4096, 904, 0.01f}};
    d->AdamWRunsFromScalars(p, d.Up(grad), m, v, runs, 4, dev_sc, 0.9f, 0.999f, 1e-8f);
    return Outputs{{"param", d.Get(p, n)}, {"m", d.Get(m, n)}, {"v", d.Get(v, n)}};
  });
  // ---- SGD, Adafactor, 8-bit AdamW (semantics: cpu/cpu_optim.h) ----
  for (int64_t n : {1, 1001, 70001}) {
    for (int cfg = 0; cfg < 3; ++cfg) {  // plain + decay; momentum + dampening; nesterov
      Add(&c, Op::kSgdUpdate, Dims({n}) + " cfg " + std::to_string(cfg) + " 2 steps", kElem,
          [=](Dev& d) {
            float *p = d.Up(Random(n, 65)), *g = d.Up(Random(n, 66)), *buf = d.Zeros(n);
            const float momentum = cfg == 0 ? 0.0f : 0.9f, damp = cfg == 1 ? 0.1f : 0.0f;
            for (int step = 0; step < 2; ++step) {
              d->SgdUpdate(p, g, buf, n, 0.05f, momentum, damp, 0.01f, cfg == 2, step == 0, 0.5f,
                           nullptr);
            }
            return Outputs{{"param", d.Get(p, n)}, {"buf", d.Get(buf, n)}};
          });
    }
  }
  for (auto [B, R, C] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 7, 13}, {3, 5, 33}, {1, 300, 257}}) {
    const int64_t n = B * R * C;
    Add(&c, Op::kAdafactorFactoredStats, Dims({B, R, C}), kReduce, [=](Dev& d) {
      float *row = d.Up(Random(B * R, 67, 0.1f, 0.3f)), *col = d.Up(Random(B * C, 68, 0.1f, 0.3f));
      double* row_sum = d.Zeros<double>(B);
      d->AdafactorFactoredStats(d.Up(Random(n, 69)), row, col, row_sum, B, R, C, 0.3f, 1e-30f,
                                0.75f);
      return Outputs{
          {"row", d.Get(row, B * R)}, {"col", d.Get(col, B * C)}, {"row_sum", d.Get(row_sum, B)}};
    });
    for (int with_m = 0; with_m < 2; ++with_m) {
      // The sums and the update of a factored tensor from given statistics.
      Add(&c, Op::kAdafactorUpdateSumSquares, Dims({B, R, C}) + " factored", kReduce, [=](Dev& d) {
        const auto row = Random(B * R, 70, 0.1f, 0.3f);
        std::vector<double> rs(B, 0.0);
        for (int64_t i = 0; i < B * R; ++i) rs[i / R] += row[i];
        double* acc = d.Zeros<double>(1);
        d->AdafactorUpdateSumSquares(acc, d.Up(Random(n, 71)), d.Up(row),
                                     d.Up(Random(B * C, 72, 0.1f, 0.3f)), d.Up(rs), nullptr, B, R,
                                     C, 0.75f);
        return Outputs{{"acc", d.Get(acc, 1)}};
      });
      Add(&c, Op::kAdafactorApply, Dims({B, R, C}) + (with_m ? " beta1" : ""), kElem, [=](Dev& d) {
        const auto row = Random(B * R, 73, 0.1f, 0.3f), p0 = Random(n, 74);
        std::vector<double> rs(B, 0.0), sums = {0.0, 0.7 * n};
        for (int64_t i = 0; i < B * R; ++i) rs[i / R] += row[i];
        for (float x : p0) sums[0] += double{x} * x;
        float *p = d.Up(p0), *m = with_m ? d.Up(Random(n, 75, -0.01f, 0.01f)) : nullptr;
        d->AdafactorApply(p, m, d.Up(Random(n, 76)), d.Up(row), d.Up(Random(B * C, 77, 0.1f, 0.3f)),
                          d.Up(rs), nullptr, d.Up(sums), B, R, C, 0.75f, 1e-2f, 1e-3f, true, 1.0f,
                          0.9f, 0.1f);
        Outputs o{{"param", d.Get(p, n)}};
        if (with_m) o.push_back({"m", d.Get(m, n)});
        return o;
      });
    }
  }
  for (int64_t n : {1, 1001, 70001}) {
    Add(&c, Op::kAdafactorSecondMoment, Dims({n}), kElem, [=](Dev& d) {
      float* v = d.Up(Random(n, 78, 0.1f, 0.3f));
      d->AdafactorSecondMoment(d.Up(Random(n, 79)), v, n, 0.3f, 1e-30f, 0.75f);
      return Outputs{{"v", d.Get(v, n)}};
    });
    Add(&c, Op::kAdafactorUpdateSumSquares, Dims({n}) + " unfactored", kReduce, [=](Dev& d) {
      double* acc = d.Zeros<double>(1);
      d->AdafactorUpdateSumSquares(acc, d.Up(Random(n, 80)), nullptr, nullptr, nullptr,
                                   d.Up(Random(n, 81, 0.1f, 0.3f)), 1, 1, n, 0.75f);
      return Outputs{{"acc", d.Get(acc, 1)}};
    });
    Add(&c, Op::kAdafactorApply, Dims({n}) + " unfactored", kElem, [=](Dev& d) {
      const auto p0 = Random(n, 82);
      std::vector<double> sums = {0.0, 2.0 * n};
      for (float x : p0) sums[0] += double{x} * x;
      float* p = d.Up(p0);
      d->AdafactorApply(p, nullptr, d.Up(Random(n, 83)), nullptr, nullptr, nullptr,
                        d.Up(Random(n, 84, 0.1f, 0.3f)), d.Up(sums), 1, 1, n, 0.75f, 1e-2f, 1e-3f,
                        false, 1.0f, 0.0f, 0.0f);
      return Outputs{{"param", d.Get(p, n)}};
    });
  }
  // 8-bit: codes must agree exactly (a code is a bucket: off by one is a different value).
  for (int64_t n : {1, 256, 4097, 70001}) {
    Add(&c, Op::kAdamW8bitBlockwise, Dims({n}) + " 3 steps", kElem, [=](Dev& d) {
      const int64_t blocks = (n + 255) / 256;
      const std::vector<float> code_m(DynamicCodeSigned(), DynamicCodeSigned() + 256);
      const std::vector<float> code_v(DynamicCodeUnsigned(), DynamicCodeUnsigned() + 256);
      float *p = d.Up(Random(n, 85)), *g = d.Up(Random(n, 86, -0.1f, 0.1f));
      uint8_t *mc = d.Zeros<uint8_t>(n), *vc = d.Zeros<uint8_t>(n);
      float *ma = d.Zeros(blocks), *va = d.Zeros(blocks);
      const float* tm = d.Up(code_m);
      const float* tv = d.Up(code_v);
      for (int step = 1; step <= 3; ++step) {
        const float bc1 = 1.0f - std::pow(0.9f, step), bc2 = 1.0f - std::pow(0.999f, step);
        d->AdamW8bitBlockwise(p, g, mc, vc, ma, va, tm, tv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f,
                              bc1, bc2, 1.0f, nullptr);
      }
      return Outputs{{"param", d.Get(p, n)},
                     {"m_codes", d.Get(mc, n)},
                     {"v_codes", d.Get(vc, n)},
                     {"m_absmax", d.Get(ma, blocks)},
                     {"v_absmax", d.Get(va, blocks)}};
    });
  }
  return c;
}

Outputs RunCase(Backend* be, const OpCase& c) {
  Dev d(be);
  Outputs o = c.run(d);
  be->Synchronize();
  return o;
}

// Compares `got` with `want` element by element; NaN matches NaN, infinities match themselves.
void ExpectClose(const Outputs& got, const Outputs& want, const OpCase& c, const std::string& device) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    const auto& g = got[t].second;
    const auto& w = want[t].second;
    ASSERT_EQ(g.size(), w.size()) << got[t].first;
    int bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const bool same = (std::isnan(g[i]) && std::isnan(w[i])) || g[i] == w[i];
      if (same || std::fabs(g[i] - w[i]) <= c.atol + c.rtol * std::fabs(w[i])) continue;
      if (++bad <= 3) {
        ADD_FAILURE() << device << " " << OpName(c.op) << " [" << c.label << "] " << got[t].first
                      << "[" << i << "] = " << g[i] << ", cpu reference " << w[i];
      }
    }
    EXPECT_EQ(bad, 0) << device << " " << OpName(c.op) << " [" << c.label << "] " << got[t].first
                      << ": " << bad << " of " << g.size() << " elements differ";
  }
}

TEST(BackendOps, EveryOpHasACase) {
  std::set<Op> covered;
  for (const OpCase& c : AllCases()) covered.insert(c.op);
  for (int i = 0; i < kOpCount; ++i) {
    EXPECT_TRUE(covered.count(static_cast<Op>(i)) > 0)
        << "op " << OpName(static_cast<Op>(i)) << " has no case in backend_ops_test.cc";
  }
}

class BackendOpsOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    reference_ = MakeCpuBackend(1);
    if (GetParam() == "cpu") {
      device_ = MakeCpuBackend(2);
    } else {
      auto made = testing::MakeDeviceUnderTest();
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      device_ = std::move(made).value();
    }
  }
  std::unique_ptr<Backend> reference_, device_;
};

TEST_P(BackendOpsOnDevice, EveryOpMatchesTheCpuReference) {
  int cases = 0;
  for (const OpCase& c : AllCases()) {
    ASSERT_TRUE(device_->Supports(c.op)) << device_->name() << " lacks " << OpName(c.op);
    const Outputs want = RunCase(reference_.get(), c);
    const Outputs got = RunCase(device_.get(), c);
    ASSERT_TRUE(device_->status().ok()) << OpName(c.op) << " [" << c.label << "]: "
                                        << device_->status().ToString();
    ExpectClose(got, want, c, device_->name());
    ++cases;
  }
  std::printf("%s: %d op cases over %d ops match the CPU reference\n", device_->name().c_str(),
              cases, kOpCount);
}

INSTANTIATE_TEST_SUITE_P(Devices, BackendOpsOnDevice,
                         ::testing::Values(std::string("cpu"), std::string(testing::kDeviceUnderTest)),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) ch = (ch == ':' ? '_' : ch);
                           return s;
                         });

// The strided device -> host copy (gpt2's transposed export) equals one CopyDeviceToHost per row:
// a block of columns out of every row of a matrix, into a tight and a padded host layout.
TEST_P(BackendOpsOnDevice, CopyDeviceToHost2DEqualsRowByRow) {
  const size_t rows = 37, cols = 53, c0 = 5, width = 17;
  std::vector<float> host(rows * cols);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 3.0f;
  void* dev = device_->Alloc(host.size() * sizeof(float));
  ASSERT_NE(dev, nullptr);
  device_->CopyHostToDevice(dev, host.data(), host.size() * sizeof(float));
  const float* src = static_cast<const float*>(dev) + c0;
  for (size_t pitch : {width, width + 3}) {
    const float sentinel = -77.0f;
    std::vector<float> want(rows * pitch, sentinel), got(rows * pitch, sentinel);
    for (size_t r = 0; r < rows; ++r) {
      device_->CopyDeviceToHost(want.data() + r * pitch, src + r * cols, width * sizeof(float));
    }
    device_->CopyDeviceToHost2D(got.data(), pitch * sizeof(float), src, cols * sizeof(float),
                                width * sizeof(float), rows);
    ASSERT_TRUE(device_->status().ok()) << device_->status().ToString();
    EXPECT_EQ(got, want) << device_->name() << " host pitch " << pitch;
    EXPECT_EQ(got[pitch * 2 + 1], host[2 * cols + c0 + 1]);  // the reference is the matrix's
    if (pitch > width) {
      EXPECT_EQ(got[width], sentinel) << "the padding was written";
    }
  }
  std::vector<float> untouched(4, 1.0f);
  device_->CopyDeviceToHost2D(untouched.data(), 8, src, cols * sizeof(float), 0, rows);
  device_->CopyDeviceToHost2D(untouched.data(), 8, src, cols * sizeof(float), 8, 0);
  EXPECT_EQ(untouched, std::vector<float>(4, 1.0f));
  device_->Free(dev);
}

// A backend that implements nothing but memory: Supports() says so, CheckSupports names the first
// missing op, and calling an op does nothing but record UNIMPLEMENTED.
class MemoryOnlyBackend final : public Backend {
 public:
  std::string name() const override { return "memory-only"; }
  void* Alloc(size_t bytes) override { return cpu_->Alloc(bytes); }
  void Free(void* p) override { cpu_->Free(p); }
  void CopyHostToDevice(void* d, const void* s, size_t n) override { cpu_->CopyHostToDevice(d, s, n); }
  void CopyDeviceToHost(void* d, const void* s, size_t n) override { cpu_->CopyDeviceToHost(d, s, n); }
  void CopyDeviceToDevice(void* d, const void* s, size_t n) override { cpu_->CopyDeviceToDevice(d, s, n); }
  void Memset0(void* d, size_t n) override { cpu_->Memset0(d, n); }
  void Synchronize() override {}

 private:
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend(1);
};

TEST(BackendOps, PartialBackendReportsWhatItLacks) {
  MemoryOnlyBackend be;
  for (int i = 0; i < kOpCount; ++i) EXPECT_FALSE(be.Supports(static_cast<Op>(i))) << OpName(static_cast<Op>(i));
  const Status s = CheckSupports(be, {Op::kRope});
  EXPECT_EQ(s.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("memory-only does not implement op Rope"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckSupports(*MakeCpuBackend(1), {Op::kRope, Op::kGemm}).ok());

  std::vector<float> x = {1.0f, 2.0f};
  be.Scale(x.data(), 3.0f, 2);
  EXPECT_EQ(x[0], 1.0f);  // nothing done
  EXPECT_TRUE(std::isnan(be.SumSquares(x.data(), 2)));
  EXPECT_EQ(be.status().code(), Status::Code::kUnimplemented);
  EXPECT_NE(be.status().message().find("op Scale"), std::string::npos) << be.status().message();
}

// Backend's default CopyDeviceToHost2D (a backend that has only the 1-D copies): row by row.
TEST(BackendOps, DefaultCopyDeviceToHost2DCopiesEachRow) {
  MemoryOnlyBackend be;
  const std::vector<float> m = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // 3 rows of 4
  std::vector<float> out(3 * 3, -1.0f);
  be.CopyDeviceToHost2D(out.data(), 3 * sizeof(float), m.data() + 1, 4 * sizeof(float),
                        2 * sizeof(float), 3);
  EXPECT_EQ(out, (std::vector<float>{1, 2, -1, 5, 6, -1, 9, 10, -1}));
  EXPECT_TRUE(be.status().ok());
}

}  // namespace
}  // namespace traind::engine
