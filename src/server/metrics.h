// Prometheus metrics of the server: prometheus-cpp's registry and families, exposed by our own
// HTTP listener (server/metrics_http.h) on its own port, GET /metrics.
// Latency histograms are observed by the stream reactors; gauges and counters that the engine
// owns (KV usage per pool, queue lengths, preemptions, tokens, SLO attainment per class) are
// read from Engine::stats() at scrape time, so they never drift from GetServerStats.
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "kvsplit/engine.h"
#include "server/metrics_http.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Histogram;
class Counter;
}  // namespace prometheus

namespace kvsplit::server {

class EngineCollector;

class ServerMetrics {
 public:
  // Binds host:port (port 0: any free port; see port()). `engine` must outlive this object.
  // kUnavailable when the port cannot be bound.
  static StatusOr<std::unique_ptr<ServerMetrics>> create(
      const std::string& host, int port, Engine* engine,
      const std::atomic<int32_t>* active_streams);
  ~ServerMetrics();

  int port() const { return port_; }
  // The text exposition (format 0.0.4) of every family: the registry's, then the engine's.
  StatusOr<std::string> render() const;
  // The open-stream counter reported as kvsplit:num_active_streams (may be set after create).
  void set_active_streams(const std::atomic<int32_t>* counter);

  // The latency histograms of one SLA class. Looked up once per stream (a family lookup takes a
  // lock and hashes the labels); observing through them afterwards touches only the histogram.
  struct ClassHistograms {
    prometheus::Histogram* ttft = nullptr;
    prometheus::Histogram* itl = nullptr;
    prometheus::Histogram* e2e = nullptr;
    prometheus::Histogram* queue = nullptr;
  };
  ClassHistograms histograms(const std::string& sla_class);
  // Per finished request (final event): TTFT (when it produced tokens), queue time, E2E.
  static void observe_request(const ClassHistograms& h, const TokenEvent& final_event);
  // `count` inter-token gaps of `seconds` each.
  static void observe_itl(const ClassHistograms& h, double seconds, size_t count);
  // Per ended Generate call by its gRPC status code name ("OK", "CANCELLED", ...; a call whose
  // deadline passed is "DEADLINE_EXCEEDED").
  void count_call(const char* code_name);
  // Per request whose message could not be parsed, by method name ("Generate", "Abort", ...).
  void count_parse_error(const char* method);

 private:
  ServerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<EngineCollector> collector_;
  prometheus::Family<prometheus::Histogram>* ttft_ = nullptr;
  prometheus::Family<prometheus::Histogram>* itl_ = nullptr;
  prometheus::Family<prometheus::Histogram>* e2e_ = nullptr;
  prometheus::Family<prometheus::Histogram>* queue_ = nullptr;
  prometheus::Family<prometheus::Counter>* calls_ = nullptr;
  prometheus::Family<prometheus::Counter>* parse_errors_ = nullptr;
  int port_ = -1;
  // Last member: destroyed (its thread joined) first, while the families it renders still exist.
  std::unique_ptr<MetricsHttpServer> http_;
};

}  // namespace kvsplit::server
