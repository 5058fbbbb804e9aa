// The seam between the engine and the GPU backends: traind_cuda / traind_simt install their
// factories here (through RegisterGpuBackends, devices.h), and the trainer and planner open the
// device a job names through OpenDevice without depending on CUDA at build time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "traind/engine/devices.h"
#include "traind/engine/status.h"

namespace traind::engine {

// What traind_cuda provides. device_count: 0 (with the runtime's reason in `why`) when there is no
// driver or no device. make: MakeCudaBackend. query: name and memory of device N (no backend made).
struct CudaFactories {
  int (*device_count)(std::string* why) = nullptr;
  Result<std::unique_ptr<Backend>> (*make)(int device, bool allow_tf32) = nullptr;
  Result<DeviceInfo> (*query)(int device) = nullptr;
};
void InstallCudaFactories(const CudaFactories& factories);
// What traind_simt provides: MakeSimtBackend.
void InstallSimtFactory(Result<std::unique_ptr<Backend>> (*make)(int cpu_threads));

enum class DeviceKind { kCpu, kCuda, kAuto, kSimt };
struct DeviceName {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // N of "cuda:N"
};
// "cpu" (or ""), "auto", "simt", "cuda:N" with N a decimal >= 0; INVALID_ARGUMENT otherwise.
Result<DeviceName> ParseDeviceName(const std::string& device);

// The one table of device capabilities (backend.h's DeviceCapabilities) by kind: what each
// backend's capabilities() returns, and what the planner and the daemon's admission ask before a
// backend is open. kAuto has no capabilities of its own (resolve it first; it answers as kCuda).
DeviceCapabilities DeviceCapabilitiesOf(DeviceKind kind);
// (The by-name lookup, DeviceCapabilitiesOf(const std::string&), is public: devices.h.)

// OK when RunJob could open `device` now: INVALID_ARGUMENT for a bad name, FAILED_PRECONDITION for
// "cuda:N" without a CUDA backend or device (the reason in the message) or "simt" unregistered.
Status CheckDeviceAvailable(const std::string& device);

// The planner's budget when memory_budget_bytes is 0, from `free_bytes` of a device memory: 95% of
// it (the GPU backend's own scratch and cuBLASLt's workspace live outside the arena).
int64_t BudgetFromFreeBytes(int64_t free_bytes);

// The planner's budget for `options` without opening a backend: memory_budget_bytes when > 0,
// else host RAM (cpu, auto without a GPU), BudgetFromFreeBytes of cudaMemGetInfo (cuda:N), the
// nominal device size (simt). Errors as CheckDeviceAvailable.
Result<int64_t> DeviceBudget(const DeviceOptions& options);

struct OpenedDevice {
  std::unique_ptr<Backend> backend;
  std::string device;        // resolved name: "cpu", "cuda:0", "simt"
  int64_t budget_bytes = 0;  // as DeviceBudget, measured after the backend started
};
// Opens the backend for options.device. "auto" without a CUDA device calls `note` once with a line
// saying no GPU was found and the CPU backend is used. allow_tf32: CUDA fp32 GEMMs on TF32.
Result<OpenedDevice> OpenDevice(const DeviceOptions& options, bool allow_tf32,
                                const std::function<void(const std::string&)>& note);

}  // namespace traind::engine
