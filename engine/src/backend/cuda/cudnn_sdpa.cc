// cuDNN's fused SDPA forward through the backend (C) graph API of cuDNN 9 (cudnn_sdpa.h). Built
// only in traind_cuda where CMake found cudnn.h (TRAIND_HAVE_CUDNN); libcudnn.so.9 is opened with
// dlopen on first use, so the binary starts (and falls back) without it.
//
// The operation graph per shape (the flash-attention forward pattern cuDNN's runtime fusion
// engines take; tensors [B, H, S, D] with our strides, so q/k/v are read in place):
//   S = matmul(Q, K^T) * scale                          (fp32, [B, H, T, T], virtual)
//   causal: S = select(row >= col, S, -inf)              (GEN_INDEX x2, CMP_GE, BINARY_SELECT)
//   m = max_j S;  E = exp(S - m);  l = sum_j E           (REDUCTION MAX / ADD, [B, H, T, 1])
//   stats = m + log(l)  -> lse (B, NH, T) fp32           (output)
//   O = matmul(E / l, V)                                 (output, 16-bit, (B*T, NH*HS))
// Shapes it takes: bf16/fp16, NKV == NH, HS a multiple of 8 up to 128, strides multiples of 8,
// causal or bidirectional without key_mask / window / doc_start. Anything else: Supports says why.
// Each shape's execution plan is built once (heuristics mode A, the first config that finalizes)
// and kept, with its workspace, for the path's life; Forward only executes it, so it may run
// inside graph capture once the shape has been seen.
#include <dlfcn.h>

#include <cudnn_backend.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cudnn_sdpa.h"

TRAIND_GPU_BEGIN
namespace {

// The entry points of libcudnn used here, from dlopen.
struct CudnnApi {
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;
};

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  Desc(const CudnnApi* api, cudnnBackendDescriptorType_t type) : api_(api) {
    if (api_->CreateDescriptor(type, &d_) != CUDNN_STATUS_SUCCESS) d_ = nullptr;
  }
  ~Desc() {
    if (d_ != nullptr) api_->DestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : api_(o.api_), d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(api_, o.api_);
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* ptr() { return &d_; }

 private:
  const CudnnApi* api_ = nullptr;
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Unique ids of the graph's non-virtual tensors (the variant pack's).
enum : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kFirstVirtual = 100 };

class CudnnSdpaPath final : public SdpaPath {
 public:
  ~CudnnSdpaPath() override {
    plans_.clear();  // descriptors before the handle
    if (handle_ != nullptr) api_.Destroy(handle_);
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    // the library stays loaded: descriptors of other paths may still live
  }
  std::string name() const override { return "cudnn"; }

  Status Ready() override {
    lib_ = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) lib_ = dlopen("libcudnn.so", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return Status::NotFound(std::string("libcudnn.so.9: ") + dlerror());
    bool all = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib_, name));
      all = all && *fn != nullptr;
    };
    sym(&api_.GetVersion, "cudnnGetVersion");
    sym(&api_.GetErrorString, "cudnnGetErrorString");
    sym(&api_.Create, "cudnnCreate");
    sym(&api_.Destroy, "cudnnDestroy");
    sym(&api_.SetStream, "cudnnSetStream");
    sym(&api_.CreateDescriptor, "cudnnBackendCreateDescriptor");
    sym(&api_.DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    sym(&api_.SetAttribute, "cudnnBackendSetAttribute");
    sym(&api_.GetAttribute, "cudnnBackendGetAttribute");
    sym(&api_.Finalize, "cudnnBackendFinalize");
    sym(&api_.Execute, "cudnnBackendExecute");
    if (!all) return Status::NotFound("libcudnn lacks a backend-API entry point");
    if (api_.GetVersion() < 90000) {
      return Status::FailedPrecondition("cuDNN " + std::to_string(api_.GetVersion()) +
                                        " is older than 9.0");
    }
    return Check(api_.Create(&handle_), "cudnnCreate");
  }

  Status Supports(const SdpaShape& s) const override {
    if (s.type != DType::kBF16 && s.type != DType::kF16)
      return Status::InvalidArgument("only bf16/fp16 tensors");
    if (s.NKV != s.NH) return Status::InvalidArgument("grouped-query attention (NKV != NH)");
    if (s.HS % 8 != 0 || s.HS > 128) return Status::InvalidArgument("head size not 8k <= 128");
    if (s.q_stride % 8 != 0 || s.kv_stride % 8 != 0)
      return Status::InvalidArgument("row strides not multiples of 8");
    if (s.key_mask || s.window || s.doc_start)
      return Status::InvalidArgument("key padding mask, sliding window or packed rows");
    return Status::Ok();
  }

  Status Forward(void* out, float* lse, const void* q, const void* k, const void* v,
                 const SdpaShape& s, cudaStream_t stream) override {
    if (handle_ == nullptr) return Status::FailedPrecondition("cuDNN SDPA used before Ready");
    auto it = plans_.find(s.Key());
    if (it == plans_.end()) {
      Plan plan;
      TRAIND_RETURN_IF_ERROR(Build(s, &plan));
      it = plans_.emplace(s.Key(), std::move(plan)).first;
    }
    Plan& plan = it->second;
    if (plan.workspace > workspace_bytes_) {
      if (workspace_ != nullptr) (void)cudaFree(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      if (cudaMalloc(&workspace_, static_cast<size_t>(plan.workspace)) != cudaSuccess)
        return Status::ResourceExhausted("cuDNN SDPA workspace of " +
                                         std::to_string(plan.workspace) + " bytes");
      workspace_bytes_ = plan.workspace;
    }
    TRAIND_RETURN_IF_ERROR(Check(api_.SetStream(handle_, stream), "cudnnSetStream"));
    float scale = 1.0f / std::sqrt(static_cast<float>(s.HS));
    float neg_inf = -std::numeric_limits<float>::infinity();
    int64_t uids[] = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
    void* ptrs[] = {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out,
                    lse, &scale, &neg_inf};
    const int64_t n = s.causal ? 7 : 6;
    Desc pack(&api_, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    TRAIND_RETURN_IF_ERROR(
        Set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids));
    TRAIND_RETURN_IF_ERROR(
        Set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs));
    TRAIND_RETURN_IF_ERROR(
        Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(pack.get()), "variant pack"));
    return Check(api_.Execute(handle_, plan.plan.get(), pack.get()), "cudnnBackendExecute");
  }

 private:
  struct Plan {
    std::vector<Desc> keep;  // every descriptor the plan refers to
    Desc plan;
    int64_t workspace = 0;
  };

  Status Check(cudnnStatus_t st, const char* what) const {
    if (st == CUDNN_STATUS_SUCCESS) return Status::Ok();
    const char* text = api_.GetErrorString != nullptr ? api_.GetErrorString(st) : "?";
    return Status::Internal(std::string(what) + ": " + text);
  }
  Status Set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
             int64_t count, const void* values) const {
    if (d.get() == nullptr) return Status::Internal("cuDNN descriptor not created");
    return Check(api_.SetAttribute(d.get(), name, type, count, values), "cudnnBackendSetAttribute");
  }

  // A tensor descriptor (4-d), finalized, appended to keep.
  Status Tensor(std::vector<Desc>* keep, int64_t uid, cudnnDataType_t type,
                std::vector<int64_t> dims, std::vector<int64_t> strides, bool is_virtual,
                bool by_value = false) const {
    Desc t(&api_, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    TRAIND_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
    TRAIND_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64,
                               static_cast<int64_t>(dims.size()), dims.data()));
    TRAIND_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64,
                               static_cast<int64_t>(strides.size()), strides.data()));
    TRAIND_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    TRAIND_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    TRAIND_RETURN_IF_ERROR(
        Set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual));
    if (by_value)
      TRAIND_RETURN_IF_ERROR(
          Set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(t.get()), "tensor descriptor"));
    keep->push_back(std::move(t));
    return Status::Ok();
  }

  // A pointwise operation y = mode(x[, b][, t]) (descriptors from keep by index), appended to ops.
  Status Pointwise(std::vector<Desc>* keep, std::vector<cudnnBackendDescriptor_t>* ops,
                   cudnnPointwiseMode_t mode, cudnnDataType_t prec, size_t x, size_t b, size_t t,
                   size_t y, int64_t axis = -1) const {
    constexpr size_t kNone = static_cast<size_t>(-1);
    Desc pw(&api_, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    TRAIND_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    TRAIND_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (axis >= 0)
      TRAIND_RETURN_IF_ERROR(Set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(pw.get()), "pointwise descriptor"));
    Desc op(&api_, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    auto d = [&](size_t i) { return (*keep)[i].get(); };
    cudnnBackendDescriptor_t pwd = pw.get(), xd = d(x), yd = d(y);
    TRAIND_RETURN_IF_ERROR(Set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd));
    if (b != kNone) {
      cudnnBackendDescriptor_t bd = d(b);
      TRAIND_RETURN_IF_ERROR(
          Set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bd));
    }
    if (t != kNone) {
      cudnnBackendDescriptor_t td = d(t);
      TRAIND_RETURN_IF_ERROR(
          Set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &td));
    }
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(op.get()), "pointwise operation"));
    ops->push_back(op.get());
    keep->push_back(std::move(pw));
    keep->push_back(std::move(op));
    return Status::Ok();
  }

  Status Matmul(std::vector<Desc>* keep, std::vector<cudnnBackendDescriptor_t>* ops, size_t a,
                size_t b, size_t c) const {
    Desc mm(&api_, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    TRAIND_RETURN_IF_ERROR(Set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(mm.get()), "matmul descriptor"));
    Desc op(&api_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cudnnBackendDescriptor_t ad = (*keep)[a].get(), bd = (*keep)[b].get(), cd = (*keep)[c].get(),
                             md = mm.get();
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ad));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bd));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &md));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(op.get()), "matmul operation"));
    ops->push_back(op.get());
    keep->push_back(std::move(mm));
    keep->push_back(std::move(op));
    return Status::Ok();
  }

  Status Reduction(std::vector<Desc>* keep, std::vector<cudnnBackendDescriptor_t>* ops,
                   cudnnReduceTensorOp_t mode, size_t x, size_t y) const {
    Desc red(&api_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    TRAIND_RETURN_IF_ERROR(
        Set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode));
    TRAIND_RETURN_IF_ERROR(Set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(red.get()), "reduction descriptor"));
    Desc op(&api_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cudnnBackendDescriptor_t xd = (*keep)[x].get(), yd = (*keep)[y].get(), rd = red.get();
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd));
    TRAIND_RETURN_IF_ERROR(
        Set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(op.get()), "reduction operation"));
    ops->push_back(op.get());
    keep->push_back(std::move(red));
    keep->push_back(std::move(op));
    return Status::Ok();
  }

  Status Build(const SdpaShape& s, Plan* plan) const {
    const cudnnDataType_t io = s.type == DType::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const int64_t B = s.B, H = s.NH, T = s.T, D = s.HS;
    std::vector<Desc>& keep = plan->keep;
    std::vector<cudnnBackendDescriptor_t> ops;
    int64_t next_uid = kFirstVirtual;
    // Tensor indices in keep, in creation order.
    auto add = [&](int64_t uid, cudnnDataType_t type, std::vector<int64_t> dims,
                   std::vector<int64_t> strides, bool is_virtual, bool by_value,
                   size_t* index) -> Status {
      TRAIND_RETURN_IF_ERROR(Tensor(&keep, uid, type, std::move(dims), std::move(strides),
                                    is_virtual, by_value));
      *index = keep.size() - 1;
      return Status::Ok();
    };
    const std::vector<int64_t> score_dims = {B, H, T, T}, score_strides = {H * T * T, T * T, T, 1};
    const std::vector<int64_t> row_dims = {B, H, T, 1}, row_strides = {H * T, T, 1, 1};
    auto virt = [&](cudnnDataType_t type, bool row, size_t* index) {
      return add(next_uid++, type, row ? row_dims : score_dims, row ? row_strides : score_strides,
                 true, false, index);
    };
    size_t q, kt, v, o, stats, scale, neg_inf = 0;
    TRAIND_RETURN_IF_ERROR(add(kQ, io, {B, H, T, D}, {T * s.q_stride, D, s.q_stride, 1}, false,
                               false, &q));
    TRAIND_RETURN_IF_ERROR(add(kK, io, {B, H, D, T}, {T * s.kv_stride, D, 1, s.kv_stride}, false,
                               false, &kt));
    TRAIND_RETURN_IF_ERROR(add(kV, io, {B, H, T, D}, {T * s.kv_stride, D, s.kv_stride, 1}, false,
                               false, &v));
    TRAIND_RETURN_IF_ERROR(add(kO, io, {B, H, T, D}, {T * H * D, D, H * D, 1}, false, false, &o));
    TRAIND_RETURN_IF_ERROR(add(kStats, f32, row_dims, row_strides, false, false, &stats));
    TRAIND_RETURN_IF_ERROR(add(kScale, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &scale));
    if (s.causal)
      TRAIND_RETURN_IF_ERROR(add(kNegInf, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &neg_inf));
    constexpr size_t kNone = static_cast<size_t>(-1);
    size_t s0, s1;
    TRAIND_RETURN_IF_ERROR(virt(f32, false, &s0));
    TRAIND_RETURN_IF_ERROR(Matmul(&keep, &ops, q, kt, s0));
    TRAIND_RETURN_IF_ERROR(virt(f32, false, &s1));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_MUL, f32, s0, scale, kNone, s1));
    if (s.causal) {
      size_t row, col, ge, masked;
      TRAIND_RETURN_IF_ERROR(virt(CUDNN_DATA_INT32, false, &row));
      TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32,
                                       s1, kNone, kNone, row, 2));
      TRAIND_RETURN_IF_ERROR(virt(CUDNN_DATA_INT32, false, &col));
      TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32,
                                       s1, kNone, kNone, col, 3));
      TRAIND_RETURN_IF_ERROR(virt(CUDNN_DATA_BOOLEAN, false, &ge));
      TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN,
                                       row, col, kNone, ge));
      TRAIND_RETURN_IF_ERROR(virt(f32, false, &masked));
      TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_BINARY_SELECT, f32, s1,
                                       neg_inf, ge, masked));
      s1 = masked;
    }
    size_t mx, sub, ex, sum, lg, p;
    TRAIND_RETURN_IF_ERROR(virt(f32, true, &mx));
    TRAIND_RETURN_IF_ERROR(Reduction(&keep, &ops, CUDNN_REDUCE_TENSOR_MAX, s1, mx));
    TRAIND_RETURN_IF_ERROR(virt(f32, false, &sub));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_SUB, f32, s1, mx, kNone, sub));
    TRAIND_RETURN_IF_ERROR(virt(f32, false, &ex));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_EXP, f32, sub, kNone, kNone, ex));
    TRAIND_RETURN_IF_ERROR(virt(f32, true, &sum));
    TRAIND_RETURN_IF_ERROR(Reduction(&keep, &ops, CUDNN_REDUCE_TENSOR_ADD, ex, sum));
    TRAIND_RETURN_IF_ERROR(virt(f32, true, &lg));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_LOG, f32, sum, kNone, kNone, lg));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_ADD, f32, mx, lg, kNone, stats));
    TRAIND_RETURN_IF_ERROR(virt(f32, false, &p));
    TRAIND_RETURN_IF_ERROR(Pointwise(&keep, &ops, CUDNN_POINTWISE_DIV, f32, ex, sum, kNone, p));
    TRAIND_RETURN_IF_ERROR(Matmul(&keep, &ops, p, v, o));
    return MakePlan(ops, plan);
  }

  // The operation graph of `ops`, and the first engine config the heuristics offer that
  // finalizes into an execution plan (kept in plan->keep with what it refers to).
  Status MakePlan(const std::vector<cudnnBackendDescriptor_t>& ops, Plan* plan) const {
    std::vector<Desc>& keep = plan->keep;
    Desc graph(&api_, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cudnnHandle_t handle = handle_;
    TRAIND_RETURN_IF_ERROR(Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1,
                               &handle));
    TRAIND_RETURN_IF_ERROR(Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               static_cast<int64_t>(ops.size()), ops.data()));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(graph.get()), "operation graph"));

    Desc heur(&api_, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendDescriptor_t gd = graph.get();
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    TRAIND_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &gd));
    TRAIND_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    TRAIND_RETURN_IF_ERROR(Check(api_.Finalize(heur.get()), "engine heuristics"));
    constexpr int64_t kMaxConfigs = 8;
    std::vector<Desc> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < kMaxConfigs; ++i) {
      configs.emplace_back(&api_, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(configs.back().get());
    }
    int64_t count = 0;
    TRAIND_RETURN_IF_ERROR(Check(api_.GetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxConfigs,
                                                   &count, raw.data()),
                                 "engine heuristics results"));
    Status last = Status::NotFound("no engine config for the SDPA graph");
    for (int64_t i = 0; i < count; ++i) {
      Desc ep(&api_, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      cudnnBackendDescriptor_t cfg = raw[static_cast<size_t>(i)];
      Status st = Set(ep, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (st.ok())
        st = Set(ep, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &cfg);
      if (st.ok()) st = Check(api_.Finalize(ep.get()), "execution plan");
      if (!st.ok()) {
        last = st;
        continue;
      }
      int64_t ws = 0, got = 0;
      TRAIND_RETURN_IF_ERROR(
          Check(api_.GetAttribute(ep.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                  CUDNN_TYPE_INT64, 1, &got, &ws),
                "workspace size"));
      plan->workspace = ws;
      plan->plan = std::move(ep);
      for (Desc& c : configs) keep.push_back(std::move(c));
      keep.push_back(std::move(heur));
      keep.push_back(std::move(graph));
      return Status::Ok();
    }
    return last;
  }

  CudnnApi api_;
  void* lib_ = nullptr;
  cudnnHandle_t handle_ = nullptr;
  std::map<decltype(SdpaShape{}.Key()), Plan> plans_;
  void* workspace_ = nullptr;
  int64_t workspace_bytes_ = 0;
};

}  // namespace

std::unique_ptr<SdpaPath> MakeCudnnSdpaPath() { return std::make_unique<CudnnSdpaPath>(); }

TRAIND_GPU_END
