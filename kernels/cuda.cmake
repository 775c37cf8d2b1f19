# Included by kernels/CMakeLists.txt when nvcc exists: the real kernels (nvcc, sm_80 + sm_90 by
# default via CMAKE_CUDA_ARCHITECTURES) and the CUDA backend (host C++, CUDA runtime + cuBLAS/cuBLASLt).
file(GLOB KVSPLIT_CUDA_KERNEL_SOURCES CONFIGURE_DEPENDS
  ${CMAKE_CURRENT_SOURCE_DIR}/attention/*.cu ${CMAKE_CURRENT_SOURCE_DIR}/kv_pages/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/ops/*.cu
  ${CMAKE_CURRENT_SOURCE_DIR}/sampling/*.cu)
file(GLOB KVSPLIT_CUDA_BACKEND_SOURCES CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cpp)
# The NCCL communicator only when NCCL was found (top-level CMakeLists.txt, KVSPLIT_WITH_NCCL).
if(NOT KVSPLIT_WITH_NCCL)
  list(FILTER KVSPLIT_CUDA_BACKEND_SOURCES EXCLUDE REGEX "/nccl_[^/]*\\.cpp$")
endif()

add_library(kvsplit_cuda STATIC ${KVSPLIT_CUDA_KERNEL_SOURCES} ${KVSPLIT_CUDA_BACKEND_SOURCES})
target_link_libraries(kvsplit_cuda PUBLIC kvsplit_backend CUDA::cudart CUDA::cublas CUDA::cublasLt)
if(KVSPLIT_WITH_NCCL)
  target_link_libraries(kvsplit_cuda PRIVATE kvsplit_nccl_lib)
endif()
# Device code: no fast-math (parity with the CPU oracle), relocatable code not needed.
target_compile_options(kvsplit_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wno-unused-parameter>)
set_target_properties(kvsplit_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                              POSITION_INDEPENDENT_CODE ON)

# Benchmark-only kernels (the read-bandwidth probe of bench_attention): not in the library the
# engine links.
add_library(kvsplit_cuda_bench STATIC ${CMAKE_CURRENT_SOURCE_DIR}/bench/stream_read.cu)
target_link_libraries(kvsplit_cuda_bench PUBLIC kvsplit_kernels_host kvsplit_common CUDA::cudart)
target_compile_options(kvsplit_cuda_bench PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wno-unused-parameter>)
