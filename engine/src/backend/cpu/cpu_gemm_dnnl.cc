// 16-bit GEMMs through oneDNN's matmul primitive (AVX512-BF16 / AMX kernels where the CPU has
// them), fp32 accumulation. Primitives are created once per shape/layout/alpha/beta and cached.
// Implementations oneDNN only has as slow reference code (e.g. f16 without AVX512-FP16) are
// refused, and the caller widens to fp32 instead; so is bf16 on a CPU without bf16 arithmetic
// (Bf16GemmNative). Without oneDNN in the build this always refuses.
#include <omp.h>

#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "traind/engine/mutex.h"

#ifdef TRAIND_HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace traind::engine::cpu {

#ifdef TRAIND_HAVE_DNNL
namespace {

// ta, tb, M, N, K, lda, ldb, ldc, ab type, c type, alpha, beta, with a bias, B packed (tb and
// ldb then name the layout it was packed from; the primitive reads PackedLayout's).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                       float, float, bool, bool>;

// The blocked layout oneDNN's matmul reads a (K x N) B of `ab` fastest in (what it asks for when
// the weights' format is left to it; the same for every M here: bf16 BA16a64b2a, K padded to 32
// and N to 64; fp32 BA16a64b, K padded to 16), or an empty desc when it has none but the
// reference code (f16 without AVX512-FP16).
dnnl::memory::desc PackedLayout(dnnl::engine& eng, int64_t K, int64_t N, DType ab) {
  using dt = dnnl::memory::data_type;
  if (ab != DType::kBF16 && ab != DType::kF32) return {};
  const dt t = ab == DType::kBF16 ? dt::bf16 : dt::f32;
  try {
    const int64_t M = 512;
    dnnl::memory::desc a_md({M, K}, t, dnnl::memory::dims{K, 1});
    dnnl::memory::desc b_md({K, N}, t, dnnl::memory::format_tag::any);
    dnnl::memory::desc c_md({M, N}, dt::f32, dnnl::memory::dims{N, 1});
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
    if (std::string(pd.impl_info_str()).find("ref") != std::string::npos) return {};
    return pd.weights_desc();
  } catch (const dnnl::error&) {
    return {};
  }
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias, scratchpad;
};

class MatmulCache {
 public:
  // Returns the primitive for `key`, or nullptr when oneDNN has no fast implementation.
  const Entry* Get(const Key& key) {
    MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, Create(key)).first;
    return it->second.has_value() ? &*it->second : nullptr;
  }
  dnnl::engine& engine() { return engine_; }

 private:
  std::optional<Entry> Create(const Key& k) {
    using dt = dnnl::memory::data_type;
    const auto [ta, tb, M, N, K, lda, ldb, ldc, ab, c, alpha, beta, has_bias, packed] = k;
    const DType ab_type = static_cast<DType>(ab);
    const dt ab_dt = ab_type == DType::kBF16 ? dt::bf16 : ab_type == DType::kF16 ? dt::f16 : dt::f32;
    const dt c_dt = static_cast<DType>(c) == DType::kF32 ? dt::f32 : ab_dt;
    try {
      dnnl::memory::desc a_md({M, K}, ab_dt,
                              ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
      dnnl::memory::desc b_md =
          packed ? PackedLayout(engine_, K, N, ab_type)
                 : dnnl::memory::desc({K, N}, ab_dt,
                                      tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      if (b_md.get_size() == 0) return std::nullopt;
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
  Mutex mu_;
  std::map<Key, std::optional<Entry>> cache_ TRAIND_GUARDED_BY(mu_);
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

// Backend::PackGemmB's registrations: B's address and trans_b (a weight is packed in both of the
// layouts it is read in) -> the packed copy and the layout it was packed from. Read by every
// DnnlMatmul (shared lock), written between steps.
struct PackedB {
  bool tb;
  int64_t K, N, ldb;
  DType type;
  void* storage;
  const void* owner;
};

class PackedRegistry {
 public:
  // The packed copy of B when one is registered for exactly this layout, else nullptr.
  void* Find(const void* B, bool tb, int64_t K, int64_t N, int64_t ldb, DType type) const {
    if (count_.load(std::memory_order_acquire) == 0) return nullptr;
    ReaderMutexLock lock(&mu_);
    auto it = map_.find({B, tb});
    if (it == map_.end()) return nullptr;
    const PackedB& p = it->second;
    return p.K == K && p.N == N && p.ldb == ldb && p.type == type ? p.storage : nullptr;
  }
  void Put(const void* B, const PackedB& p) {
    WriterMutexLock lock(&mu_);
    map_[{B, p.tb}] = p;
    count_.store(static_cast<int>(map_.size()), std::memory_order_release);
  }
  void Erase(const void* B, bool tb) {
    WriterMutexLock lock(&mu_);
    map_.erase({B, tb});
    count_.store(static_cast<int>(map_.size()), std::memory_order_release);
  }
  // Drops the registrations of B in [begin, end) made by owner (nullptr: by anyone).
  void Forget(const void* begin, const void* end, const void* owner) {
    WriterMutexLock lock(&mu_);
    for (auto it = map_.begin(); it != map_.end();) {
      const auto* b = static_cast<const char*>(it->first.first);
      const bool in = b >= static_cast<const char*>(begin) && b < static_cast<const char*>(end);
      if (in && (owner == nullptr || it->second.owner == owner)) {
        it = map_.erase(it);
      } else {
        ++it;
      }
    }
    count_.store(static_cast<int>(map_.size()), std::memory_order_release);
  }

 private:
  mutable SharedMutex mu_;
  std::map<std::pair<const void*, bool>, PackedB> map_ TRAIND_GUARDED_BY(mu_);
  std::atomic<int> count_{0};
};

PackedRegistry& Registry() {
  static PackedRegistry* r = new PackedRegistry();  // never destroyed, as the cache
  return *r;
}

int bf16_gemm_native_override = -1;  // SetBf16GemmNativeForTesting: -1 the CPU decides

}  // namespace

bool Bf16GemmNative() {
  if (bf16_gemm_native_override >= 0) return bf16_gemm_native_override == 1;
  // oneDNN's ISA levels are supersets by bits: AVX512-BF16's are in AMX's too.
  static const bool native = [] {
    const unsigned bf16 = dnnl_cpu_isa_avx512_core_bf16;
    return (static_cast<unsigned>(dnnl_get_effective_cpu_isa()) & bf16) == bf16;
  }();
  return native;
}

int SetBf16GemmNativeForTesting(int native) {
  const int before = bf16_gemm_native_override;
  bf16_gemm_native_override = native < 0 ? -1 : native != 0;
  return before;
}

int64_t DnnlPackedBBytes(int64_t K, int64_t N, DType type) {
  if (!CpuPacksGemmB(type)) return 0;  // OpenBLAS, f16, or bf16 that widens: no oneDNN layout
  static Mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int>, int64_t> sizes;  // under mu
  MutexLock lock(&mu);
  const auto key = std::make_tuple(K, N, static_cast<int>(type));
  auto it = sizes.find(key);
  if (it == sizes.end()) {
    it = sizes.emplace(key, static_cast<int64_t>(PackedLayout(Cache().engine(), K, N, type).get_size()))
             .first;
  }
  return it->second;
}

bool DnnlPackB(void* storage, int64_t storage_bytes, const void* B, bool tb, int64_t K, int64_t N,
               int64_t ldb, DType type, const void* owner, int nt) {
  Registry().Erase(B, tb);
  const int64_t bytes = DnnlPackedBBytes(K, N, type);
  if (bytes <= 0 || bytes > storage_bytes) return false;
  using dt = dnnl::memory::data_type;
  using RKey = std::tuple<bool, int64_t, int64_t, int64_t, int>;
  struct Reorder {
    bool own;  // BA16a64b2a (bf16) / BA16a64b (fp32): cpu_pack.cc writes it, else oneDNN's reorder
    dnnl::reorder prim;
    dnnl::memory::desc src, dst;
  };
  static thread_local std::map<RKey, Reorder> reorders;
  try {
    dnnl::engine& eng = Cache().engine();
    const RKey rk{tb, K, N, ldb, static_cast<int>(type)};
    auto it = reorders.find(rk);
    if (it == reorders.end()) {
      const dt t = type == DType::kBF16 ? dt::bf16 : dt::f32;
      const dnnl::memory::desc src({K, N}, t,
                                   tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      const dnnl::memory::desc dst = PackedLayout(eng, K, N, type);
      const bool own =
          dst == dnnl::memory::desc({K, N}, t,
                                    type == DType::kBF16 ? dnnl::memory::format_tag::BA16a64b2a
                                                         : dnnl::memory::format_tag::BA16a64b);
      Reorder r{own, own ? dnnl::reorder() : dnnl::reorder(dnnl::reorder::primitive_desc(eng, src, eng, dst)),
                src, dst};
      it = reorders.emplace(rk, r).first;
    }
    if (it->second.own && type == DType::kBF16) {
      PackBA16a64b2a(storage, static_cast<const uint16_t*>(B), tb, K, N, ldb, nt);
    } else if (it->second.own) {
      PackBA16a64b(storage, static_cast<const float*>(B), tb, K, N, ldb, nt);
    } else {
      dnnl::memory from(it->second.src, eng, const_cast<void*>(B));
      dnnl::memory to(it->second.dst, eng, storage);
      if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
      static thread_local dnnl::stream s(eng);
      it->second.prim.execute(s, from, to);
      s.wait();
    }
  } catch (const dnnl::error&) {
    return false;
  }
  Registry().Put(B, PackedB{tb, K, N, ldb, type, storage, owner});
  return true;
}

void DnnlForgetPackedB(const void* begin, const void* end, const void* owner) {
  Registry().Forget(begin, end, owner);
}

namespace {

bool MatmulCall(const Key& key, const void* A, const void* B, void* C, const float* bias, int nt) {
  MatmulCache& cache = Cache();
  static thread_local std::map<Key, ThreadCall> calls;
  static thread_local std::vector<char> scratch;
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

}  // namespace

bool DnnlMatmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
                DType ab_type, DType c_type, const float* bias, int nt) {
  if (ab_type == DType::kBF16 && !Bf16GemmNative()) return false;
  // A B packed by PackGemmB (a weight matrix) is read in its packed layout: no per-call copy of
  // it into the kernel's blocks (bf16 products 10-30% faster: bench/README.md, "packed bf16
  // weights"). A primitive oneDNN cannot build on the packed layout falls back to B itself.
  if (void* packed = Registry().Find(B, tb, K, N, ldb, ab_type)) {
    const Key key{ta, tb, M, N, K, lda, ldb, ldc, static_cast<int>(ab_type),
                  static_cast<int>(c_type), alpha, beta, bias != nullptr, true};
    if (MatmulCall(key, A, packed, C, bias, nt)) return true;
  }
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, static_cast<int>(ab_type),
                static_cast<int>(c_type), alpha, beta, bias != nullptr, false};
  return MatmulCall(key, A, B, C, bias, nt);
}

bool DnnlMatmulPackedB(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
                       int64_t ldc, DType ab_type, DType c_type, int nt) {
  void* packed = Registry().Find(B, tb, K, N, ldb, ab_type);
  if (packed == nullptr) return false;
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, static_cast<int>(ab_type),
                static_cast<int>(c_type), alpha, beta, false, true};
  return MatmulCall(key, A, packed, C, nullptr, nt);
}

bool DnnlGemm16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
                DType ab_type, DType c_type, int nt) {
  if (ab_type == DType::kF32) return false;
  return DnnlMatmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type, nullptr,
                    nt);
}

bool Bf16TileProductsNative() {
  if (std::strcmp(GemmLibrary(), "onednn") != 0 || !Bf16GemmNative()) return false;
  static const bool native = [] {
    const int bf16 = static_cast<int>(DType::kBF16), f32 = static_cast<int>(DType::kF32);
    return Cache().Get(Key{false, true, 64, 64, 64, 64, 64, 64, bf16, f32, 1.0f, 0.0f, false, false}) !=
           nullptr;
  }();
  return native;
}

#else

bool Bf16GemmNative() { return false; }
int SetBf16GemmNativeForTesting(int) { return -1; }
bool Bf16TileProductsNative() { return false; }

bool DnnlGemm16(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,
                int64_t, float, void*, int64_t, DType, DType, int) {
  return false;
}

bool DnnlMatmul(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,
                int64_t, float, void*, int64_t, DType, DType, const float*, int) {
  return false;
}

int64_t DnnlPackedBBytes(int64_t, int64_t, DType) { return 0; }

bool DnnlMatmulPackedB(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t,
                       const void*, int64_t, float, void*, int64_t, DType, DType, int) {
  return false;
}

bool DnnlPackB(void*, int64_t, const void*, bool, int64_t, int64_t, int64_t, DType, const void*,
               int) {
  return false;
}

void DnnlForgetPackedB(const void*, const void*, const void*) {}

#endif

}  // namespace traind::engine::cpu
