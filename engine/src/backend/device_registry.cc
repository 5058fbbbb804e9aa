// The device registry: the GPU factories installed at start, device-name parsing, opening the
// backend a job names ("auto" falls back to the CPU with one note), and QueryDevice.
#include "backend/device_registry.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <vector>

#include "traind/engine/mutex.h"

namespace traind::engine {
namespace {

struct Registry {
  Mutex mu;
  CudaFactories cuda TRAIND_GUARDED_BY(mu);
  Result<std::unique_ptr<Backend>> (*make_simt)(int) TRAIND_GUARDED_BY(mu) = nullptr;
};

Registry& Reg() {
  static Registry r;
  return r;
}

CudaFactories Cuda() {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  return r.cuda;
}

auto SimtFactory() {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  return r.make_simt;
}

int64_t HostRamBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{1} << 32;  // unknown: assume 4 GiB
  return static_cast<int64_t>(pages) * page_size;
}

int64_t HostAvailableBytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "cpu";
}

// Best of 3 fp32 512^3 GEMMs on the CPU backend with all cores (~1-10 ms), measured once.
double MeasureCpuPeakFlops() {
  static const double flops = [] {
    constexpr int64_t n = 512;
    std::unique_ptr<Backend> cpu = MakeCpuBackend(0);
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
    double best = 0.0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu->Gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      cpu->Synchronize();
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) best = std::max(best, 2.0 * n * n * n / s);
    }
    return best;
  }();
  return flops;
}

Status NoCudaBackend(const std::string& device) {
  return Status::FailedPrecondition("device " + device +
                                    ": no CUDA backend in this build (built without nvcc, or "
                                    "RegisterGpuBackends() not called); use --device cpu");
}

// `s` with "device <name>: " in front of its message (OK stays OK).
Status Named(const Status& s, const std::string& device) {
  return s.ok() ? s : Status(s.code(), "device " + device + ": " + s.message());
}

// Whether "auto" finds a CUDA device; the reason in `why` when not.
bool AutoHasGpu(std::string* why) {
  const CudaFactories cuda = Cuda();
  if (cuda.device_count == nullptr) {
    *why = "this build has no CUDA backend";
    return false;
  }
  std::string reason;
  if (cuda.device_count(&reason) > 0) return true;
  *why = reason.empty() ? "no CUDA device" : reason;
  return false;
}

DeviceInfo CpuInfo() {
  DeviceInfo info;
  info.device = "cpu";
  info.name = CpuModelName();
  info.total_bytes = HostRamBytes();
  info.free_bytes = HostAvailableBytes();
  info.peak_flops = MeasureCpuPeakFlops();
  return info;
}

}  // namespace

void InstallCudaFactories(const CudaFactories& factories) {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  r.cuda = factories;
}

void InstallSimtFactory(Result<std::unique_ptr<Backend>> (*make)(int cpu_threads)) {
  Registry& r = Reg();
  MutexLock lock(&r.mu);
  r.make_simt = make;
}

Result<DeviceName> ParseDeviceName(const std::string& device) {
  DeviceName d;
  if (device == "cpu" || device.empty()) return d;
  if (device == "auto") { d.kind = DeviceKind::kAuto; return d; }
  if (device == "simt") { d.kind = DeviceKind::kSimt; return d; }
  const std::string digits = device.rfind("cuda:", 0) == 0 ? device.substr(5) : "";
  if (!digits.empty() && digits.size() <= 4 &&
      digits.find_first_not_of("0123456789") == std::string::npos) {
    d.kind = DeviceKind::kCuda;
    d.index = std::stoi(digits);
    return d;
  }
  return Status::InvalidArgument("device '" + device +
                                 "' is not one of cpu, auto, cuda:N, simt (test device)");
}

DeviceCapabilities DeviceCapabilitiesOf(DeviceKind kind) {
  DeviceCapabilities c;
  switch (kind) {
    case DeviceKind::kCpu:
      c.ops_complete_on_return = true;
      c.has_own_memory = false;
      c.packs_gemm_weights = true;
      break;
    case DeviceKind::kAuto:  // resolved before it is asked; a GPU is the stricter answer
    case DeviceKind::kCuda:
      c.tensor_cores = true;
      c.device_collective = "nccl";
      break;
    case DeviceKind::kSimt:  // the CUDA backend's kernels on host memory, without NCCL or TF32
      break;
  }
  return c;
}

Result<DeviceCapabilities> DeviceCapabilitiesOf(const std::string& device) {
  TRAIND_ASSIGN_OR_RETURN(DeviceName d, ParseDeviceName(device));
  std::string why;
  if (d.kind == DeviceKind::kAuto) d.kind = AutoHasGpu(&why) ? DeviceKind::kCuda : DeviceKind::kCpu;
  return DeviceCapabilitiesOf(d.kind);
}

Status CheckDeviceAvailable(const std::string& device) {
  TRAIND_ASSIGN_OR_RETURN(DeviceName d, ParseDeviceName(device));
  if (d.kind == DeviceKind::kSimt && SimtFactory() == nullptr) {
    return Status::FailedPrecondition("device simt: the simt emulator is not in this binary "
                                      "(link traind_gpu_backends, call RegisterGpuBackends())");
  }
  if (d.kind != DeviceKind::kCuda) return Status::Ok();
  const CudaFactories cuda = Cuda();
  if (cuda.query == nullptr) return NoCudaBackend(device);
  return Named(cuda.query(d.index).status(), device);  // FAILED_PRECONDITION "no CUDA device"
}

int64_t BudgetFromFreeBytes(int64_t free_bytes) { return free_bytes / 20 * 19; }

Result<int64_t> DeviceBudget(const DeviceOptions& options) {
  TRAIND_RETURN_IF_ERROR(CheckDeviceAvailable(options.device));
  if (options.memory_budget_bytes > 0) return options.memory_budget_bytes;
  TRAIND_ASSIGN_OR_RETURN(DeviceName d, ParseDeviceName(options.device));
  std::string why;
  if (d.kind == DeviceKind::kAuto && AutoHasGpu(&why)) d = {DeviceKind::kCuda, 0};
  if (d.kind == DeviceKind::kCuda || d.kind == DeviceKind::kSimt) {
    TRAIND_ASSIGN_OR_RETURN(DeviceInfo info,
                            QueryDevice(d.kind == DeviceKind::kSimt
                                            ? std::string("simt")
                                            : "cuda:" + std::to_string(d.index)));
    return BudgetFromFreeBytes(info.free_bytes);
  }
  return HostRamBytes();
}

Result<OpenedDevice> OpenDevice(const DeviceOptions& options, bool allow_tf32,
                                const std::function<void(const std::string&)>& note) {
  TRAIND_ASSIGN_OR_RETURN(DeviceName d, ParseDeviceName(options.device));
  OpenedDevice out;
  if (d.kind == DeviceKind::kAuto) {
    std::string why;
    if (AutoHasGpu(&why)) {
      d = {DeviceKind::kCuda, 0};
    } else {
      d.kind = DeviceKind::kCpu;
      if (note) note("device auto: no GPU found (" + why + "); using the CPU backend");
    }
  }
  switch (d.kind) {
    case DeviceKind::kCuda: {
      const CudaFactories cuda = Cuda();
      if (cuda.make == nullptr) return NoCudaBackend(options.device);
      out.device = "cuda:" + std::to_string(d.index);
      auto made = cuda.make(d.index, allow_tf32);
      if (!made.ok()) return Named(made.status(), out.device);
      out.backend = std::move(made).value();
      break;
    }
    case DeviceKind::kSimt: {
      auto make = SimtFactory();
      if (make == nullptr) return CheckDeviceAvailable("simt");
      TRAIND_ASSIGN_OR_RETURN(out.backend, make(options.threads));
      out.device = "simt";
      break;
    }
    default:
      out.backend = MakeCpuBackend(options.threads);
      out.device = "cpu";
  }
  out.budget_bytes = options.memory_budget_bytes;
  if (out.budget_bytes <= 0) {
    size_t free_bytes = 0, total_bytes = 0;
    const Status s = out.backend->MemoryInfo(&free_bytes, &total_bytes);
    out.budget_bytes = s.ok() ? BudgetFromFreeBytes(static_cast<int64_t>(free_bytes))
                              : HostRamBytes();
  }
  return out;
}

Result<DeviceInfo> QueryDevice(const std::string& device) {
  TRAIND_ASSIGN_OR_RETURN(DeviceName d, ParseDeviceName(device));
  std::string why;
  if (d.kind == DeviceKind::kAuto) {
    d = AutoHasGpu(&why) ? DeviceName{DeviceKind::kCuda, 0} : DeviceName{DeviceKind::kCpu, 0};
  }
  if (d.kind == DeviceKind::kCpu) return CpuInfo();
  if (d.kind == DeviceKind::kCuda) {
    const CudaFactories cuda = Cuda();
    if (cuda.query == nullptr) return NoCudaBackend(device);
    auto info = cuda.query(d.index);
    if (!info.ok()) return Named(info.status(), device);
    return info;
  }
  auto make = SimtFactory();
  if (make == nullptr) return CheckDeviceAvailable("simt");
  TRAIND_ASSIGN_OR_RETURN(std::unique_ptr<Backend> simt, make(1));
  size_t free_bytes = 0, total_bytes = 0;
  TRAIND_RETURN_IF_ERROR(simt->MemoryInfo(&free_bytes, &total_bytes));
  DeviceInfo info;
  info.device = "simt";
  info.name = "simt emulator (CUDA kernels on the CPU)";
  info.total_bytes = static_cast<int64_t>(total_bytes);
  info.free_bytes = static_cast<int64_t>(free_bytes);
  return info;
}

}  // namespace traind::engine
