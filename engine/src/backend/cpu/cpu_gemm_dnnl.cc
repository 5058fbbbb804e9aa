// 16-bit GEMMs through oneDNN's matmul primitive (AVX512-BF16 / AMX kernels where the CPU has
// them), fp32 accumulation. Primitives are created once per shape/layout/alpha/beta and cached.
// Implementations oneDNN only has as slow reference code (e.g. f16 without AVX512-FP16) are
// refused, and the caller widens to fp32 instead. Without oneDNN in the build this always refuses.
#include <omp.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

#ifdef TRAIND_HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace traind::engine::cpu {

#ifdef TRAIND_HAVE_DNNL
namespace {

// ta, tb, M, N, K, lda, ldb, ldc, ab type, c type, alpha, beta, with a bias.
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       float, float, bool>;

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias, scratchpad;
};

class MatmulCache {
 public:
  // Returns the primitive for `key`, or nullptr when oneDNN has no fast implementation.
  const Entry* Get(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, Create(key)).first;
    return it->second.has_value() ? &*it->second : nullptr;
  }
  dnnl::engine& engine() { return engine_; }

 private:
  std::optional<Entry> Create(const Key& k) {
    using dt = dnnl::memory::data_type;
    const auto [ta, tb, M, N, K, lda, ldb, ldc, ab, c, alpha, beta, has_bias] = k;
    const DType ab_type = static_cast<DType>(ab);
    const dt ab_dt = ab_type == DType::kBF16 ? dt::bf16 : ab_type == DType::kF16 ? dt::f16 : dt::f32;
    const dt c_dt = static_cast<DType>(c) == DType::kF32 ? dt::f32 : ab_dt;
    try {
      dnnl::memory::desc a_md({M, K}, ab_dt,
                              ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
      dnnl::memory::desc b_md({K, N}, ab_dt,
                              tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      dnnl::memory::desc c_md({M, N}, c_dt, dnnl::memory::dims{ldc, 1});
      dnnl::primitive_attr attr;
      // The caller passes the scratchpad (one per thread): with the library's own, shared by
      // every primitive in Debian's build (no DNNL_ENABLE_CONCURRENT_EXEC), two threads running
      // matmuls at once (attention's per-tile products) corrupted each other's results.
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(beta);
        attr.set_post_ops(po);
      }
      // The bias: one fp32 value per column of C, added to the product as C is stored.
      const dnnl::memory::desc bias_md =
          has_bias ? dnnl::memory::desc({1, N}, dt::f32, dnnl::memory::dims{N, 1})
                   : dnnl::memory::desc();
      dnnl::matmul::primitive_desc pd(
          has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md),
          attr, engine_);
      const std::string impl = pd.impl_info_str();
      if (impl.find("ref") != std::string::npos) return std::nullopt;
      return Entry{dnnl::matmul(pd), a_md, b_md, c_md, bias_md, pd.scratchpad_desc()};
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  std::mutex mu_;
  std::map<Key, std::optional<Entry>> cache_;
};

MatmulCache& Cache() {
  static MatmulCache* cache = new MatmulCache();  // never destroyed: usable from static dtors
  return *cache;
}

// A thread's ready-to-run call of one cached primitive: its memory objects (re-pointed with
// set_data_handle) and argument map, so a small product (attention's per-tile GEMMs) does not pay
// for creating four dnnl::memory objects, a hash map and a locked cache lookup every call.
struct ThreadCall {
  const Entry* entry = nullptr;  // null: oneDNN has no fast kernel for this key
  dnnl::memory a, b, c, bias, pad;
  std::unordered_map<int, dnnl::memory> args;
};

}  // namespace

bool DnnlMatmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
                DType ab_type, DType c_type, const float* bias, int nt) {
  MatmulCache& cache = Cache();
  static thread_local std::map<Key, ThreadCall> calls;
  static thread_local std::vector<char> scratch;
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, static_cast<int>(ab_type),
                static_cast<int>(c_type), alpha, beta, bias != nullptr};
  auto it = calls.find(key);
  try {
    dnnl::engine& eng = cache.engine();
    if (it == calls.end()) {
      ThreadCall call;
      call.entry = cache.Get(key);
      if (call.entry != nullptr) {
        const Entry* e = call.entry;
        if (scratch.size() < e->scratchpad.get_size()) scratch.resize(e->scratchpad.get_size());
        call.a = dnnl::memory(e->a, eng, const_cast<void*>(A));
        call.b = dnnl::memory(e->b, eng, const_cast<void*>(B));
        call.c = dnnl::memory(e->c, eng, C);
        call.pad = dnnl::memory(e->scratchpad, eng, scratch.data());
        call.args = {{DNNL_ARG_SRC, call.a},
                     {DNNL_ARG_WEIGHTS, call.b},
                     {DNNL_ARG_DST, call.c},
                     {DNNL_ARG_SCRATCHPAD, call.pad}};
        if (bias != nullptr) {
          call.bias = dnnl::memory(e->bias, eng, const_cast<float*>(bias));
          call.args.emplace(DNNL_ARG_BIAS, call.bias);
        }
      }
      it = calls.emplace(key, std::move(call)).first;
    }
    ThreadCall& call = it->second;
    if (call.entry == nullptr) return false;
    // The scratch buffer only grows; a later, larger primitive may have moved it.
    if (scratch.size() < call.entry->scratchpad.get_size()) {
      scratch.resize(call.entry->scratchpad.get_size());
    }
    call.a.set_data_handle(const_cast<void*>(A));
    call.b.set_data_handle(const_cast<void*>(B));
    call.c.set_data_handle(C);
    if (bias != nullptr) call.bias.set_data_handle(const_cast<float*>(bias));
    call.pad.set_data_handle(scratch.data());
    if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
    static thread_local dnnl::stream s(eng);  // one per thread: creating one per call costs
    call.entry->prim.execute(s, call.args);
    s.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

bool DnnlGemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
                DType ab_type, DType c_type, int nt) {
  if (ab_type == DType::kF32) return false;
  return DnnlMatmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type, nullptr,
                    nt);
}

bool Bf16TileProductsNative() {
  if (std::strcmp(GemmLibrary(), "onednn") != 0) return false;
  static const bool native = [] {
    const int bf16 = static_cast<int>(DType::kBF16), f32 = static_cast<int>(DType::kF32);
    return Cache().Get(Key{false, true, 64, 64, 64, 64, 64, 64, bf16, f32, 1.0f, 0.0f, false}) != nullptr;
  }();
  return native;
}

#else

bool Bf16TileProductsNative() { return false; }

bool DnnlGemm16(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,
                int64_t, float, void*, int64_t, DType, DType, int) {
  return false;
}

bool DnnlMatmul(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,
                int64_t, float, void*, int64_t, DType, DType, const float*, int) {
  return false;
}

#endif

}  // namespace traind::engine::cpu
