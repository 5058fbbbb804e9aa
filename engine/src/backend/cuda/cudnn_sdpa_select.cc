// SdpaSelector: which attention path a 16-bit call takes (cudnn_sdpa.h). Host code, both builds.
#include <cstdio>
#include <string>
#include <utility>

#include "backend/cuda/cudnn_sdpa.h"
#include "core/environment.h"

TRAIND_GPU_BEGIN

std::string SdpaShape::ToString() const {
  std::string s = std::string(DTypeName(type)) + " B=" + std::to_string(B) +
                  " T=" + std::to_string(T) + " NH=" + std::to_string(NH) +
                  " NKV=" + std::to_string(NKV) + " HS=" + std::to_string(HS) +
                  (causal ? " causal" : " bidirectional");
  if (key_mask) s += " key_mask";
  if (window) s += " window";
  if (doc_start) s += " doc_start";
  return s;
}

double SdpaOutTolerance(DType type) { return type == DType::kBF16 ? 1e-2 : 1.5e-3; }

bool CudnnSdpaSwitchOn() { return ReadEngineEnvironment().cudnn_sdpa_on; }

#if !defined(TRAIND_HAVE_CUDNN)
std::unique_ptr<SdpaPath> MakeCudnnSdpaPath() { return nullptr; }
#endif

SdpaSelector::SdpaSelector(bool enabled, std::unique_ptr<SdpaPath> path, Log log)
    : enabled_(enabled), path_(std::move(path)), log_(std::move(log)) {
  if (!log_) {
    log_ = [](const std::string& line) { std::fprintf(stderr, "traind: %s\n", line.c_str()); };
  }
}

void SdpaSelector::Fallback(const std::string& why) {
  log_("cuDNN SDPA not used (" + why + "); attention runs traind's own kernels");
}

bool SdpaSelector::Decided(const SdpaShape& s, bool* use) const {
  const auto it = verdicts_.find(s.Key());
  if (it == verdicts_.end()) return false;
  *use = it->second;
  return true;
}

bool SdpaSelector::UsePath(const SdpaShape& s, bool may_check,
                           const std::function<Result<SdpaCheck>()>& self_check) {
  if (!enabled_) return false;  // the default: no line, the own kernels
  if (ready_ < 0) {
    Status why = path_ == nullptr ? Status::Unimplemented("this build has no cuDNN")
                                  : path_->Ready();
    ready_ = why.ok() ? 1 : 0;
    if (!why.ok()) Fallback(why.message());
  }
  if (ready_ == 0) return false;
  bool use = false;
  if (Decided(s, &use)) return use;
  if (!may_check) return false;  // decided on the next call that may run the check
  const Status supported = path_->Supports(s);
  if (!supported.ok()) {
    verdicts_[s.Key()] = false;
    Fallback("unsupported shape " + s.ToString() + ": " + supported.message());
    return false;
  }
  const Result<SdpaCheck> check = self_check();
  if (!check.ok()) {
    verdicts_[s.Key()] = false;
    Fallback("self-check of " + s.ToString() + " failed: " + check.status().message());
    return false;
  }
  const SdpaCheck& c = *check;
  const double out_tol = SdpaOutTolerance(s.type) * c.out_scale;
  const double lse_tol = kSdpaLseTolerance * (c.lse_scale > 1.0 ? c.lse_scale : 1.0);
  // !(a <= b) so that a NaN difference fails.
  if (!(c.out_diff <= out_tol) || !(c.lse_diff <= lse_tol)) {
    verdicts_[s.Key()] = false;
    char buf[200];
    std::snprintf(buf, sizeof(buf),
                  "max |out diff| %.3g (tolerance %.3g), max |lse diff| %.3g (tolerance %.3g)",
                  c.out_diff, out_tol, c.lse_diff, lse_tol);
    Fallback("self-check of " + s.ToString() + " against traind's kernel failed: " + buf);
    return false;
  }
  verdicts_[s.Key()] = true;
  return true;
}

TRAIND_GPU_END
