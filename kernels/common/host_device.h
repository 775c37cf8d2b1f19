// KVSPLIT_HOST_DEVICE marks math shared by the CPU backend and the CUDA kernels:
// `__host__ __device__` under nvcc, plain `inline` under a host compiler.
#pragma once

#if defined(__CUDACC__)
#define KVSPLIT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVSPLIT_HOST_DEVICE inline
#endif
