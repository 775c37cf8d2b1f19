// EngineImpl: the Engine behind the public API. Owns the loaded model (weights shared by every
// worker), the Router, the workers and the bookkeeping of accepted requests.
//
// Threads: callers of the public methods (any), one thread per worker. Locks: submit_mu_
// (shared by submit, exclusive at shutdown), mu_ (active requests, counters, class stats; never
// held while calling into a worker or the router).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "kv/disk_tier.h"
#include "kvm/manager.h"
#include "kvsplit/engine.h"
#include "model/loader.h"
#include "sampling/guide.h"
#include "sched/admission.h"
#include "sched/router.h"
#include "sched/sequence.h"
#include "sched/worker.h"

namespace kvsplit {

// Checks an EngineConfig; kInvalidArgument naming the field.
Status validate_engine_config(const EngineConfig& config);

class EngineImpl final : public Engine, private sched::FinishSink {
 public:
  // Knobs that are not part of the public config (benchmarks, tests).
  struct InternalOptions {
    int sampling_threads = 0;  // threads sampling a step's rows; 0: the worker's CPU threads
    // Storage of the weights on the backend (BackendOptions::weight_dtype); unset: its default
    // (CUDA: bf16). Tests set kF32 to compare a CUDA engine's tokens with the CPU engine's.
    std::optional<backend::DType> weight_dtype;
    // CPU backend with EngineConfig::async_copies (BackendOptions::fenced_copy_delay_us): each
    // fenced copy batch starts this many microseconds after it is queued, so a test sees copies
    // still in flight (a host prefetch's miss, a late recall). 0: none.
    int64_t fenced_copy_delay_us = 0;
    // Benchmarks: false routes KV handoffs by KV load alone, a decode worker's free sequence
    // slots unseen (the routing before 2026-12-05; sched::DecodeLoad::slots_full).
    bool slot_aware_handoffs = true;
    // Benchmarks: false leaves offers in flight to a decode worker marked down there until their
    // own deadlines (the engine before 2026-12-05; sched::WorkerOptions::take_back_from_down).
    bool take_back_from_down = true;
    // Tests: set on every worker's disk tier (kv::DiskTier::set_fault_hook), so that the disk
    // faults of a swap-in or a prefix read happen where the serving worker meets them.
    kv::DiskFaultHook disk_fault_hook;
    // Tests: set on every decode worker (sched::WorkerOptions::handoff_copy_fault_hook), so that
    // a KV handoff copy fails where the decode worker meets it (sched::fail_handoff_copies).
    sched::HandoffCopyFaultHook handoff_copy_fault_hook;
  };
  static StatusOr<std::unique_ptr<EngineImpl>> create(const EngineConfig& config,
                                                      const InternalOptions& internal);
  static StatusOr<std::unique_ptr<EngineImpl>> create(const EngineConfig& config) {
    return create(config, InternalOptions{});
  }
  ~EngineImpl() override;

  StatusOr<RequestHandle> submit(Request request) override;
  bool cancel(const std::string& tenant, const std::string& request_id) override;
  bool cancel(const std::string& tenant, const RequestHandle& handle) override;
  EngineStats stats() const override;
  ModelInfo model_info() const override;
  Status update_sla_classes(std::vector<SlaClass> classes) override;
  Status update_kvm_policy(KvmConfig policy) override;
  Status check_kvm_policy(const KvmConfig& policy,
                          const std::vector<SlaClass>& classes) const override;
  void shutdown(std::chrono::milliseconds drain) override;
  void end_drain() override;

  // Scheduler-internal numbers for benchmarks: per worker forward / bookkeeping time.
  std::vector<sched::WorkerSnapshot> worker_snapshots() const;
  // Tests only: holds every worker of `role` at its step boundary (see sched::TestHold), e.g. to
  // keep a queue occupied without depending on how fast the machine runs.
  void set_test_hold(sched::WorkerRole role, sched::TestHold hold);
  // Tests only: the same for worker `index` alone (prefill workers first, as send_command).
  void set_test_hold_worker(size_t index, sched::TestHold hold);
  // Tests only: the SLA classes as the router holds them now (the KV cache manager's changes in).
  std::vector<SlaClass> sla_classes() const { return router_->classes(); }

  // The command inbox of worker `index` (prefill workers first, then decode or colocated ones):
  // the reply once the worker processed the command at a step boundary. An index out of range
  // is a ready kInvalidArgument reply. The seam the KV cache manager will drive.
  std::future<sched::CommandReply> send_command(size_t index, sched::WorkerCommand command);
  size_t num_workers() const { return workers_.size(); }
  // Tests only: called with every final event's sequence (in on_final, before the engine's
  // bookkeeping), e.g. to read its KvAccount trace. Set before submitting.
  void set_final_observer_for_tests(
      std::function<void(const sched::Sequence&, const TokenEvent&)> observer) {
    final_observer_ = std::move(observer);
  }

 private:
  explicit EngineImpl(const EngineConfig& config);
  // cancel(): the request in flight under `key`, and only when its stream is `only` (if set).
  bool cancel_key(const sched::RequestKey& key, const RequestStream* only);
  class KvmActuator;
  // The KV cache manager (engine_kvm.cpp).
  kvm::ParamTable kvm_baseline() const;
  Status apply_kvm_decision(const KvmDecision& d);
  // Sends `command` to every decoding worker (decode and colocated), and to the prefill workers
  // too unless decoders_only; the first error, or kDeadlineExceeded when one did not reply.
  Status broadcast_command(const sched::WorkerCommand& command, bool decoders_only = true);
  Status migrate_to_emptiest_shard(int max_pages);
  void start_kvm_locked();
  // Copies the manager's state for stats() into kvm_published_ (kvm_mu_ held): stats() reads it
  // under kvm_pub_mu_ only, never waiting for a tick whose actuator waits on worker replies.
  void publish_kvm_stats_locked();
  void kvm_loop();
  void stop_kvm();
  void kvm_record_latency(const std::string& sla_class, double ttft_ms, double mean_itl_ms);
  void fill_kvm_stats(EngineStats* s) const;
  EngineStats stats_without_kvm() const;
  void on_final(const sched::Sequence& seq, const TokenEvent& final_event) override;
  // `grammar`: the request's compiled constraint (guided decoding), or null.
  std::unique_ptr<sched::Sequence> make_sequence(
      const Request& request, std::shared_ptr<sched::RequestControl> ctl, int64_t arrival,
      std::vector<int32_t> ids, const SlaClass& cls, int class_index,
      const std::shared_ptr<sampling::GuideGrammar>& grammar);
  // Compiled guided-decoding constraints, over the model's token bytes (built on first use: a
  // large vocabulary's trie costs memory no unguided deployment needs).
  sampling::GuideCache& guides();

  EngineConfig config_;
  std::unique_ptr<model::LoadedModel> loaded_;  // outlives the workers (weights, tokenizer)
  std::unique_ptr<sched::Router> router_;
  // The SLA classes as the operator last gave them (create, update_sla_classes), before the KV
  // cache manager moved any setting: a reload compares the new ones with these.
  std::vector<SlaClass> given_classes_;
  sched::WorkerShared shared_;
  std::vector<std::unique_ptr<sched::Worker>> workers_;  // prefill workers first
  sched::AdmissionLimits limits_;
  int router_pullers_ = 0;  // workers that pull prompts from the router

  std::shared_mutex submit_mu_;
  bool accepting_ = true;  // guarded by submit_mu_
  std::once_flag shutdown_once_;
  std::once_flag guides_once_;
  std::unique_ptr<sampling::GuideCache> guides_;
  std::atomic<int64_t> next_arrival_{0};

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  bool drain_ended_ = false;  // guarded by mu_; end_drain() was called
  // Accepted requests not yet finished, by (tenant, request id, 0): their completions (Request::n)
  // and how many of them have not ended.
  struct Active {
    std::vector<std::shared_ptr<sched::RequestControl>> ctls;
    int running = 0;
  };
  std::unordered_map<sched::RequestKey, Active, sched::RequestKeyHash> active_;
  std::vector<SlaClassStats> class_stats_;
  // Counters of classes a reload removed, by name: a class added back continues them (its
  // Prometheus counters must not go backwards).
  std::vector<SlaClassStats> retired_class_stats_;
  int64_t submitted_ = 0, finished_ = 0, cancelled_ = 0, failed_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  // Effective KV summed per (SLA class, tenant) (EngineStats::kv_accounting); guarded by mu_.
  std::map<std::pair<std::string, std::string>, KvAccounting> kv_accounting_;
  std::function<void(const sched::Sequence&, const TokenEvent&)> final_observer_;

  // The KV cache manager. kvm_mu_ guards the manager and the engine-wide cut settings it moves
  // (kvm_semantic_, kvm_temporal_); it is never held while taking mu_ (the thread samples stats
  // first) and the actuator only waits on worker replies under it.
  mutable std::mutex kvm_mu_;
  // The manager's fields of EngineStats as of its last tick, policy load or class reload.
  mutable std::mutex kvm_pub_mu_;
  EngineStats kvm_published_;  // guarded by kvm_pub_mu_
  std::condition_variable kvm_cv_;
  std::unique_ptr<kvm::Actuator> kvm_actuator_;
  std::unique_ptr<kvm::KvCacheManager> kvm_;
  std::thread kvm_thread_;
  bool kvm_stop_ = false;
  bool kvm_shut_down_ = false;  // shutdown() stopped it for good: no manager starts after
  SemanticCutConfig kvm_semantic_;
  TemporalCutConfig kvm_temporal_;
  std::atomic<int32_t> spatial_min_context_{0};
  // Finished requests' (class, ttft, mean itl) since the last sample, fed by on_final.
  std::mutex kvm_lat_mu_;
  std::atomic<bool> kvm_enabled_{false};
  // Finished requests' latencies since the last tick, each with its finish time (the window is
  // judged by that, not by the tick that reads it).
  struct KvmLatency {
    std::string sla_class;
    double ttft_ms = 0, mean_itl_ms = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::vector<KvmLatency> kvm_latencies_;
};

}  // namespace kvsplit
