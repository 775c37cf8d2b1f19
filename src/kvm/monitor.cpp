#include "kvm/monitor.h"

#include <algorithm>
#include <cmath>

namespace kvsplit::kvm {
namespace {

// Nearest-rank percentile of an unsorted sample (copied).
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

double ratio(double num, double den) { return den > 0 ? num / den : 0; }

}  // namespace

void LatencyWindow::add(const std::string& sla_class, double now_ms, double ttft_ms,
                        double mean_itl_ms) {
  by_class_[sla_class].push_back({now_ms, ttft_ms, mean_itl_ms});
}

void LatencyWindow::fill(double now_ms, KvmClassLatency* out) {
  auto it = by_class_.find(out->name);
  if (it == by_class_.end()) return;
  std::deque<Sample>& q = it->second;
  while (!q.empty() && q.front().time_ms < now_ms - window_ms_) q.pop_front();
  std::vector<double> ttft, itl;
  ttft.reserve(q.size());
  itl.reserve(q.size());
  int64_t samples = 0;
  for (const Sample& s : q) {  // NaN: no sample of that kind (a one-token request has no ITL)
    if (s.time_ms > now_ms) continue;  // finished after this sample (the simulator's steps)
    ++samples;
    if (!std::isnan(s.ttft_ms)) ttft.push_back(s.ttft_ms);
    if (!std::isnan(s.itl_ms)) itl.push_back(s.itl_ms);
  }
  out->samples = samples;
  out->ttft_p50_ms = percentile(ttft, 50);
  out->ttft_p99_ms = percentile(ttft, 99);
  out->itl_p50_ms = percentile(itl, 50);
  out->itl_p99_ms = percentile(itl, 99);
}

KvmSnapshot Monitor::sample(double now_ms, const EngineStats& stats, const MonitorInputs& in) {
  KvmSnapshot s;
  s.time_ms = now_ms;
  int64_t swaps = 0, recalls = 0, prefix_q = 0, prefix_h = 0;
  int64_t decoding_evicted = 0, decoding_pages = 0;  // pages_evicted_fraction's
  const double dt_s = have_prev_ && now_ms > prev_ms_ ? (now_ms - prev_ms_) / 1000.0 : 0;
  std::map<std::string, LinkBytes> link_bytes;
  for (const PoolStats& p : stats.pools) {
    KvmWorkerUse w;
    w.name = p.name;
    w.device_kv_use = ratio(p.kv_blocks_total - p.kv_blocks_free, p.kv_blocks_total);
    w.host_kv_use = ratio(static_cast<double>(p.kv_host_bytes_used),
                          static_cast<double>(p.kv_host_bytes_total));
    w.shard_use = p.kv_shard_use;
    w.disk_kv_use = ratio(static_cast<double>(p.kv_disk_bytes_used),
                          static_cast<double>(p.kv_disk_bytes_total));
    s.workers.push_back(w);
    // Prefill workers hand off full pages and never hold decoding KV for long: the device-use
    // maximum is over the pools that decode (decode and colocated ones).
    const bool decodes = p.name.rfind("prefill", 0) != 0;
    if (decodes) {
      s.device_kv_use = std::max(s.device_kv_use, w.device_kv_use);
      s.host_kv_use = std::max(s.host_kv_use, w.host_kv_use);
      s.disk_kv_use = std::max(s.disk_kv_use, w.disk_kv_use);
      // Only while the disk is in use: a rule that stopped its use (swap = never) must be able
      // to see the latency it reacted to go, or it never exits.
      if (p.kv_disk_latency_age_ms <= latency_.window_ms())
        s.storage_latency_ms = std::max(s.storage_latency_ms, p.kv_disk_latency_ms);
      decoding_evicted += p.kv_pages_evicted;
      decoding_pages += p.kv_sequence_pages;
    }
    s.pages_full += p.kv_pages_full;
    s.pages_int8 += p.kv_pages_int8;
    s.pages_int4 += p.kv_pages_int4;
    s.pages_evicted += p.kv_pages_evicted;
    swaps += p.kv_swaps_out + p.kv_swaps_in;
    recalls += p.kv_recalls;
    // link_use: the busiest worker's host link, the bytes that crossed it over its own measured
    // bandwidth (each GPU has its own link; a sum over workers divided by one link's bandwidth
    // read N workers' traffic as N times the load). Swaps cross it; of the shard exchange only
    // what was staged through host memory does: CPU shards, virtual shards on one GPU and GPU
    // peers never touch it (until 2026-12-07 every exchanged byte was counted against it).
    const LinkBytes moved{p.kv_swap_bytes + p.kv_shard_exchange_host_bytes,
                          p.kv_shard_exchange_bytes - p.kv_shard_exchange_host_bytes};
    link_bytes[p.name] = moved;
    auto prev = prev_link_bytes_.find(p.name);
    const double bandwidth =
        p.kv_link_bytes_per_s > 0 ? p.kv_link_bytes_per_s : in.link_bytes_per_s;
    if (dt_s > 0 && prev != prev_link_bytes_.end()) {
      s.link_use = std::max(
          s.link_use, ratio(static_cast<double>(moved.host - prev->second.host) / dt_s, bandwidth));
      s.peer_exchange_mb_s = std::max(
          s.peer_exchange_mb_s, static_cast<double>(moved.peer - prev->second.peer) / dt_s / 1e6);
    }
    prefix_q += p.kv_prefix_queries;
    prefix_h += p.kv_prefix_hits;
  }
  // Of the decoding sequences' pages: not of the full blocks in use, which count idle
  // prefix-cache pages and the prefill pools' (until 2026-12-06 they did, and the fraction read
  // lower than the simulator's with a prefix cache on).
  s.pages_evicted_fraction =
      ratio(static_cast<double>(decoding_evicted), static_cast<double>(decoding_pages));
  s.prefix_hit_rate = ratio(static_cast<double>(prefix_h), static_cast<double>(prefix_q));
  if (dt_s > 0) {
    s.swap_rate = static_cast<double>(swaps - prev_swaps_) / dt_s;
    s.recall_rate = static_cast<double>(recalls - prev_recalls_) / dt_s;
  }
  have_prev_ = true;
  prev_ms_ = now_ms;
  prev_swaps_ = swaps;
  prev_recalls_ = recalls;
  prev_link_bytes_ = std::move(link_bytes);
  for (const SlaClassStats& c : stats.classes) {
    KvmClassLatency l;
    l.name = c.name;
    l.queue_depth = c.queued;
    l.queue_wait_ms = c.oldest_queued_ms;
    latency_.fill(now_ms, &l);
    s.classes.push_back(l);
  }
  return s;
}

}  // namespace kvsplit::kvm
