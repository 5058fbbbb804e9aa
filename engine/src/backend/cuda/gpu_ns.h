// The namespace of the GPU backend's code. The same sources build twice: for CUDA (nvcc + cudart)
// and for the simt emulator (g++, TRAIND_SIMT defined); an inline namespace per build keeps the
// two sets of symbols apart when both libraries end up in one binary.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t, cudaEvent_t (plain host declarations)

#if defined(TRAIND_SIMT)
#define TRAIND_GPU_IMPL simt_impl
#else
#define TRAIND_GPU_IMPL cuda_impl
#endif
#define TRAIND_GPU_BEGIN          \
  namespace traind::engine::gpu { \
  inline namespace TRAIND_GPU_IMPL {
#define TRAIND_GPU_END \
  }                    \
  }
