// A Backend that forwards every call to another one: the base of test backends that make a few
// calls fail or take longer (fault injection) and leave everything else as the real backend does.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "backend/backend.h"

namespace kvsplit::testing {

class ForwardingBackend : public backend::Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<backend::Backend> inner) : in_(std::move(inner)) {}

  backend::DeviceKind kind() const override { return in_->kind(); }
  std::string name() const override { return "forwarding " + in_->name(); }
  int parallelism() const override { return in_->parallelism(); }
  StatusOr<void*> alloc(size_t bytes) override { return in_->alloc(bytes); }
  void free(void* p) override { in_->free(p); }
  Status copy_h2d(void* d, const void* s, size_t n) override { return in_->copy_h2d(d, s, n); }
  Status copy_d2h(void* d, const void* s, size_t n) override { return in_->copy_d2h(d, s, n); }
  Status copy_d2d(void* d, const void* s, size_t n) override { return in_->copy_d2d(d, s, n); }
  Status memset_zero(void* d, size_t n) override { return in_->memset_zero(d, n); }
  Status synchronize() override { return in_->synchronize(); }
  Status read_for_peer(void* d, const void* s, size_t n) override {
    return in_->read_for_peer(d, s, n);
  }
  StatusOr<void*> alloc_host(size_t bytes) override { return in_->alloc_host(bytes); }
  void free_host(void* p) override { in_->free_host(p); }
  bool host_memory_pinned() const override { return in_->host_memory_pinned(); }
  Status copy_d2h_async(void* d, const void* s, size_t n) override {
    return in_->copy_d2h_async(d, s, n);
  }
  Status copy_h2d_async(void* d, const void* s, size_t n) override {
    return in_->copy_h2d_async(d, s, n);
  }
  void set_batch_copy_method(BatchCopyMethod m) override { in_->set_batch_copy_method(m); }
  StatusOr<int> mark_time() override { return in_->mark_time(); }
  StatusOr<double> seconds_between(int from, int to) override {
    return in_->seconds_between(from, to);
  }
  void release_time_marks() override { in_->release_time_marks(); }
  Status copy_batch_async(CopyDir dir, const CopyRange* c, size_t n) override {
    return in_->copy_batch_async(dir, c, n);
  }
  StatusOr<uint64_t> copy_batch_fenced(CopyDir dir, const CopyRange* c, size_t n) override {
    return in_->copy_batch_fenced(dir, c, n);
  }
  StatusOr<bool> wait_fence(uint64_t fence, int64_t timeout_us) override {
    return in_->wait_fence(fence, timeout_us);
  }
  int device() const override { return in_->device(); }
  Status bind_thread() override { return in_->bind_thread(); }
  bool can_read_from(const Backend& src) override { return src.kind() == kind(); }
  Status copy_from(void* d, const Backend& src, const void* s, size_t n) override {
    return in_->copy_from(d, src, s, n);
  }
  StatusOr<backend::MatrixView> upload_matrix(const void* h, backend::DType t, int64_t r,
                                              int64_t c) override {
    return in_->upload_matrix(h, t, r, c);
  }
  Status embedding(const int32_t* ids, int n, const backend::MatrixView& t, float* o) override {
    return in_->embedding(ids, n, t, o);
  }
  Status rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* o) override {
    return in_->rmsnorm(x, w, n, dim, eps, o);
  }
  Status add_rmsnorm(float* r, const float* x, const float* w, int n, int dim, float eps,
                     float* o) override {
    return in_->add_rmsnorm(r, x, w, n, dim, eps, o);
  }
  Status gemm(const float* x, int m, const backend::MatrixView& w, const float* b, float* o,
              bool acc) override {
    return in_->gemm(x, m, w, b, o, acc);
  }
  Status rope(float* q, float* k, const int32_t* p, int n, int h, int hkv,
              const backend::RopeArgs& a) override {
    return in_->rope(q, k, p, n, h, hkv, a);
  }
  Status swiglu(const float* g, const float* u, int64_t n, float* o) override {
    return in_->swiglu(g, u, n, o);
  }
  Status kv_append(const backend::LayerKv& kv, const float* k, const float* v, const int32_t* s,
                   int n) override {
    return in_->kv_append(kv, k, v, s, n);
  }
  Status attention_prefill(const backend::AttentionArgs& a) override {
    return in_->attention_prefill(a);
  }
  Status attention_decode(const backend::AttentionArgs& a, const backend::SplitPlan& p) override {
    return in_->attention_decode(a, p);
  }
  Status quantize_kv_page(const void* s, backend::DType t, const kernels::QuantPageLayout& l,
                          kernels::KvPrecision to, void* d) override {
    return in_->quantize_kv_page(s, t, l, to, d);
  }
  Status dequantize_kv_page(const void* s, kernels::KvPrecision from,
                            const kernels::QuantPageLayout& l, void* d, backend::DType t) override {
    return in_->dequantize_kv_page(s, from, l, d, t);
  }
  Status summarize_kv_page(const void* s, backend::DType t, const kernels::QuantPageLayout& l,
                           kernels::KvSummaryElem* d) override {
    return in_->summarize_kv_page(s, t, l, d);
  }
  Status merge_attention_states(const float* const* o, const float* const* lse, int parts,
                                int64_t rows, int d, float* out, float* lse_out) override {
    return in_->merge_attention_states(o, lse, parts, rows, d, out, lse_out);
  }
  bool has_sample_tokens() const override { return in_->has_sample_tokens(); }
  Status check_model_attention(int head_dim, int gqa_group) const override {
    return in_->check_model_attention(head_dim, gqa_group);
  }
  Status sample_tokens(const float* logits, int rows, int vocab, const backend::SamplingRow* r,
                       int32_t* ids) override {
    return in_->sample_tokens(logits, rows, vocab, r, ids);
  }

 protected:
  backend::Backend& inner() { return *in_; }

 private:
  std::unique_ptr<backend::Backend> in_;
};

}  // namespace kvsplit::testing
