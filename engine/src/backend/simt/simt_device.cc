// The device-runtime layer (backend/cuda/device.h) for the simt emulator: "device" memory is host
// memory, work runs synchronously on the calling thread, and a captured graph is the list of
// launches, copies and memsets issued to the capturing stream, replayed in order.
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cuda/device.h"
#include "backend/simt/simt.h"

TRAIND_GPU_BEGIN
namespace dev {
namespace {

struct Graph {
  std::vector<std::function<void()>> steps;
};

// Runs `op` now, or records it when `stream` is capturing.
void Issue(cudaStream_t stream, std::function<void()> op) {
  simt::detail::StreamState* st = simt::detail::StateOf(stream);
  if (st != nullptr && st->capture != nullptr) {
    st->capture->push_back(std::move(op));
  } else {
    op();
  }
}

}  // namespace

int DeviceCount(std::string* why) { return 1; }
Status SetDevice(int device) {
  if (device != 0)
    return Status::InvalidArgument("simt has one device (0), asked for " + std::to_string(device));
  return Status::Ok();
}
Status DeviceInfo(std::string* name, size_t* total_bytes) {
  *name = "simt emulator (CPU)";
  *total_bytes = size_t{1} << 34;
  return Status::Ok();
}
Status MemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t{1} << 34;
  return Status::Ok();
}

Status Malloc(void** ptr, size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (*ptr == nullptr)
    return Status::ResourceExhausted("simt: out of host memory for " + std::to_string(bytes) +
                                     " bytes");
  return Status::Ok();
}
Status Free(void* ptr) {
  std::free(ptr);
  return Status::Ok();
}
Status MallocHost(void** ptr, size_t bytes) { return Malloc(ptr, bytes); }
Status FreeHost(void* ptr) { return Free(ptr); }

Status MemcpyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  Issue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return Status::Ok();
}
Status Memcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t height, CopyKind kind, cudaStream_t stream) {
  (void)kind;
  if (width == 0 || height == 0) return Status::Ok();
  if (dst_pitch < width || src_pitch < width) {
    return Status::InvalidArgument("cudaMemcpy2DAsync: a pitch smaller than the width");
  }
  Issue(stream, [dst, dst_pitch, src, src_pitch, width, height] {
    for (size_t r = 0; r < height; ++r) {
      std::memmove(static_cast<char*>(dst) + r * dst_pitch,
                   static_cast<const char*>(src) + r * src_pitch, width);
    }
  });
  return Status::Ok();
}
Status MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  Issue(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
  return Status::Ok();
}

Status StreamCreate(cudaStream_t* stream) {
  *stream = reinterpret_cast<cudaStream_t>(new simt::detail::StreamState());
  return Status::Ok();
}
Status StreamDestroy(cudaStream_t stream) {
  simt::detail::StreamState* st = simt::detail::StateOf(stream);
  if (st != nullptr) delete st->capture;
  delete st;
  return Status::Ok();
}
Status StreamSynchronize(cudaStream_t stream) {
  simt::detail::StreamState* st = simt::detail::StateOf(stream);
  if (st != nullptr && st->capture != nullptr)
    return Status::FailedPrecondition("stream synchronize while the stream is capturing a graph");
  return Status::Ok();
}
Status DeviceSynchronize() { return Status::Ok(); }

// Work is synchronous, so events are always complete.
Status EventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new int(0));
  return Status::Ok();
}
Status EventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<int*>(event);
  return Status::Ok();
}
Status EventRecord(cudaEvent_t event, cudaStream_t stream) { return Status::Ok(); }
Status StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) { return Status::Ok(); }
Status EventSynchronize(cudaEvent_t event) { return Status::Ok(); }

Status BeginCapture(cudaStream_t stream) {
  simt::detail::StreamState* st = simt::detail::StateOf(stream);
  if (st == nullptr)
    return Status::FailedPrecondition(
        "graph capture needs a created stream, not the default stream");
  if (st->capture != nullptr) return Status::FailedPrecondition("stream is already capturing");
  st->capture = new std::vector<std::function<void()>>();
  return Status::Ok();
}
Status EndCapture(cudaStream_t stream, cudaGraphExec_t* graph) {
  simt::detail::StreamState* st = simt::detail::StateOf(stream);
  if (st == nullptr || st->capture == nullptr)
    return Status::FailedPrecondition("EndCapture on a stream that is not capturing");
  auto* g = new Graph{std::move(*st->capture)};
  delete st->capture;
  st->capture = nullptr;
  *graph = reinterpret_cast<cudaGraphExec_t>(g);
  return Status::Ok();
}
Status GraphLaunch(cudaGraphExec_t graph, cudaStream_t stream) {
  auto* g = reinterpret_cast<Graph*>(graph);
  if (g == nullptr) return Status::InvalidArgument("GraphLaunch of a null graph");
  for (const auto& step : g->steps) Issue(stream, step);
  return Status::Ok();
}
Status GraphDestroy(cudaGraphExec_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return Status::Ok();
}

}  // namespace dev
TRAIND_GPU_END
