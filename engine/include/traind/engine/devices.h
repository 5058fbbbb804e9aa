// Devices the engine can train on, and what they offer (for metrics and admission).
// Device names (DeviceOptions.device): "cpu"; "cuda:N" (CUDA device N); "auto" (cuda:0 when a CUDA
// device is present, else the CPU); "simt" (development/test device: the CUDA kernels run on the
// CPU under the simt emulator; slow, for CI parity checks only).
// The engine library itself never depends on CUDA: the GPU backends are installed at start by
// RegisterGpuBackends() in binaries that link them (CMake target traind_gpu_backends).
#pragma once

#include <cstdint>
#include <string>

#include "traind/engine/status.h"

namespace traind::engine {

// How a job uses its device (RunOptions::device; EstimateJob).
struct DeviceOptions {
  // "cpu" | "cuda:N" | "auto" | "simt" (a development/test device); see devices.h. "cuda:N" and
  // "simt" need RegisterGpuBackends() at start; "auto" without a GPU uses the CPU with one note.
  std::string device = "cpu";
  int64_t memory_budget_bytes = 0;  // 0 = the device's capacity (host RAM on the CPU backend)
  int threads = 0;                  // CPU threads; 0 = all cores
  // GPU backends: after the first step, capture the training step as CUDA graphs (one per
  // micro-batch upload slot, one for the optimizer) and replay them on every later step, all
  // precisions. Off: every op is launched one by one.
  bool cuda_graphs = true;
};

struct DeviceInfo {
  std::string device;        // the resolved device: "cpu", "cuda:0", "simt" ("auto" resolved)
  std::string name;          // "NVIDIA H100 80GB HBM3", the CPU model, "simt emulator"
  int64_t total_bytes = 0;   // device memory (host RAM on the CPU; a nominal 16 GiB under simt)
  int64_t free_bytes = 0;    // free now (cudaMemGetInfo; free pages, _SC_AVPHYS_PAGES, on the CPU)
  // Peak FLOP/s: on the CPU an fp32 sgemm measured once per process (a few ms; all cores); on a
  // CUDA device the dense bf16 tensor-core peak from the product sheet for A100/H100/H200, 0 for
  // other devices (unknown); 0 under simt.
  double peak_flops = 0;
};

// What `device` is. INVALID_ARGUMENT for a name that is not one of the above; FAILED_PRECONDITION
// for "cuda:N" when no CUDA backend is registered or there is no such device (with the reason);
// FAILED_PRECONDITION for "simt" when it is not registered. "auto" never fails (CPU fallback).
Result<DeviceInfo> QueryDevice(const std::string& device);

// Installs the CUDA backend (when traind_cuda was built) and the simt device (when traind_simt was
// built) into the engine, so that RunJob/EstimateJob/QueryDevice accept "cuda:N" and "simt".
// Defined by the traind_gpu_backends library (link it, then call this once at the start of main);
// idempotent and thread-safe. Without it "cuda:N" fails with FAILED_PRECONDITION and "auto" uses
// the CPU.
void RegisterGpuBackends();

}  // namespace traind::engine
