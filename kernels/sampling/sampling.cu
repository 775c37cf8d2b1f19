// Launcher of the sampling kernel (the one dispatch site of the family). Compiled by nvcc
// (kvsplit_cuda) and by g++ under the emulation harness.
#include <cmath>
#include <string>

#include "kernels/common/launch_status.h"
#include "kernels/sampling/sampling.cuh"

namespace kvsplit::kernels {

Status launch_sample(const float* logits, int num_rows, int vocab, const SampleRowParams* params,
                     int32_t* ids, cudaStream_t stream) {
  if (num_rows < 0) return invalid_argument("sample: negative num_rows");
  if (vocab < 1 || vocab > kSampleMaxVocab)
    return invalid_argument("sample: vocab " + std::to_string(vocab) + " outside [1, " +
                            std::to_string(kSampleMaxVocab) + "]");
  if (num_rows == 0) return ok_status();
  if (!logits || !params || !ids) return invalid_argument("sample: null pointer");
  return launch_status(launch(sample_kernel, dim3(static_cast<unsigned>(num_rows)),
                              dim3(kSampleThreads), 0, stream, logits, vocab, params, ids),
                       "sample");
}

Status validate_sample_params(const SampleRowParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0.f)
    return invalid_argument("sample: temperature must be finite and >= 0, got " +
                            std::to_string(p.temperature));
  if (!(p.top_p > 0.f && p.top_p <= 1.f))
    return invalid_argument("sample: top_p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0.f && p.min_p <= 1.f))
    return invalid_argument("sample: min_p must be in [0, 1], got " + std::to_string(p.min_p));
  if (p.top_k < 0)
    return invalid_argument("sample: top_k must be >= 0, got " + std::to_string(p.top_k));
  return ok_status();
}

}  // namespace kvsplit::kernels
