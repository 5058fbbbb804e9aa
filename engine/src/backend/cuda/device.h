// The thin device-runtime layer under the GPU backend: memory, copies, streams, events and graph
// capture/replay. Two implementations with one interface: cuda/cuda_device.cc (the CUDA runtime
// API, cudart only) and simt/simt_device.cc (host memory; a graph is the recorded list of launches
// and copies, replayed in order). Every call returns OK or a Status naming the call and the error.
// Thread safety: as the CUDA runtime (streams are not shared between host threads here).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/gpu_ns.h"
#include "traind/engine/status.h"

TRAIND_GPU_BEGIN
namespace dev {

// The number of devices; 0 (and OK) when there is no driver or no device (the CUDA runtime
// reports cudaErrorInsufficientDriver there and leaves its count unwritten). The error text of the
// runtime is put in `why` when non-null.
int DeviceCount(std::string* why);
Status SetDevice(int device);
// Name and total memory of the current device.
Status DeviceInfo(std::string* name, size_t* total_bytes);
Status MemGetInfo(size_t* free_bytes, size_t* total_bytes);

// RESOURCE_EXHAUSTED when out of memory. Device memory is 256-byte aligned.
Status Malloc(void** ptr, size_t bytes);
Status Free(void* ptr);
// Page-locked host memory for asynchronous copies (plain host memory under simt).
Status MallocHost(void** ptr, size_t bytes);
Status FreeHost(void* ptr);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, cudaStream_t stream);
// `height` rows of `width` bytes, row r from src + r * src_pitch to dst + r * dst_pitch
// (cudaMemcpy2DAsync; pitches >= width).
Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height, CopyKind kind, cudaStream_t stream);
Status MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream);

Status StreamCreate(cudaStream_t* stream);
Status StreamDestroy(cudaStream_t stream);
Status StreamSynchronize(cudaStream_t stream);
Status DeviceSynchronize();

Status EventCreate(cudaEvent_t* event);
Status EventDestroy(cudaEvent_t event);
Status EventRecord(cudaEvent_t event, cudaStream_t stream);
Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event);
Status EventSynchronize(cudaEvent_t event);

// Graph capture: between BeginCapture and EndCapture, work issued to `stream` is recorded, not
// run. EndCapture returns an executable graph; GraphLaunch replays it on a stream.
Status BeginCapture(cudaStream_t stream);
Status EndCapture(cudaStream_t stream, cudaGraphExec_t* graph);
Status GraphLaunch(cudaGraphExec_t graph, cudaStream_t stream);
Status GraphDestroy(cudaGraphExec_t graph);

}  // namespace dev
TRAIND_GPU_END
