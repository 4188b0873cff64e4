# CUDA + NCCL backend of the runtime (runtime/backends/cuda/). HZP_CUDA=AUTO builds it when nvcc and NCCL are
# found, ON requires them, OFF skips it. Architectures default to Hopper (90): `native` fails on machines
# without a GPU, and CI (no GPU) must still compile every kernel for sm_90.
set(HZP_HAVE_CUDA OFF)
if(NOT HZP_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(CMAKE_CUDA_COMPILER AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(HZP_HAVE_CUDA ON)
  elseif(HZP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "HZP_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or NCCL (${NCCL_INCLUDE_DIR}, "
                        "${NCCL_LIBRARY}) was not found. Use HZP_CUDA=AUTO or OFF to build without CUDA.")
  endif()
endif()

if(HZP_HAVE_CUDA)
  add_library(hzp_nccl IMPORTED UNKNOWN)
  set_target_properties(hzp_nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                                             INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
  # The backend's sources join the runtime library (registry.cc names make_cuda_device).
  target_sources(hzp_runtime PRIVATE
    runtime/backends/cuda/attention.cu
    runtime/backends/cuda/cuda_comm.cc
    runtime/backends/cuda/cuda_device.cc
    runtime/backends/cuda/cuda_kernels.cc
    runtime/backends/cuda/cuda_probe.cu
    runtime/backends/cuda/elementwise.cu
    runtime/backends/cuda/flash_attention.cu
    runtime/backends/cuda/flash_mma.cu
    runtime/backends/cuda/gemm.cu
    runtime/backends/cuda/moe.cu
    runtime/backends/cuda/norms.cu
  )
  # CMake 3.25 knows no C++20 flag for nvcc (which has one since CUDA 12): declare it, so the project's C++20
  # reaches the kernels, which include the interface headers.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  set_target_properties(hzp_runtime PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CUDA_STANDARD 20
                                               CUDA_STANDARD_REQUIRED ON CUDA_EXTENSIONS OFF)
  target_compile_options(hzp_runtime PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  # Runtime API only: a binary linked to the driver API (libcuda) does not start on a machine without a GPU.
  target_link_libraries(hzp_runtime PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt hzp_nccl)
  target_compile_definitions(hzp_runtime PRIVATE HZP_HAVE_CUDA=1 HZP_HAVE_CUDA_BACKEND=1)
  message(STATUS "hzp: CUDA + NCCL backend ON (architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "hzp: CUDA + NCCL backend OFF (HZP_CUDA=${HZP_CUDA})")
endif()
