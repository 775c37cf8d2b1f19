#include "server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <sstream>

#include "common/check.h"

namespace kvsplit::server {

namespace pm = ::prometheus;

// Builds the engine-owned metric families from one Engine::stats() snapshot per scrape.
class EngineCollector : public pm::Collectable {
 public:
  EngineCollector(Engine* engine, const std::atomic<int32_t>* active)
      : engine_(engine), active_(active) {}

  std::vector<pm::MetricFamily> Collect() const override {
    const EngineStats s = engine_->stats();
    std::vector<pm::MetricFamily> out;
    out.reserve(96);  // family() hands out references into `out`: it must never reallocate
    auto family = [&](const char* name, const char* help,
                      pm::MetricType type) -> pm::MetricFamily& {
      KVSPLIT_CHECK(out.size() < out.capacity());
      out.push_back(pm::MetricFamily{name, help, type, {}});
      return out.back();
    };
    auto gauge = [](double v, std::vector<pm::ClientMetric::Label> labels = {}) {
      pm::ClientMetric m;
      m.label = std::move(labels);
      m.gauge.value = v;
      return m;
    };
    auto counter = [](double v, std::vector<pm::ClientMetric::Label> labels = {}) {
      pm::ClientMetric m;
      m.label = std::move(labels);
      m.counter.value = v;
      return m;
    };
    auto& kv =
        family("kvsplit:kv_cache_usage_perc",
               "KV cache usage per pool, fraction of blocks in use (0..1)", pm::MetricType::Gauge);
    auto& blocks_free =
        family("kvsplit:kv_cache_free_blocks", "Free KV blocks per pool", pm::MetricType::Gauge);
    auto& pages =
        family("kvsplit:kv_pages", "KV pages per pool by rung (full, int8, int4, evicted)",
               pm::MetricType::Gauge);
    auto& demotions = family("kvsplit:kv_demotions_total",
                             "KV pages moved down the precision ladder", pm::MetricType::Counter);
    auto& evictions = family("kvsplit:kv_evictions_total", "KV pages evicted or dropped",
                             pm::MetricType::Counter);
    auto& window_dropped =
        family("kvsplit:kv_window_dropped_pages_total",
               "KV pages freed because every layer's sliding window had passed them",
               pm::MetricType::Counter);
    auto& recalls =
        family("kvsplit:kv_recalls_total", "KV pages recalled from the host tier (any rung)",
               pm::MetricType::Counter);
    auto& recalls_quantized = family("kvsplit:kv_recalls_quantized_total",
                                     "Evicted KV pages recalled at int8 or int4 (recall_precision)",
                                     pm::MetricType::Counter);
    auto& recalls_cold =
        family("kvsplit:kv_recalls_cold_total",
               "KV pages recalled at int8 or int4 and evicted again before reaching full",
               pm::MetricType::Counter);
    auto& refused = family("kvsplit:kv_refused_transitions_total",
                           "KV page transitions planned but refused (a tier or the pool full)",
                           pm::MetricType::Counter);
    auto& recalls_late =
        family("kvsplit:kv_recalls_late_total",
               "KV page recalls not landed within recall_wait_ms of the step that asked for them",
               pm::MetricType::Counter);
    auto& recall_mean = family("kvsplit:kv_recall_latency_mean_seconds",
                               "Mean wall time of one KV page recall", pm::MetricType::Gauge);
    auto& host_used =
        family("kvsplit:kv_host_tier_used_bytes",
               "Host tier bytes holding full-precision KV originals", pm::MetricType::Gauge);
    auto& host_pages =
        family("kvsplit:kv_pages_host",
               "KV pages of paused sequences swapped out of the device (host or disk tier)",
               pm::MetricType::Gauge);
    auto& swaps = family("kvsplit:kv_swaps_total",
                         "Sequences swapped between the device and the host tier, by direction",
                         pm::MetricType::Counter);
    auto& swap_bytes = family("kvsplit:kv_swap_bytes_total", "Bytes copied by swaps (out and in)",
                              pm::MetricType::Counter);
    auto& preempt_choice =
        family("kvsplit:kv_preemption_choices_total",
               "Preemptions by what the temporal cut chose for the KV (swap or recompute), and "
               "swaps that fell back to recompute",
               pm::MetricType::Counter);
    auto& disk_faults = family("kvsplit:kv_disk_faults_total",
                               "Disk tier writes or reads that failed (the KV was recomputed)",
                               pm::MetricType::Counter);
    auto& prefix_queries = family("kvsplit:prefix_cache_queries_total",
                                  "Prompt tokens looked up in the prefix cache (whole pages)",
                                  pm::MetricType::Counter);
    auto& prefix_hits =
        family("kvsplit:prefix_cache_hits_total", "Prompt tokens served from the prefix cache",
               pm::MetricType::Counter);
    auto& prefix_tier_hits =
        family("kvsplit:prefix_cache_tier_hits_total",
               "Prompt tokens served from the prefix cache, by the tier the page was on",
               pm::MetricType::Counter);
    auto& prefix_spills = family("kvsplit:prefix_cache_spills_total",
                                 "Prefix-cache pages spilled down to a tier instead of dropped",
                                 pm::MetricType::Counter);
    auto& prefix_faults =
        family("kvsplit:prefix_cache_spill_faults_total",
               "Prefix-cache stores or restores that failed (the page dropped, recomputed)",
               pm::MetricType::Counter);
    auto& prefix_pages = family("kvsplit:prefix_cache_pages",
                                "Pages the prefix cache holds, by tier", pm::MetricType::Gauge);
    auto& rerouted = family("kvsplit:handoffs_rerouted_total",
                            "KV handoffs a decode worker did not take within handoff_timeout_ms, "
                            "or taken back from one marked down, offered to another decode worker",
                            pm::MetricType::Counter);
    auto& forwarded = family("kvsplit:handoffs_forwarded_total",
                             "KV handoffs a decode worker received and passed on, while they "
                             "waited for room there, to another decode worker with room",
                             pm::MetricType::Counter);
    auto& down = family("kvsplit:worker_marked_down",
                        "1 while a decode worker is marked down: a KV handoff sent to it was not "
                        "taken within handoff_timeout_ms or the stall bound (handoff_stall_ms), "
                        "and it has not drained its inbox since",
                        pm::MetricType::Gauge);
    auto& handoff_pages = family("kvsplit:handoff_pages_total",
                                 "Pages of the KV handoffs a decode pool received, copied from the "
                                 "prefill worker or taken from its prefix cache (cached)",
                                 pm::MetricType::Counter);
    auto& to_cached = family("kvsplit:handoffs_to_cached_total",
                             "KV handoffs a prefill pool routed to a decode worker it had sent "
                             "pages of the same prompt before (cache-aware routing)",
                             pm::MetricType::Counter);
    auto& stalled = family("kvsplit:decode_rows_stalled_total",
                           "Decode steps skipped because the request's client had not read "
                           "pools.max_unread_events events (back-pressure from a slow reader)",
                           pm::MetricType::Counter);
    auto& spec = family("kvsplit:spec_tokens_total",
                        "Speculative decoding: draft tokens fed to decode rows (drafted) and those "
                        "accepted, each a token generated without a forward pass of its own",
                        pm::MetricType::Counter);
    auto& spec_rows = family("kvsplit:spec_rows_total",
                             "Speculative decoding: decode rows that carried draft tokens",
                             pm::MetricType::Counter);
    auto& prefetch = family("kvsplit:kv_prefetch_total",
                            "Swap-ins from the disk tier whose read, started a step ahead, had "
                            "completed (hit) or had to be read or waited for then (miss)",
                            pm::MetricType::Counter);
    auto& host_prefetch =
        family("kvsplit:kv_host_prefetch_total",
               "Host-tier prefetches: started a step ahead (started); swap-ins from the host tier "
               "whose copy had landed (hit) or that waited for it or had none (miss); dropped "
               "unused (dropped); put off (deferred)",
               pm::MetricType::Counter);
    auto& write_behind =
        family("kvsplit:kv_disk_write_behind_total",
               "Disk swap write-behind: swap-outs that returned before their record was written "
               "(started); swap-ins or read-aheads that waited for such a write (waited); swap-ins "
               "served from a failed write's staging, without recompute (rescued)",
               pm::MetricType::Counter);
    for (const PoolStats& p : s.pools) {
      for (const auto& [result, n] :
           {std::pair<const char*, int64_t>{"started", p.kv_disk_write_behind},
            {"waited", p.kv_disk_write_behind_waits},
            {"rescued", p.kv_disk_write_behind_rescues}})
        write_behind.metric.push_back(
            counter(static_cast<double>(n), {{"pool", p.name}, {"result", result}}));
      for (const auto& [result, n] :
           {std::pair<const char*, int64_t>{"started", p.kv_host_prefetches},
            {"hit", p.kv_host_prefetch_hits},
            {"miss", p.kv_host_prefetch_misses},
            {"dropped", p.kv_host_prefetch_dropped},
            {"deferred", p.kv_host_prefetch_deferred}})
        host_prefetch.metric.push_back(
            counter(static_cast<double>(n), {{"pool", p.name}, {"result", result}}));
      stalled.metric.push_back(
          counter(static_cast<double>(p.decode_rows_stalled), {{"pool", p.name}}));
      spec.metric.push_back(counter(static_cast<double>(p.spec_draft_tokens),
                                    {{"pool", p.name}, {"result", "drafted"}}));
      spec.metric.push_back(counter(static_cast<double>(p.spec_accepted_tokens),
                                    {{"pool", p.name}, {"result", "accepted"}}));
      spec_rows.metric.push_back(counter(static_cast<double>(p.spec_rows), {{"pool", p.name}}));
      rerouted.metric.push_back(
          counter(static_cast<double>(p.handoffs_rerouted), {{"pool", p.name}}));
      to_cached.metric.push_back(
          counter(static_cast<double>(p.handoffs_to_cached), {{"pool", p.name}}));
      forwarded.metric.push_back(
          counter(static_cast<double>(p.handoffs_forwarded), {{"pool", p.name}}));
      down.metric.push_back(gauge(p.marked_down ? 1.0 : 0.0, {{"pool", p.name}}));
      handoff_pages.metric.push_back(counter(static_cast<double>(p.handoff_pages_copied),
                                             {{"pool", p.name}, {"source", "copied"}}));
      handoff_pages.metric.push_back(counter(static_cast<double>(p.handoff_pages_cached),
                                             {{"pool", p.name}, {"source", "cached"}}));
      prefetch.metric.push_back(
          counter(static_cast<double>(p.kv_prefetch_hits), {{"pool", p.name}, {"result", "hit"}}));
      prefetch.metric.push_back(counter(static_cast<double>(p.kv_prefetch_misses),
                                        {{"pool", p.name}, {"result", "miss"}}));
      prefix_queries.metric.push_back(
          counter(static_cast<double>(p.kv_prefix_queries), {{"pool", p.name}}));
      prefix_hits.metric.push_back(
          counter(static_cast<double>(p.kv_prefix_hits), {{"pool", p.name}}));
      const int64_t dev_hits = p.kv_prefix_hits - p.kv_prefix_hits_host - p.kv_prefix_hits_disk;
      for (const auto& [tier, hits] : {std::pair<const char*, int64_t>{"device", dev_hits},
                                       {"host", p.kv_prefix_hits_host},
                                       {"disk", p.kv_prefix_hits_disk}})
        prefix_tier_hits.metric.push_back(
            counter(static_cast<double>(hits), {{"pool", p.name}, {"tier", tier}}));
      prefix_spills.metric.push_back(counter(static_cast<double>(p.kv_prefix_spills_host),
                                             {{"pool", p.name}, {"tier", "host"}}));
      prefix_spills.metric.push_back(counter(static_cast<double>(p.kv_prefix_spills_disk),
                                             {{"pool", p.name}, {"tier", "disk"}}));
      prefix_faults.metric.push_back(
          counter(static_cast<double>(p.kv_prefix_spill_faults), {{"pool", p.name}}));
      const int32_t dev_pages =
          p.kv_prefix_cache_pages - p.kv_prefix_pages_host - p.kv_prefix_pages_disk;
      prefix_pages.metric.push_back(gauge(dev_pages, {{"pool", p.name}, {"tier", "device"}}));
      prefix_pages.metric.push_back(
          gauge(p.kv_prefix_pages_host, {{"pool", p.name}, {"tier", "host"}}));
      prefix_pages.metric.push_back(
          gauge(p.kv_prefix_pages_disk, {{"pool", p.name}, {"tier", "disk"}}));
      disk_faults.metric.push_back(
          counter(static_cast<double>(p.kv_disk_faults), {{"pool", p.name}}));
      swaps.metric.push_back(counter(static_cast<double>(p.kv_swaps_to_disk),
                                     {{"pool", p.name}, {"direction", "to_disk"}}));
      host_pages.metric.push_back(gauge(p.kv_pages_host, {{"pool", p.name}}));
      swaps.metric.push_back(
          counter(static_cast<double>(p.kv_swaps_out), {{"pool", p.name}, {"direction", "out"}}));
      swaps.metric.push_back(
          counter(static_cast<double>(p.kv_swaps_in), {{"pool", p.name}, {"direction", "in"}}));
      swap_bytes.metric.push_back(
          counter(static_cast<double>(p.kv_swap_bytes), {{"pool", p.name}}));
      const std::pair<const char*, int64_t> choices[] = {{"swap", p.kv_swap_choices},
                                                         {"recompute", p.kv_recompute_choices},
                                                         {"fallback", p.kv_swap_fallbacks}};
      for (const auto& [choice, n] : choices)
        preempt_choice.metric.push_back(
            counter(static_cast<double>(n), {{"pool", p.name}, {"choice", choice}}));
    }
    // The spatial cut.
    auto& shards =
        family("kvsplit:kv_shards", "Shards of the worker's KV shard group", pm::MetricType::Gauge);
    auto& remote =
        family("kvsplit:kv_pages_remote",
               "KV pages held on shards other than the worker's home shard", pm::MetricType::Gauge);
    auto& exchange = family("kvsplit:kv_shard_exchange_bytes_total",
                            "Bytes the shards exchanged (queries, new K/V rows, partial attention)",
                            pm::MetricType::Counter);
    auto& exchange_host =
        family("kvsplit:kv_shard_exchange_host_bytes_total",
               "Of the bytes the shards exchanged, those staged through host memory (over the host "
               "link, as swaps are; shards on GPUs without peer access)",
               pm::MetricType::Counter);
    auto& migrated = family("kvsplit:kv_migrated_pages_total",
                            "KV pages moved between shards or from the host tier by migrations",
                            pm::MetricType::Counter);
    auto& exchange_seconds =
        family("kvsplit:kv_shard_exchange_seconds_total",
               "Wall time inside the shard group's exchanges (kv.cuts.spatial.communicator)",
               pm::MetricType::Counter);
    auto& communicator =
        family("kvsplit:kv_shard_communicator",
               "1 for the communicator (in-process or nccl) the worker's shard group uses",
               pm::MetricType::Gauge);
    for (const PoolStats& p : s.pools) {
      shards.metric.push_back(gauge(p.kv_shards, {{"pool", p.name}}));
      remote.metric.push_back(gauge(p.kv_pages_remote, {{"pool", p.name}}));
      exchange.metric.push_back(
          counter(static_cast<double>(p.kv_shard_exchange_bytes), {{"pool", p.name}}));
      exchange_host.metric.push_back(
          counter(static_cast<double>(p.kv_shard_exchange_host_bytes), {{"pool", p.name}}));
      migrated.metric.push_back(
          counter(static_cast<double>(p.kv_migrated_pages), {{"pool", p.name}}));
      exchange_seconds.metric.push_back(counter(p.kv_shard_exchange_seconds, {{"pool", p.name}}));
      if (!p.kv_shard_communicator.empty())
        communicator.metric.push_back(
            gauge(1, {{"pool", p.name}, {"communicator", p.kv_shard_communicator}}));
    }
    for (const PoolStats& p : s.pools) {
      const double used = p.kv_blocks_total > 0
                              ? 1.0 - static_cast<double>(p.kv_blocks_free) / p.kv_blocks_total
                              : 0.0;
      kv.metric.push_back(gauge(used, {{"pool", p.name}}));
      blocks_free.metric.push_back(gauge(p.kv_blocks_free, {{"pool", p.name}}));
      const std::pair<const char*, int32_t> rungs[] = {{"full", p.kv_pages_full},
                                                       {"int8", p.kv_pages_int8},
                                                       {"int4", p.kv_pages_int4},
                                                       {"evicted", p.kv_pages_evicted}};
      for (const auto& [rung, n] : rungs)
        pages.metric.push_back(gauge(n, {{"pool", p.name}, {"rung", rung}}));
      demotions.metric.push_back(counter(static_cast<double>(p.kv_demotions), {{"pool", p.name}}));
      evictions.metric.push_back(counter(static_cast<double>(p.kv_evictions), {{"pool", p.name}}));
      window_dropped.metric.push_back(
          counter(static_cast<double>(p.kv_window_dropped_pages), {{"pool", p.name}}));
      recalls.metric.push_back(counter(static_cast<double>(p.kv_recalls), {{"pool", p.name}}));
      recalls_quantized.metric.push_back(
          counter(static_cast<double>(p.kv_recalls_quantized), {{"pool", p.name}}));
      recalls_cold.metric.push_back(
          counter(static_cast<double>(p.kv_recalls_cold), {{"pool", p.name}}));
      refused.metric.push_back(
          counter(static_cast<double>(p.kv_refused_transitions), {{"pool", p.name}}));
      recall_mean.metric.push_back(gauge(p.kv_recall_ms_mean / 1e3, {{"pool", p.name}}));
      recalls_late.metric.push_back(
          counter(static_cast<double>(p.kv_recalls_late), {{"pool", p.name}}));
      host_used.metric.push_back(
          gauge(static_cast<double>(p.kv_host_bytes_used), {{"pool", p.name}}));
    }
    family("kvsplit:num_requests_running", "Sequences running in a batch", pm::MetricType::Gauge)
        .metric.push_back(gauge(s.num_running));
    family("kvsplit:num_requests_waiting", "Requests queued, not yet running",
           pm::MetricType::Gauge)
        .metric.push_back(gauge(s.num_waiting));
    family("kvsplit:num_active_streams", "Open Generate calls", pm::MetricType::Gauge)
        .metric.push_back(gauge(active_.load() ? active_.load()->load() : 0));
    family("kvsplit:num_preemptions_total", "Preemptions since start", pm::MetricType::Counter)
        .metric.push_back(counter(static_cast<double>(s.preemptions)));
    family("kvsplit:prompt_tokens_total", "Prompt tokens processed", pm::MetricType::Counter)
        .metric.push_back(counter(static_cast<double>(s.prompt_tokens)));
    family("kvsplit:generation_tokens_total", "Tokens generated", pm::MetricType::Counter)
        .metric.push_back(counter(static_cast<double>(s.generated_tokens)));
    auto& finished =
        family("kvsplit:request_finished_total", "Requests by outcome", pm::MetricType::Counter);
    finished.metric.push_back(
        counter(static_cast<double>(s.requests_finished), {{"outcome", "finished"}}));
    finished.metric.push_back(
        counter(static_cast<double>(s.requests_cancelled), {{"outcome", "cancelled"}}));
    finished.metric.push_back(
        counter(static_cast<double>(s.requests_failed), {{"outcome", "failed"}}));
    auto& cls_done = family("kvsplit:sla_requests_finished_total",
                            "Finished requests per SLA class", pm::MetricType::Counter);
    auto& cls_ttft = family("kvsplit:sla_ttft_met_total",
                            "Requests that met their class's max_ttft_ms", pm::MetricType::Counter);
    auto& cls_itl = family("kvsplit:sla_itl_met_total",
                           "Requests that met their class's max_itl_ms", pm::MetricType::Counter);
    auto& cls_both = family("kvsplit:sla_slo_met_total", "Requests that met both targets (goodput)",
                            pm::MetricType::Counter);
    auto& cls_failed = family("kvsplit:sla_requests_failed_total",
                              "Requests per SLA class the engine failed (queue timeout, failed "
                              "handoff, KV it could never hold): SLO misses",
                              pm::MetricType::Counter);
    auto& cls_queued = family("kvsplit:sla_queued_requests", "Requests queued per SLA class",
                              pm::MetricType::Gauge);
    for (const SlaClassStats& c : s.classes) {
      std::vector<pm::ClientMetric::Label> l = {{"sla_class", c.name}};
      cls_done.metric.push_back(counter(static_cast<double>(c.finished), l));
      cls_ttft.metric.push_back(counter(static_cast<double>(c.met_ttft), l));
      cls_itl.metric.push_back(counter(static_cast<double>(c.met_itl), l));
      cls_both.metric.push_back(counter(static_cast<double>(c.met_both), l));
      cls_failed.metric.push_back(counter(static_cast<double>(c.failed), l));
      cls_queued.metric.push_back(gauge(c.queued, l));
    }
    // Effective KV per SLA class and tenant (docs/kvm.md "Effective-KV accounting"); label values
    // are escaped by the text serializer, as every other label here.
    auto& kv_bytes = family("kvsplit:kv_effective_byte_seconds_total",
                            "Device bytes of finished requests' KV pages at their precision, "
                            "integrated over time (byte-seconds), per SLA class and tenant",
                            pm::MetricType::Counter);
    auto& kv_tokens = family("kvsplit:kv_token_seconds_total",
                             "Finished requests' tokens with KV on the device, integrated over "
                             "time (token-seconds), per SLA class and tenant",
                             pm::MetricType::Counter);
    for (const KvAccounting& a : s.kv_accounting) {
      std::vector<pm::ClientMetric::Label> l = {{"class", a.sla_class}, {"tenant", a.tenant}};
      kv_bytes.metric.push_back(counter(a.effective_kv_byte_seconds, l));
      kv_tokens.metric.push_back(counter(a.kv_token_seconds, l));
    }
    if (s.kvm_enabled) add_kvm_families(s, family, gauge, counter);
    return out;
  }

  void set_active(const std::atomic<int32_t>* active) { active_.store(active); }

 private:
  // The KV cache manager (docs/kvm.md): decisions per (rule, action), the current value of every
  // parameter its rules move, and the monitors its rules read.
  template <typename Family, typename Gauge, typename Counter>
  static void add_kvm_families(const EngineStats& s, Family& family, Gauge& gauge,
                               Counter& counter) {
    auto& decisions = family("kvsplit:kvm_decisions_total", "KV cache manager decisions",
                             pm::MetricType::Counter);
    for (const EngineStats::KvmDecisionCount& d : s.kvm_decision_counts) {
      decisions.metric.push_back(
          counter(static_cast<double>(d.count), {{"rule", d.rule}, {"action", d.action}}));
    }
    auto& params = family("kvsplit:kvm_param",
                          "Current value of each parameter the KV cache manager moves (class \"\": "
                          "engine-wide)",
                          pm::MetricType::Gauge);
    for (const EngineStats::KvmParam& p : s.kvm_params) {
      params.metric.push_back(gauge(p.value, {{"param", p.param}, {"sla_class", p.sla_class}}));
    }
    auto& monitor = family("kvsplit:kvm_monitor", "The KV cache manager's latest monitor sample",
                           pm::MetricType::Gauge);
    const std::pair<const char*, double> values[] = {
        {"device_kv_use", s.kvm.device_kv_use},
        {"host_kv_use", s.kvm.host_kv_use},
        {"disk_kv_use", s.kvm.disk_kv_use},
        {"link_use", s.kvm.link_use},
        {"peer_exchange_mb_s", s.kvm.peer_exchange_mb_s},
        {"storage_latency_ms", s.kvm.storage_latency_ms},
        {"prefix_hit_rate", s.kvm.prefix_hit_rate},
        {"swap_rate", s.kvm.swap_rate},
        {"recall_rate", s.kvm.recall_rate},
        {"pages_evicted_fraction", s.kvm.pages_evicted_fraction}};
    for (const auto& [name, v] : values) monitor.metric.push_back(gauge(v, {{"metric", name}}));
    auto& lat = family("kvsplit:kvm_class_latency_ms",
                       "Per-class TTFT and ITL percentiles over the KVM's sliding window (ms)",
                       pm::MetricType::Gauge);
    for (const KvmClassLatency& c : s.kvm.classes) {
      const std::pair<const char*, double> q[] = {{"ttft_p50", c.ttft_p50_ms},
                                                  {"ttft_p99", c.ttft_p99_ms},
                                                  {"itl_p50", c.itl_p50_ms},
                                                  {"itl_p99", c.itl_p99_ms}};
      for (const auto& [name, v] : q)
        lat.metric.push_back(gauge(v, {{"sla_class", c.name}, {"quantile", name}}));
    }
  }

 public:
 private:
  Engine* engine_;
  std::atomic<const std::atomic<int32_t>*> active_;
};

namespace {
// Latency buckets (seconds): 1 ms .. 2 min, roughly x2 per step, as vLLM's histograms span.
const pm::Histogram::BucketBoundaries& latency_buckets() {
  static const pm::Histogram::BucketBoundaries b = {
      0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.15, 0.2,
      0.3,   0.5,    0.75,  1.0,  2.5,  5.0,  10.0, 20.0, 40.0, 80.0, 120.0};
  return b;
}
}  // namespace

StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::create(
    const std::string& host, int port, Engine* engine, const std::atomic<int32_t>* active_streams) {
  std::unique_ptr<ServerMetrics> m(new ServerMetrics());
  m->registry_ = std::make_shared<pm::Registry>();
  m->collector_ = std::make_shared<EngineCollector>(engine, active_streams);
  auto& reg = *m->registry_;
  m->ttft_ = &pm::BuildHistogram()
                  .Name("kvsplit:time_to_first_token_seconds")
                  .Help("Admission to first token")
                  .Register(reg);
  m->itl_ = &pm::BuildHistogram()
                 .Name("kvsplit:inter_token_latency_seconds")
                 .Help("Gap between consecutive tokens of a request")
                 .Register(reg);
  m->e2e_ = &pm::BuildHistogram()
                 .Name("kvsplit:e2e_request_latency_seconds")
                 .Help("Admission to last token")
                 .Register(reg);
  m->queue_ = &pm::BuildHistogram()
                   .Name("kvsplit:request_queue_time_seconds")
                   .Help("Admission to first scheduled")
                   .Register(reg);
  m->calls_ = &pm::BuildCounter()
                   .Name("kvsplit:grpc_generate_calls_total")
                   .Help("Ended Generate calls by gRPC status code")
                   .Register(reg);
  m->parse_errors_ = &pm::BuildCounter()
                          .Name("kvsplit:grpc_request_parse_errors_total")
                          .Help("Authenticated requests whose message could not be parsed")
                          .Register(reg);
  auto http = MetricsHttpServer::start(host, port, [p = m.get()] { return p->render(); });
  if (!http.ok()) return http.status();
  m->http_ = std::move(http).value();
  m->port_ = m->http_->port();
  return m;
}

ServerMetrics::~ServerMetrics() {
  if (http_) http_->stop();
}

StatusOr<std::string> ServerMetrics::render() const {
  try {
    std::vector<pm::MetricFamily> families = registry_->Collect();
    std::vector<pm::MetricFamily> engine = collector_->Collect();
    families.insert(families.end(), std::make_move_iterator(engine.begin()),
                    std::make_move_iterator(engine.end()));
    std::ostringstream out;
    pm::TextSerializer().Serialize(out, families);
    return out.str();
  } catch (const std::exception& e) {  // prometheus-cpp may throw (std::bad_alloc, invalid labels)
    return internal_error(std::string("metrics: cannot render: ") + e.what());
  }
}

void ServerMetrics::set_active_streams(const std::atomic<int32_t>* counter) {
  collector_->set_active(counter);
}

ServerMetrics::ClassHistograms ServerMetrics::histograms(const std::string& sla_class) {
  const pm::Labels l = {{"sla_class", sla_class}};
  return {&ttft_->Add(l, latency_buckets()), &itl_->Add(l, latency_buckets()),
          &e2e_->Add(l, latency_buckets()), &queue_->Add(l, latency_buckets())};
}

void ServerMetrics::observe_request(const ClassHistograms& h, const TokenEvent& ev) {
  if (ev.usage.completion_tokens > 0) h.ttft->Observe(ev.timings.ttft_ms / 1e3);
  h.queue->Observe(ev.timings.queue_ms / 1e3);
  h.e2e->Observe(ev.timings.e2e_ms / 1e3);
}

void ServerMetrics::observe_itl(const ClassHistograms& h, double seconds, size_t count) {
  for (size_t i = 0; i < count; ++i) h.itl->Observe(seconds);
}

void ServerMetrics::count_call(const char* code_name) {
  calls_->Add({{"code", code_name}}).Increment();
}

void ServerMetrics::count_parse_error(const char* method) {
  parse_errors_->Add({{"method", method}}).Increment();
}

}  // namespace kvsplit::server
