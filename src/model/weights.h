// Host-side weights of a loaded model: views into memory-mapped files (or into buffers the loader
// owns, for synthetic models). Nothing is copied on load; the backend decides at upload.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/dtype.h"

namespace kvsplit::model {

// A tensor of weights in host memory, row-major. Matrices are [out_features, in_features].
struct WeightTensor {
  const void* data = nullptr;
  backend::DType dtype = backend::DType::kF32;
  std::vector<int64_t> shape;
  std::string name;  // as the file names it ("model.layers.0.self_attn.q_proj.weight"); may be ""

  bool present() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct LayerWeights {
  WeightTensor attn_norm;             // [dim]
  WeightTensor wq, wk, wv, wo;        // [q_dim, dim], [kv_dim, dim], [kv_dim, dim], [dim, q_dim]
  WeightTensor bq, bk, bv;            // [q_dim], [kv_dim], [kv_dim]; present only with qkv_bias
  WeightTensor ffn_norm;              // [dim]
  WeightTensor w_gate, w_up, w_down;  // [hidden, dim], [hidden, dim], [dim, hidden]
};

struct ModelWeights {
  WeightTensor embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;
  WeightTensor final_norm;  // [dim]
  WeightTensor lm_head;     // [vocab, dim]; aliases `embedding` when tied
  // Keep-alive handles for the memory the views point into (mmaps, owned buffers).
  std::vector<std::shared_ptr<const void>> storage;
};

}  // namespace kvsplit::model
