# The GPU backend, built twice from the same sources (included by engine/CMakeLists.txt):
#   traind_simt  the .cu kernels compiled by the host compiler against backend/simt/simt.h and run
#                on CPU fibers (TRAIND_BUILD_SIMT; needs only the CUDA headers);
#   traind_cuda  the .cu kernels compiled by nvcc, cudart + cuBLASLt (TRAIND_BUILD_CUDA; needs nvcc).
# Never links libcuda (the driver API): binaries must start on machines without a driver.
set(TRAIND_GPU_DIR ${CMAKE_CURRENT_SOURCE_DIR}/src/backend)
file(GLOB TRAIND_GPU_KERNELS CONFIGURE_DEPENDS ${TRAIND_GPU_DIR}/cuda/*.cu)
# Host-side sources shared by both builds (the backend class, the launch-free helpers).
set(TRAIND_GPU_COMMON ${TRAIND_GPU_DIR}/cuda/gpu_backend.cc ${TRAIND_GPU_DIR}/cuda/batch_uploader.cc
    ${TRAIND_GPU_DIR}/cuda/host_staging.cc ${TRAIND_GPU_DIR}/cuda/cudnn_sdpa_select.cc)

find_path(TRAIND_CUDA_HEADERS cuda_bf16.h
  HINTS /usr/local/cuda/include ENV CUDA_HOME PATH_SUFFIXES include)

# ---- simt: kernels on the CPU ----
if(TRAIND_BUILD_SIMT AND TRAIND_CUDA_HEADERS)
  # Each .cu is compiled as C++ through a generated one-line wrapper (a source file cannot be
  # CUDA in one target and C++ in another).
  set(TRAIND_SIMT_WRAPPERS "")
  foreach(cu ${TRAIND_GPU_KERNELS})
    get_filename_component(stem ${cu} NAME_WE)
    set(wrapper ${CMAKE_CURRENT_BINARY_DIR}/simt_gen/${stem}_simt.cc)
    file(GENERATE OUTPUT ${wrapper} CONTENT "// generated: ${stem}.cu for the simt emulator\n#include \"${cu}\"\n")
    list(APPEND TRAIND_SIMT_WRAPPERS ${wrapper})
  endforeach()
  add_library(traind_simt STATIC
    ${TRAIND_GPU_DIR}/simt/simt_runtime.cc
    ${TRAIND_GPU_DIR}/simt/fiber_context.cc
    ${TRAIND_GPU_DIR}/simt/simt_device.cc
    ${TRAIND_GPU_DIR}/simt/simt_backend.cc
    ${TRAIND_GPU_DIR}/simt/simt_register.cc
    ${TRAIND_GPU_COMMON}
    ${TRAIND_SIMT_WRAPPERS})
  target_compile_definitions(traind_simt PUBLIC TRAIND_SIMT=1)
  target_include_directories(traind_simt PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_include_directories(traind_simt SYSTEM PUBLIC ${TRAIND_CUDA_HEADERS})
  target_link_libraries(traind_simt PUBLIC traind_engine Threads::Threads)
  # Kernel frames are probed page by page, so a fiber stack overflow hits its guard page.
  target_compile_options(traind_simt PUBLIC -fstack-clash-protection PRIVATE -O2)
  traind_warnings(traind_simt)
  # The wrappers include the .cu by absolute path; rebuild when a kernel changes.
  foreach(cu ${TRAIND_GPU_KERNELS})
    get_filename_component(stem ${cu} NAME_WE)
    set_source_files_properties(${CMAKE_CURRENT_BINARY_DIR}/simt_gen/${stem}_simt.cc
      PROPERTIES OBJECT_DEPENDS ${cu})
  endforeach()
endif()

# ---- CUDA: the same kernels through nvcc ----
if(TRAIND_BUILD_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT CMAKE_CUDA_HOST_COMPILER)   # check_language leaves it defined but empty
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)   # only the shared cudart, never cudart_static next to it
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)       # CUDA::cudart, CUDA::cublasLt
    add_library(traind_cuda STATIC
      ${TRAIND_GPU_KERNELS}
      ${TRAIND_GPU_DIR}/cuda/cuda_device.cc
      ${TRAIND_GPU_DIR}/cuda/cuda_backend.cc
      ${TRAIND_GPU_DIR}/cuda/cublaslt_gemm.cc
      ${TRAIND_GPU_DIR}/cuda/cuda_register.cc
      ${TRAIND_GPU_COMMON})
    target_include_directories(traind_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/src)
    # CMake 3.25 knows CUDA standards up to 17 only (CUDA20 is a configure error, and the CUDA
    # standard otherwise follows CMAKE_CXX_STANDARD=20): the kernels are C++17, the .cc files C++20.
    set_target_properties(traind_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
    target_compile_options(traind_cuda PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-O3 -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
    target_link_libraries(traind_cuda PUBLIC traind_engine CUDA::cudart CUDA::cublasLt)
    set_target_properties(traind_cuda PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    traind_warnings(traind_cuda)
    # cuDNN's fused SDPA as a second attention path (cuda/cudnn_sdpa.h): compiled where cudnn.h is;
    # libcudnn is opened with dlopen at first use, so nothing links it.
    find_path(TRAIND_CUDNN_HEADERS cudnn_backend.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include ENV CUDNN_HOME PATH_SUFFIXES include)
    if(TRAIND_CUDNN_HEADERS)
      target_sources(traind_cuda PRIVATE ${TRAIND_GPU_DIR}/cuda/cudnn_sdpa.cc)
      target_include_directories(traind_cuda SYSTEM PRIVATE ${TRAIND_CUDNN_HEADERS})
      target_compile_definitions(traind_cuda PRIVATE TRAIND_HAVE_CUDNN=1)
      target_link_libraries(traind_cuda PUBLIC ${CMAKE_DL_LIBS})
      message(STATUS "traind: cuDNN headers at ${TRAIND_CUDNN_HEADERS}: cuDNN SDPA path built")
    else()
      message(STATUS "traind: cudnn_backend.h not found, cuDNN SDPA path not built")
    endif()
  else()
    message(STATUS "traind: nvcc not found, CUDA backend not built "
                   "(pass -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)")
  endif()
endif()

# ---- traind_gpu_backends: RegisterGpuBackends() (traind/engine/devices.h) ----
# Binaries that may train on a GPU (traind, traind-run) link this and call RegisterGpuBackends()
# at start: it installs traind_cuda and traind_simt, whichever this build has, into the engine's
# device registry. traind_engine itself never depends on either.
add_library(traind_gpu_backends STATIC ${TRAIND_GPU_DIR}/cuda/gpu_register.cc)
target_link_libraries(traind_gpu_backends PUBLIC traind_engine)
if(TARGET traind_cuda)
  target_link_libraries(traind_gpu_backends PRIVATE traind_cuda)
  target_compile_definitions(traind_gpu_backends PRIVATE TRAIND_HAVE_CUDA_BACKEND=1)
endif()
if(TARGET traind_simt)
  # PRIVATE: link-only for users, so TRAIND_SIMT and the stack flags stay inside traind_simt.
  target_link_libraries(traind_gpu_backends PRIVATE traind_simt)
  target_compile_definitions(traind_gpu_backends PRIVATE TRAIND_HAVE_SIMT_BACKEND=1)
endif()
traind_warnings(traind_gpu_backends)
