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

// What sets one device's training policy apart from another's: the trainer, the planner, admission
// and the communicator ask these, never the device's name. An open backend answers through its
// capabilities(); before one is open, DeviceCapabilitiesOf below answers for a device name.
struct DeviceCapabilities {
  // An op's work has finished when its call returns (no stream, cpu): the host may read what an
  // op wrote right after it, so the offloaded update may run during backward's per-block hook.
  bool ops_complete_on_return = false;
  // The device has a memory of its own apart from the host's (cuda:N, simt): the offloaded
  // optimizer updates on the host, and a host collective (Gloo) cannot reduce its buffers.
  bool has_own_memory = true;
  // Its GEMMs keep packed copies of weights (the cpu backend's oneDNN; CpuPacksGemmB by type).
  bool packs_gemm_weights = false;
  // Tensor cores (cuda:N, sm_80+): fp32 GEMMs may run on TF32 (training.tf32) and 16-bit batches
  // align to 64 rows.
  bool tensor_cores = false;
  // The communicator that reduces this device's memory in data parallel: "nccl" (cuda:N); empty
  // when only host collectives apply (cpu: any host communicator) or none does (simt).
  std::string device_collective;
  // Whether data parallel can reduce this device's buffers at all (cpu with a host communicator,
  // cuda:N with NCCL; not simt).
  bool data_parallel() const { return !has_own_memory || !device_collective.empty(); }
  // Whether the offloaded optimizer's update may start during backward (a block's gradients are
  // final on the host's view when the hook runs).
  bool update_overlaps_backward() const { return ops_complete_on_return; }
};

// The capabilities of the device `device` names ("cpu", "cuda:N", "simt"; "auto" as RunJob resolves
// it: cuda:0 when a CUDA device is there, else cpu), from the one table the backends' own
// capabilities() answer from (the device registry): what the planner, the daemon's admission and
// the communicator ask before a backend is open. INVALID_ARGUMENT for a bad name.
Result<DeviceCapabilities> DeviceCapabilitiesOf(const std::string& device);

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
