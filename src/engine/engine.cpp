#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/shard_placement.h"
#include "common/check.h"
#include "common/config_rules.h"
#include "common/escape.h"
#include "common/log.h"
#include "common/random_id.h"
#include "common/splitmix.h"
#include "engine/engine_impl.h"
#include "kv/kv_pool.h"
#include "model/guide_vocabulary.h"
#include "model/llama_model.h"
#include "sched/step_model.h"

namespace kvsplit {
namespace {

constexpr std::string_view kAssignedIdPrefix = "req-";  // + 32 random hex digits

std::string class_names(const std::vector<SlaClass>& classes) {
  std::string out;
  for (const SlaClass& c : classes) out += (out.empty() ? "" : ", ") + c.name;
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  KVSPLIT_ASSIGN_OR_RETURN(std::unique_ptr<EngineImpl> impl, EngineImpl::create(config));
  return std::unique_ptr<Engine>(std::move(impl));
}

EngineImpl::EngineImpl(const EngineConfig& config)
    : config_(config),
      kvm_semantic_(config.semantic),
      kvm_temporal_(config.temporal),
      spatial_min_context_(config.spatial.min_context) {}

StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::create(const EngineConfig& config,
                                                         const InternalOptions& internal) {
  KVSPLIT_RETURN_IF_ERROR(validate_engine_config(config));
  std::unique_ptr<EngineImpl> e(new EngineImpl(config));
  model::LoadOptions load_options;
  load_options.tokenizer_path = config.tokenizer;
  KVSPLIT_ASSIGN_OR_RETURN(model::LoadedModel loaded,
                           model::load_model(config.model, load_options));
  if (!loaded.tokenizer) return failed_precondition("Engine: the model has no tokenizer");
  e->loaded_ = std::make_unique<model::LoadedModel>(std::move(loaded));
  const model::ModelConfig& mc = e->loaded_->config;
  if (config.spatial.shards > 1 && mc.has_sliding_window())
    return unimplemented(
        "kv.cuts.spatial.shards > 1: the spatial cut does not support sliding-window attention, "
        "and the model has windowed layers (sliding_window)");

  const bool disagg = config.mode == ServingMode::kDisaggregated;
  const int num_prefill = disagg ? config.num_prefill_workers : 0;
  const int num_workers = num_prefill + config.num_decode_workers;
  int threads = config.threads_per_worker;
  if (threads == 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / num_workers);
  }

  e->router_ = std::make_unique<sched::Router>(config.sla_classes, [raw = e.get()] {
    for (auto& w : raw->workers_) {
      if (w->role() != sched::WorkerRole::kDecode) w->wake();
    }
  });
  e->given_classes_ = config.sla_classes;
  e->shared_.router = e->router_.get();
  e->shared_.sink = e.get();
  for (const SlaClass& c : config.sla_classes) e->class_stats_.push_back(SlaClassStats{c.name});

  // Workers' devices: round-robin over config.devices, else over the visible devices.
  std::vector<int32_t> devices = config.devices;
  if (devices.empty()) {
    const int visible = config.backend == "cuda" ? backend::visible_devices("cuda") : 1;
    for (int d = 0; d < std::max(1, visible); ++d) devices.push_back(d);
  }
  int min_blocks = 0;
  for (int i = 0; i < num_workers; ++i) {
    sched::WorkerOptions wo;
    const bool prefill = i < num_prefill;
    wo.role = !disagg ? sched::WorkerRole::kColocated
                      : (prefill ? sched::WorkerRole::kPrefill : sched::WorkerRole::kDecode);
    wo.name = !disagg ? fmt::format("colocated-{}", i)
                      : (prefill ? fmt::format("prefill-{}", i)
                                 : fmt::format("decode-{}", i - num_prefill));
    wo.max_num_seqs = config.max_num_seqs;
    wo.max_batch_tokens = config.max_batch_tokens;
    wo.min_chunk_tokens = std::min(config.block_size, config.max_batch_tokens);
    wo.max_chunk_tokens = config.max_chunk_tokens;
    wo.max_chunk_ms = config.max_chunk_ms;
    wo.max_chunk_ms_auto = config.max_chunk_ms_auto;
    wo.max_unread_events = config.max_unread_events;
    // Enough prompts in progress to fill a step's budget at the smallest chunk.
    wo.max_prefill_seqs =
        sched::default_max_prefill_seqs(config.max_batch_tokens, wo.min_chunk_tokens);
    wo.handoff_timeout = std::chrono::milliseconds(config.handoff_timeout_ms);
    wo.handoff_stall = std::chrono::milliseconds(config.handoff_stall_ms);
    wo.cache_aware_handoffs = config.cache_aware_handoffs;
    wo.forward_waiting_handoffs = config.forward_waiting_handoffs;
    wo.slot_aware_handoffs = internal.slot_aware_handoffs;
    wo.take_back_from_down = internal.take_back_from_down;
    if (wo.role == sched::WorkerRole::kDecode)
      wo.handoff_copy_fault_hook = internal.handoff_copy_fault_hook;
    // The backend's threads are idle while a step samples: as many sampling threads by default.
    wo.sampling_threads = internal.sampling_threads > 0 ? internal.sampling_threads : threads;
    // Pages change state only where sequences decode.
    const bool decodes = wo.role != sched::WorkerRole::kPrefill;
    if (decodes) {
      wo.kv_policy = config.kv_policy;
      wo.semantic = config.semantic;
      wo.temporal = config.temporal;
      wo.speculative = config.speculative;
    } else {
      wo.temporal.swap = SwapMode::kNever;  // its tiers hold the prefix cache's spilled pages only
    }
    backend::BackendOptions bo;
    bo.threads = threads;
    bo.async_copies = config.async_copies;
    bo.fenced_copy_delay_us = internal.fenced_copy_delay_us;
    bo.device = devices[static_cast<size_t>(i) % devices.size()];
    bo.weight_dtype = internal.weight_dtype;
    auto created = backend::create_backend(config.backend, bo);
    if (!created.ok()) return created.status().with_prefix(wo.name);
    std::unique_ptr<backend::Backend> be = std::move(created).value();
    auto lm = model::LlamaModel::create(*e->loaded_, *be);
    if (!lm.ok()) return lm.status().with_prefix(wo.name);
    kv::KvPoolConfig pc;
    pc.num_blocks = config.kv_blocks_per_worker;
    pc.block_size = config.block_size;
    pc.capacity_bytes = config.kv_capacity_bytes;
    const kv::KvShape shape = (*lm)->kv_shape();
    if (decodes && config.kv_policy == KvPolicy::kSemantic && config.kv_quant_fraction > 0.0) {
      // One budget split between the rungs.
      Status st = sched::SequenceCut::split_budget(config.semantic, pc.capacity_bytes,
                                                   config.kv_quant_fraction, shape, &pc);
      if (!st.ok()) return st.with_prefix(wo.name);
    } else if (decodes && config.kv_policy != KvPolicy::kFull) {
      // Tiers for as many pages as the full pool has blocks (one sequence may hold them all).
      const int64_t block_bytes = kv::KvPool::block_bytes(pc, shape);
      const int64_t blocks = pc.num_blocks > 0 ? pc.num_blocks : pc.capacity_bytes / block_bytes;
      if (blocks < 1 || blocks > (int64_t{1} << 26)) {
        return invalid_argument(
            fmt::format("{}: kv_capacity_bytes {} gives {} KV blocks of {} bytes", wo.name,
                        pc.capacity_bytes, blocks, block_bytes));
      }
      sched::SequenceCut::size_tiers(config.kv_policy, config.semantic, static_cast<int>(blocks),
                                     shape, &pc);
    }
    // With a shard group every shard's pages keep their originals in this (home) host tier.
    if (decodes && config.kv_policy != KvPolicy::kFull && config.spatial.shards > 1)
      pc.host_bytes = std::min<int64_t>(pc.host_bytes * config.spatial.shards,
                                        config.semantic.host_capacity_mb << 20);
    // The temporal cut's host tier for swapped-out pages, beside the semantic cut's originals;
    // a prefill worker's prefix cache spills to a host and disk tier of the same sizes. A decode
    // worker's cache holds what its recompute preemptions leave (Worker::preempt).
    const bool prefix = config.prefix_cache;
    const bool tiers = decodes || prefix;
    if (tiers) pc.host_bytes += config.temporal.host_capacity_mb << 20;
    auto pool = kv::KvPool::create(*be, pc, shape);
    if (!pool.ok()) return pool.status().with_prefix(wo.name);
    if (prefix) {
      (*pool)->enable_prefix_cache();
      (*pool)->set_prefix_free_target(config.prefix_spill_ahead_blocks);
    }
    if (tiers && !config.temporal.disk_path.empty()) {
      Status st = (*pool)->open_disk_tier(config.temporal.disk_path + "/" + wo.name,
                                          config.temporal.disk_capacity_mb << 20,
                                          config.temporal.disk_direct_io);
      if (!st.ok()) return st.with_prefix(wo.name + ": kv.disk");
      (*pool)->set_disk_write_behind(config.temporal.disk_write_behind);
      if (internal.disk_fault_hook) (*pool)->disk()->set_fault_hook(internal.disk_fault_hook);
    }
    if (config.spatial.shards > 1) {  // the spatial cut: the worker's pool is shard 0
      std::vector<std::unique_ptr<backend::Backend>> peers;
      for (int s = 1; s < config.spatial.shards; ++s) {
        backend::BackendOptions so = bo;
        // Each peer shard: its own thread group of `threads` (its job thread and threads - 1 pool
        // workers, model/sharded_attention.h). They run only during the step's attention and
        // must not poll the cores away from the home's GEMMs when idle.
        so.spin_micros = 0;
        // CUDA: shard s of worker i on devices[(i + s) % size] (backend/shard_placement.h): one
        // device gives virtual shards (a CudaBackend, so a stream, each), several one per shard.
        // The CPU backend keeps the worker's virtual device id.
        if (config.backend == "cuda") {
          auto dev = backend::shard_device(devices, i, s);
          if (!dev.ok()) return dev.status().with_prefix(wo.name + ": spatial shard");
          so.device = *dev;
        }
        auto shard_be = backend::create_backend(config.backend, so);
        if (!shard_be.ok()) return shard_be.status().with_prefix(wo.name + ": spatial shard");
        peers.push_back(std::move(shard_be).value());
      }
      Status st = (*pool)->add_shards(std::move(peers), config.spatial.spatial_chunk_size);
      if (!st.ok()) return st.with_prefix(wo.name + ": kv.cuts.spatial");
      // The group's communicator (kv.cuts.spatial.communicator; backend/communicator.h rule).
      auto comm =
          backend::make_shard_communicator(config.spatial.communicator, (*pool)->shard_backends());
      if (!comm.ok()) return comm.status().with_prefix(wo.name);
      if (comm->fell_back) {
        KVSPLIT_LOG_WARN("{}: spatial cut, {} shards, communicator {}", wo.name,
                         config.spatial.shards, comm->reason);
      } else {
        KVSPLIT_LOG_INFO("{}: spatial cut, {} shards, communicator {}", wo.name,
                         config.spatial.shards, comm->reason);
      }
      (*pool)->set_communicator(std::move(comm->comm));
    }
    const int blocks = (*pool)->total_blocks();
    min_blocks = i == 0 ? blocks : std::min(min_blocks, blocks);
    e->workers_.push_back(std::make_unique<sched::Worker>(
        std::move(wo), std::move(be),
        std::make_unique<sched::LlamaStepModel>(std::move(lm).value()), std::move(pool).value(),
        &e->shared_));
  }
  for (int i = num_prefill; i < num_workers; ++i) {
    if (disagg) e->shared_.decode_workers.push_back(e->workers_[i].get());
  }
  e->limits_.vocab_size = mc.vocab_size;
  // Prefill workers pull from the router; colocated ones (the decode pool of colocated mode) too.
  e->router_pullers_ = disagg ? num_prefill : num_workers;
  e->limits_.max_context = mc.max_seq_len;
  e->limits_.block_size = config.block_size;
  e->limits_.kv_blocks_per_worker = min_blocks;
  if (config.spatial.shards <= 1) {  // the spatial cut refuses windowed models anyway
    e->limits_.kv_window = mc.kv_window();
    e->limits_.chunk_tokens = config.max_chunk_tokens > 0
                                  ? std::min(config.max_chunk_tokens, config.max_batch_tokens)
                                  : config.max_batch_tokens;
  }
  for (auto& w : e->workers_) w->start();
  if (config.kvm.enabled) KVSPLIT_RETURN_IF_ERROR(e->update_kvm_policy(config.kvm));
  KVSPLIT_LOG_INFO(
      "Engine: {} ({} mode, {} workers x {} threads, {} KV blocks of {} tokens each, KV policy "
      "{})",
      e->loaded_->source, disagg ? "disaggregated" : "colocated", num_workers, threads, min_blocks,
      config.block_size, kv_policy_name(config.kv_policy));
  return e;
}

EngineImpl::~EngineImpl() { shutdown(std::chrono::milliseconds(0)); }

std::unique_ptr<sched::Sequence> EngineImpl::make_sequence(
    const Request& request, std::shared_ptr<sched::RequestControl> ctl, int64_t arrival,
    std::vector<int32_t> ids, const SlaClass& cls, int class_index,
    const std::shared_ptr<sampling::GuideGrammar>& grammar) {
  const model::ModelConfig& mc = loaded_->config;
  auto seq = std::make_unique<sched::Sequence>();
  seq->ctl = std::move(ctl);
  seq->arrival = arrival;
  seq->priority = sched::effective_priority(cls.priority, request.priority);
  seq->class_index = class_index;
  seq->sla = cls;
  seq->params = request.sampling;
  seq->top_logprobs = request.top_logprobs;
  seq->prompt_logprobs = seq->ctl->index == 0 ? request.prompt_logprobs : -1;
  // Tenants never share cached pages: the salt covers the tenant and the request's cache_salt.
  std::string scope = request.tenant;
  scope.push_back('\0');
  scope += request.cache_salt;
  seq->prefix_salt = kv::PrefixCache::salt_of(scope);
  seq->num_prompt = static_cast<int>(ids.size());
  const int32_t last_prompt = ids.back();
  seq->tokens = std::move(ids);
  seq->tokens.reserve(seq->num_prompt + max_generated_tokens(request.sampling));
  // Completion i of a seeded request: seed + i (what the request with n = 1 and that seed draws).
  const uint64_t seed = request.sampling.seed
                            ? *request.sampling.seed + static_cast<uint64_t>(seq->ctl->index)
                            : splitmix64(config_.seed ^ splitmix64(seq->arrival));
  seq->sampler = std::make_unique<sampling::Sampler>(request.sampling, seed, mc.eos_token_ids);
  seq->sampler->reserve(mc.vocab_size);
  if (grammar != nullptr) {
    seq->sampler->set_guide(std::make_unique<sampling::GuideState>(
        grammar, last_prompt == loaded_->tokenizer->bos_id()));
  }
  const int max_new =
      std::min(max_generated_tokens(request.sampling), mc.max_seq_len - seq->num_prompt + 1);
  seq->stop = std::make_unique<sampling::StopChecker>(request.sampling, mc.eos_token_ids, max_new);
  // The spatial cut: a sequence that may grow past min_context is placed across the shards.
  // Its class may ask for it either way (SlaClass::spread).
  const int32_t min_context = spatial_min_context_.load(std::memory_order_relaxed);  // the KVM's
  seq->table.spread =
      config_.spatial.shards > 1 &&
      cls.spread.value_or(min_context == 0 || seq->num_prompt + max_new > min_context);
  seq->decoder = std::make_unique<model::StreamDecoder>(*loaded_->tokenizer, last_prompt);
  if (!request.sampling.ignore_eos) seq->eos_ids = mc.eos_token_ids;
  const sched::Clock::time_point now = sched::Clock::now();
  seq->submit_time = now;
  seq->phase_start = now;
  seq->queue_deadline = now + std::chrono::duration_cast<sched::Clock::duration>(
                                  std::chrono::duration<double, std::milli>(cls.queue_timeout_ms));
  return seq;
}

sampling::GuideCache& EngineImpl::guides() {
  std::call_once(guides_once_, [this] {
    guides_ = std::make_unique<sampling::GuideCache>(
        model::guide_vocabulary(*loaded_->tokenizer, loaded_->config.vocab_size));
  });
  return *guides_;
}

StatusOr<RequestHandle> EngineImpl::submit(Request request) {
  std::shared_lock<std::shared_mutex> admit(submit_mu_);
  if (!accepting_) return unavailable("engine is shutting down; not accepting requests");
  const std::vector<SlaClass> classes = router_->classes();
  const int ci = sched::find_sla_class(classes, request.sla_class);
  if (ci < 0) {
    return invalid_argument(fmt::format("sla_class: unknown class '{}' (known: {})",
                                        escape_for_message(request.sla_class),
                                        class_names(classes)));
  }
  KVSPLIT_ASSIGN_OR_RETURN(
      std::vector<int32_t> ids,
      sched::prompt_token_ids(request, *loaded_->tokenizer, loaded_->config.vocab_size));
  if (request.max_tokens_is_default) {
    // Positions left after the prompt (the last generated token is never fed); a prompt that
    // leaves none is refused by check_admission as too long.
    const int64_t room = int64_t{limits_.max_context} - static_cast<int64_t>(ids.size()) + 1;
    request.sampling.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(
        room, 1, std::max({1, request.sampling.max_tokens, request.sampling.min_tokens})));
    if (room >= 1 && request.sampling.min_tokens > request.sampling.max_tokens) {
      return invalid_argument(fmt::format(
          "min_tokens: {} tokens cannot be generated: the model context of {} leaves {} after the "
          "prompt ({} tokens)",
          request.sampling.min_tokens, limits_.max_context, room, ids.size()));
    }
  }
  KVSPLIT_RETURN_IF_ERROR(sched::check_admission(request, static_cast<int>(ids.size()), limits_));
  std::shared_ptr<sampling::GuideGrammar> grammar;
  if (request.sampling.guided.on()) {
    KVSPLIT_ASSIGN_OR_RETURN(grammar, guides().get(request.sampling.guided));
  }
  const int n = request.n;
  const int num_prompt = static_cast<int>(ids.size());
  const int64_t arrival = next_arrival_.fetch_add(n, std::memory_order_relaxed);
  // Assigned ids are random, so that nobody can predict (and cancel) another caller's request.
  const bool assigned = request.request_id.empty();
  // The request's completions: one stream, and under a prefix cache completions 1..n-1 held
  // until completion 0's prompt is computed (RequestControl::prompt_ready).
  auto controls = [&](std::string id) {
    auto stream = std::make_shared<RequestStream>(id, n);
    // A prompt of one page or less has no whole page to share: no one waits. Nor with several
    // workers pulling from the router: an idle one would take a released completion before the
    // one holding the pages, and compute the prompt after waiting for it.
    auto ready =
        n > 1 && config_.prefix_cache && num_prompt > limits_.block_size && router_pullers_ == 1
            ? std::make_shared<std::atomic<int64_t>>(0)
            : std::shared_ptr<std::atomic<int64_t>>();
    std::vector<std::shared_ptr<sched::RequestControl>> ctls;
    for (int i = 0; i < n; ++i) {
      ctls.push_back(std::make_shared<sched::RequestControl>(id, request.tenant, i, stream));
      ctls.back()->prompt_ready = ready;
    }
    return ctls;
  };
  std::vector<std::shared_ptr<sched::RequestControl>> ctls =
      controls(assigned ? random_id(kAssignedIdPrefix) : request.request_id);
  std::vector<std::unique_ptr<sched::Sequence>> seqs;
  for (int i = 0; i < n; ++i) {
    seqs.push_back(make_sequence(request, ctls[i], arrival + i, i + 1 < n ? ids : std::move(ids),
                                 classes[ci], ci, grammar));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // An assigned id clashes only with a client's own "req-" id of the same 128 random bits.
    while (true) {
      auto [it, inserted] = active_.try_emplace(ctls[0]->key(), Active{ctls, n});
      if (inserted) break;
      if (!assigned && it->second.ctls[0]->cancel_requested.load(std::memory_order_relaxed)) {
        // Cancelled (the client has its CANCELLED or DEADLINE_EXCEEDED): the id is free for a
        // retry at once, though the old request may still be ending on its worker (cancel_key
        // took its completions out of the router under this lock, so the router holds none of
        // that id).
        it->second = Active{ctls, n};
        break;
      }
      if (!assigned) {
        return Status(StatusCode::kAlreadyExists,
                      fmt::format("request_id '{}' is already in flight", ctls[0]->display_id));
      }
      ctls = controls(random_id(kAssignedIdPrefix));
      for (int i = 0; i < n; ++i) seqs[i]->ctl = ctls[i];
    }
    // Queued under the same lock: a cancel never sees a request whose push then fails (it would
    // answer true for a request that never runs nor ends). The router's lock is a leaf. All
    // completions or none, under the router's lock (a worker may pull the first meanwhile).
    if (Status st = router_->push_all(seqs, /*notify=*/false); !st.ok()) {
      active_.erase(ctls[0]->key());
      return n > 1 ? st.with_prefix(fmt::format("n = {}", n)) : st;
    }
    submitted_ += n;  // counted per completion, as the outcomes are
    prompt_tokens_ += int64_t{num_prompt} * n;
  }
  router_->notify_pushed();
  return RequestHandle(ctls[0]->stream);
}

bool EngineImpl::cancel(const std::string& tenant, const std::string& request_id) {
  return cancel_key({tenant, request_id}, nullptr);
}

bool EngineImpl::cancel(const std::string& tenant, const RequestHandle& handle) {
  if (!handle.stream_) return false;
  return cancel_key({tenant, handle.request_id()}, handle.stream_.get());
}

bool EngineImpl::cancel_key(const sched::RequestKey& key, const RequestStream* only) {
  std::vector<std::unique_ptr<sched::Sequence>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = active_.find(key);
    if (it == active_.end()) return false;
    const std::vector<std::shared_ptr<sched::RequestControl>>& ctls = it->second.ctls;
    if (only != nullptr && ctls[0]->stream.get() != only) return false;  // the id reused
    // Flagged and out of the router under the lock: a submit that reuses the id once it sees
    // the flag never meets this request in the router (Router keys are unique). Only this
    // request: a new one may take its id as soon as the lock is released.
    for (const std::shared_ptr<sched::RequestControl>& ctl : ctls) {
      ctl->cancel_requested.store(true);
      if (auto seq = router_->remove(ctl->key(), ctl.get())) queued.push_back(std::move(seq));
    }
  }
  shared_.cancel_epoch.fetch_add(1, std::memory_order_acq_rel);
  const auto now = sched::Clock::now();
  for (std::unique_ptr<sched::Sequence>& seq : queued) {
    sched::finish_sequence(*seq, FinishReason::kCancelled, cancelled_error("cancelled"), now,
                           *this);
  }
  for (auto& w : workers_) w->wake();
  return true;
}

void EngineImpl::on_final(const sched::Sequence& seq, const TokenEvent& ev) {
  if (final_observer_) final_observer_(seq, ev);
  std::lock_guard<std::mutex> lock(mu_);
  // Its own entry only: a retry (of any n) may have taken the id of a cancelled request (submit);
  // the request's completions share its stream.
  const sched::RequestKey key{seq.ctl->tenant, seq.ctl->request_id, 0};
  if (auto it = active_.find(key);
      it != active_.end() && it->second.ctls[0]->stream == seq.ctl->stream) {
    if (--it->second.running == 0) active_.erase(it);
  }
  generated_tokens_ += ev.usage.completion_tokens;
  KvAccounting& kv = kv_accounting_[{seq.sla.name, seq.ctl->tenant}];
  ++kv.requests;
  kv.effective_kv_byte_seconds += ev.usage.effective_kv_byte_seconds;
  kv.kv_token_seconds += ev.usage.kv_token_seconds;
  // Its class, or (a reload removed it meanwhile) the retired counters a class of that name
  // continues if it comes back.
  auto class_stats = [&]() -> SlaClassStats& {
    auto same = [&](const SlaClassStats& c) { return c.name == seq.sla.name; };
    auto it = std::find_if(class_stats_.begin(), class_stats_.end(), same);
    if (it != class_stats_.end()) return *it;
    auto r = std::find_if(retired_class_stats_.begin(), retired_class_stats_.end(), same);
    if (r != retired_class_stats_.end()) return *r;
    retired_class_stats_.push_back(SlaClassStats{seq.sla.name});
    return retired_class_stats_.back();
  };
  // A request with one token has no inter-token latency: it is no ITL sample (NaN), not a 0.
  const double itl_sample = ev.usage.completion_tokens > 1
                                ? ev.timings.mean_itl_ms
                                : std::numeric_limits<double>::quiet_NaN();
  switch (ev.finish_reason) {
    case FinishReason::kStop:
    case FinishReason::kLength: {
      ++finished_;
      SlaClassStats& c = class_stats();
      const bool ttft = ev.timings.ttft_ms <= seq.sla.max_ttft_ms;
      const bool itl = ev.timings.mean_itl_ms <= seq.sla.max_itl_ms;
      ++c.finished;
      c.met_ttft += ttft;
      c.met_itl += itl;
      c.met_both += ttft && itl;
      kvm_record_latency(seq.sla.name, ev.timings.ttft_ms, itl_sample);
      break;
    }
    case FinishReason::kCancelled:
      ++cancelled_;  // the client's choice: no SLO outcome
      break;
    default: {
      // The engine failed it (timed out in its class's queue, a handoff no decode worker took,
      // KV it could never hold): an SLO miss of its class. Its TTFT sample is the time to its
      // first token, or without one the time it waited until it failed (a lower bound), so the
      // class's TTFT percentiles see a class that sheds load.
      ++failed_;
      ++class_stats().failed;
      const double ttft = ev.usage.completion_tokens > 0 ? ev.timings.ttft_ms : ev.timings.e2e_ms;
      kvm_record_latency(seq.sla.name, ttft, itl_sample);
      break;
    }
  }
  if (active_.empty()) idle_cv_.notify_all();
}

EngineStats EngineImpl::stats() const {
  EngineStats s = stats_without_kvm();
  fill_kvm_stats(&s);
  return s;
}

EngineStats EngineImpl::stats_without_kvm() const {
  EngineStats s;
  for (const auto& w : workers_) {
    s.pools.push_back(w->snapshot().pool);
    s.num_running += s.pools.back().running;
    s.num_waiting += s.pools.back().waiting;
  }
  const std::vector<sched::Router::ClassQueue> queues = router_->class_queues(sched::Clock::now());
  s.num_waiting += router_->num_queued();
  s.preemptions = shared_.preemptions.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.classes = class_stats_;
  for (SlaClassStats& c : s.classes) {  // by name: a reload may have reordered either list
    for (const sched::Router::ClassQueue& q : queues) {
      if (q.name != c.name) continue;
      c.queued = q.queued;
      c.oldest_queued_ms = q.oldest_wait_ms;
    }
  }
  s.requests_submitted = submitted_;
  s.requests_finished = finished_;
  s.requests_cancelled = cancelled_;
  s.requests_failed = failed_;
  s.prompt_tokens = prompt_tokens_;
  s.generated_tokens = generated_tokens_;
  s.kv_accounting.reserve(kv_accounting_.size());
  for (const auto& [key, kv] : kv_accounting_) {
    s.kv_accounting.push_back(kv);
    s.kv_accounting.back().sla_class = key.first;
    s.kv_accounting.back().tenant = key.second;
  }
  return s;
}

void EngineImpl::set_test_hold(sched::WorkerRole role, sched::TestHold hold) {
  for (auto& w : workers_) {
    if (w->role() == role) w->set_test_hold(hold);
  }
}

void EngineImpl::set_test_hold_worker(size_t index, sched::TestHold hold) {
  KVSPLIT_CHECK(index < workers_.size());
  workers_[index]->set_test_hold(hold);
}

std::vector<sched::WorkerSnapshot> EngineImpl::worker_snapshots() const {
  std::vector<sched::WorkerSnapshot> out;
  for (const auto& w : workers_) out.push_back(w->snapshot());
  return out;
}

ModelInfo EngineImpl::model_info() const {
  const model::ModelConfig& mc = loaded_->config;
  ModelInfo info;
  info.source = loaded_->source;
  info.architecture = mc.architecture;
  info.vocab_size = mc.vocab_size;
  info.max_context = mc.max_seq_len;
  info.num_layers = mc.num_layers;
  info.dim = mc.dim;
  return info;
}

Status EngineImpl::update_sla_classes(std::vector<SlaClass> classes) {
  KVSPLIT_RETURN_IF_ERROR(validate_sla_classes(classes));
  // The KVM's actuator edits the router's classes under kvm_mu_: no lost update either way.
  std::lock_guard<std::mutex> kvm_lock(kvm_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SlaClassStats> next;
    std::vector<SlaClassStats> known = std::move(class_stats_);
    known.insert(known.end(), retired_class_stats_.begin(), retired_class_stats_.end());
    retired_class_stats_.clear();
    for (const SlaClass& c : classes) {
      SlaClassStats st{c.name};
      for (const SlaClassStats& old : known) {
        if (old.name == c.name) st = old;
      }
      next.push_back(st);
    }
    for (const SlaClassStats& old : known) {
      const bool kept = std::any_of(next.begin(), next.end(),
                                    [&](const SlaClassStats& n) { return n.name == old.name; });
      if (!kept) retired_class_stats_.push_back(old);
    }
    class_stats_ = std::move(next);
  }
  // A class given exactly as before (a SIGHUP to rotate the decision log, an edit elsewhere in
  // the file) keeps the settings the KV cache manager moved on it; a changed or new class takes
  // the values given.
  std::vector<SlaClass> applied = classes;
  const std::vector<SlaClass> in_force = router_->classes();
  std::set<std::string> unchanged;
  for (SlaClass& c : applied) {
    if (std::find(given_classes_.begin(), given_classes_.end(), c) == given_classes_.end())
      continue;
    unchanged.insert(c.name);
    for (const SlaClass& now : in_force)
      if (now.name == c.name) c = now;
  }
  given_classes_ = std::move(classes);
  router_->set_classes(std::move(applied));
  // The manager's table and its rules' restore values follow the operator's new class settings
  // (else its next decision starts from, and its exit restores, the old ones). An unchanged class
  // is left as it is: rebased to the value the manager moved, an active rule's exit restored that
  // value and the change stayed for good (each later enter moved it again, down to its bound).
  if (kvm_) {
    kvm_->rebase_classes(kvm_baseline(), unchanged);
    publish_kvm_stats_locked();
  }
  return ok_status();
}

void EngineImpl::end_drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    drain_ended_ = true;
  }
  idle_cv_.notify_all();
}

void EngineImpl::shutdown(std::chrono::milliseconds drain) {
  std::call_once(shutdown_once_, [&] {
    {
      // Before the KVM stops (it may be in a tick waiting on stalled workers): no submit is
      // accepted meanwhile.
      std::unique_lock<std::shared_mutex> admit(submit_mu_);
      accepting_ = false;
    }
    stop_kvm();
    size_t left = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      idle_cv_.wait_for(lock, drain, [&] { return active_.empty() || drain_ended_; });
      left = active_.size();
    }
    if (left > 0) KVSPLIT_LOG_INFO("Engine: shutdown cancels {} requests", left);
    for (auto& w : workers_) w->request_stop();
    for (auto& w : workers_) w->join();
    // Decode and colocated workers first: their HandoffDone messages reach the prefill workers.
    for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) (*it)->finalize_after_stop();
    if (!router_) return;  // create() failed before the router existed
    const auto now = sched::Clock::now();
    for (std::unique_ptr<sched::Sequence>& seq : router_->take_all()) {
      sched::finish_sequence(*seq, FinishReason::kCancelled, unavailable("engine shut down"), now,
                             *this);
    }
  });
}

std::future<sched::CommandReply> EngineImpl::send_command(size_t index,
                                                          sched::WorkerCommand command) {
  auto promise = std::make_shared<std::promise<sched::CommandReply>>();
  std::future<sched::CommandReply> reply = promise->get_future();
  if (index >= workers_.size()) {
    promise->set_value({invalid_argument(fmt::format("worker index {} out of range [0, {})", index,
                                                     workers_.size())),
                        {}});
    return reply;
  }
  workers_[index]->post_command(
      std::move(command), [promise](sched::CommandReply r) { promise->set_value(std::move(r)); });
  return reply;
}

}  // namespace kvsplit
