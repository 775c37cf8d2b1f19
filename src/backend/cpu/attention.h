// CPU paged attention (prefill and split-K decode). Owned by the attention engineer.
#pragma once

#include "backend/backend.h"
#include "common/thread_pool.h"
#include "kv/split_plan.h"
#include "kvsplit/status.h"

namespace kvsplit::backend {

Status cpu_attention_prefill(const backend::AttentionArgs& args, ThreadPool& pool);
Status cpu_attention_decode(const backend::AttentionArgs& args, const kv::SplitPlan& plan,
                            ThreadPool& pool);

}  // namespace kvsplit::backend
