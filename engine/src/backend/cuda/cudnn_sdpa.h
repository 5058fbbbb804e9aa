// A second attention path for 16-bit jobs: cuDNN's fused scaled-dot-product attention (flash
// attention forward through cuDNN 9's graph API), behind traind's own tensor-core kernels.
// The own kernels come first. The cuDNN path is used for a shape only when
//   - the switch says so: TRAIND_CUDNN_SDPA=1 in the environment (set it only where a GPU run
//     showed cuDNN faster for the job's shapes; bench/gpu_run.sh times both), default off;
//   - the build has cuDNN (traind_cuda built where CMake found cudnn.h; the library itself is
//     loaded with dlopen on first use, so a binary starts without it);
//   - the path takes the shape (SdpaPath::Supports);
//   - its self-check on the first call of that shape passes: both paths run on the call's
//     inputs and cuDNN's out must be within the attention tests' 16-bit tolerance of the own
//     kernel's (max |diff| <= OutTol x max |out|; lse within kLseTol x max |lse|).
// Otherwise the own kernel runs, and the reason is logged in ONE line (once per shape; a missing
// library once per backend). The forward is cuDNN's; the backward stays the own kernel's (it
// reads cuDNN's lse, the same log-sum-exp of the scaled scores).
// The selection (SdpaSelector, cudnn_sdpa_select.cc) is host code built in every build; the cuDNN
// graph (cudnn_sdpa.cc) only in traind_cuda with cuDNN.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "backend/cuda/gpu_ns.h"
#include "core/dtype.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN

// One attention call's shape, as backend.h's AttentionForward16 takes it.
struct SdpaShape {
  DType type = DType::kBF16;
  int64_t B = 0, T = 0, NH = 0, NKV = 0, HS = 0, q_stride = 0, kv_stride = 0;
  bool causal = true;
  bool key_mask = false, window = false, doc_start = false;  // masks beyond causal
  auto Key() const {
    return std::tuple(static_cast<int>(type), B, T, NH, NKV, HS, q_stride, kv_stride, causal,
                      key_mask, window, doc_start);
  }
  std::string ToString() const;
};

// The tolerances of the self-check (tests/simt/attention_tc_cases.h's OutTol and kLseTol).
double SdpaOutTolerance(DType type);
inline constexpr double kSdpaLseTolerance = 1e-5;

// What the selector drives: cuDNN's graph (MakeCudnnSdpaPath) or a test's stand-in.
class SdpaPath {
 public:
  virtual ~SdpaPath() = default;
  virtual std::string name() const = 0;
  // OK once the library is loaded and a handle made; otherwise why not (asked once).
  virtual Status Ready() = 0;
  // OK when the fused graph takes this shape; otherwise why not.
  virtual Status Supports(const SdpaShape& s) const = 0;
  // out (B*T, NH*HS contiguous, s.type) and lse (B, NH, T) fp32, as AttentionTcForward.
  virtual Status Forward(void* out, float* lse, const void* q, const void* k, const void* v,
                         const SdpaShape& s, cudaStream_t stream) = 0;
};

// cuDNN's path; null when this build has no cuDNN (simt, or CMake found no cudnn.h).
std::unique_ptr<SdpaPath> MakeCudnnSdpaPath();
// The switch: TRAIND_CUDNN_SDPA is "1" (or "on"/"true").
bool CudnnSdpaSwitchOn();

// The result of a self-check: the largest |cudnn - own| of out and of lse, and the largest
// |own| of each (the scales the tolerances multiply).
struct SdpaCheck {
  double out_diff = 0.0, out_scale = 0.0, lse_diff = 0.0, lse_scale = 0.0;
};

// Chooses the path per shape (see the file comment). One thread drives it (the backend's).
class SdpaSelector {
 public:
  using Log = std::function<void(const std::string&)>;
  // enabled: the switch. path: null when the build has none. log: where the one line goes
  // (default: stderr, "traind: ...").
  SdpaSelector(bool enabled, std::unique_ptr<SdpaPath> path, Log log = nullptr);

  // Whether this call of shape `s` runs the path. The first call of a shape that gets past the
  // switch, the library and Supports runs `self_check` (both paths on this call's inputs; an
  // error counts as a failure) and keeps the verdict. may_check false (e.g. while capturing a
  // graph): an undecided shape runs the own kernel without deciding.
  bool UsePath(const SdpaShape& s, bool may_check,
               const std::function<Result<SdpaCheck>()>& self_check);
  SdpaPath* path() { return path_.get(); }
  // Whether a verdict exists for `s`, and what it is.
  bool Decided(const SdpaShape& s, bool* use) const;

 private:
  void Fallback(const std::string& why);
  bool enabled_;
  std::unique_ptr<SdpaPath> path_;
  Log log_;
  int ready_ = -1;  // -1 not asked, 0 not ready (logged), 1 ready
  std::map<decltype(SdpaShape{}.Key()), bool> verdicts_;
};

TRAIND_GPU_END
