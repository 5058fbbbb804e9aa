// The device-runtime layer (device.h) on the CUDA runtime API. cudart only: never the driver API
// (libcuda), so binaries start on machines without a driver and report "no CUDA device" instead.
#include <cuda_runtime_api.h>

#include <string>

#include "backend/cuda/device.h"

TRAIND_GPU_BEGIN
namespace dev {
namespace {

Status Check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  const std::string msg =
      std::string(call) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation) return Status::ResourceExhausted(msg);
  if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevice)
    return Status::InvalidArgument(msg);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
    return Status::FailedPrecondition(msg);
  return Status::Internal(msg);
}

cudaMemcpyKind Kind(CopyKind k) {
  switch (k) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

}  // namespace

int DeviceCount(std::string* why) {
  int n = 0;  // cudaGetDeviceCount leaves it unwritten on error (35 without a driver)
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "the CUDA runtime reports 0 devices";
  return n;
}

Status SetDevice(int device) { return Check(cudaSetDevice(device), "cudaSetDevice"); }

Status DeviceInfo(std::string* name, size_t* total_bytes) {
  int device = 0;
  TRAIND_RETURN_IF_ERROR(Check(cudaGetDevice(&device), "cudaGetDevice"));
  cudaDeviceProp prop{};
  TRAIND_RETURN_IF_ERROR(Check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  *name = prop.name;
  *total_bytes = prop.totalGlobalMem;
  return Status::Ok();
}

Status MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  return Check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

Status Malloc(void** ptr, size_t bytes) { return Check(cudaMalloc(ptr, bytes), "cudaMalloc"); }
Status Free(void* ptr) { return Check(cudaFree(ptr), "cudaFree"); }
Status MallocHost(void** ptr, size_t bytes) {
  return Check(cudaMallocHost(ptr, bytes), "cudaMallocHost");
}
Status FreeHost(void* ptr) { return Check(cudaFreeHost(ptr), "cudaFreeHost"); }

Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  return Check(cudaMemcpyAsync(dst, src, bytes, Kind(kind), stream), "cudaMemcpyAsync");
}
Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height, CopyKind kind, cudaStream_t stream) {
  if (width == 0 || height == 0) return Status::Ok();
  return Check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, Kind(kind), stream),
               "cudaMemcpy2DAsync");
}
Status MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  return Check(cudaMemsetAsync(dst, value, bytes, stream), "cudaMemsetAsync");
}

Status StreamCreate(cudaStream_t* stream) {
  return Check(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking), "cudaStreamCreate");
}
Status StreamDestroy(cudaStream_t stream) {
  return Check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}
Status StreamSynchronize(cudaStream_t stream) {
  return Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}
Status DeviceSynchronize() { return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

Status EventCreate(cudaEvent_t* event) {
  return Check(cudaEventCreateWithFlags(event, cudaEventDisableTiming), "cudaEventCreate");
}
Status EventDestroy(cudaEvent_t event) {
  return Check(cudaEventDestroy(event), "cudaEventDestroy");
}
Status EventRecord(cudaEvent_t event, cudaStream_t stream) {
  return Check(cudaEventRecord(event, stream), "cudaEventRecord");
}
Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) {
  return Check(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
}
Status EventSynchronize(cudaEvent_t event) {
  return Check(cudaEventSynchronize(event), "cudaEventSynchronize");
}

Status BeginCapture(cudaStream_t stream) {
  return Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
}
Status EndCapture(cudaStream_t stream, cudaGraphExec_t* graph) {
  cudaGraph_t g = nullptr;
  TRAIND_RETURN_IF_ERROR(Check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture"));
  const Status s = Check(cudaGraphInstantiate(graph, g, 0), "cudaGraphInstantiate");
  (void)cudaGraphDestroy(g);  // the executable graph keeps what it needs
  return s;
}
Status GraphLaunch(cudaGraphExec_t graph, cudaStream_t stream) {
  return Check(cudaGraphLaunch(graph, stream), "cudaGraphLaunch");
}
Status GraphDestroy(cudaGraphExec_t graph) {
  return Check(cudaGraphExecDestroy(graph), "cudaGraphExecDestroy");
}

}  // namespace dev
TRAIND_GPU_END
