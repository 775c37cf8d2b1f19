// `cudaStream_t` for host-side launcher declarations, without the device headers: the real
// runtime API type normally, the emulation harness's type under KVSPLIT_EMULATE_CUDA.
#pragma once

#if defined(KVSPLIT_EMULATE_CUDA)
#include "kernels/emulation/emu_runtime.h"
#else
#include <cuda_runtime_api.h>
#endif
