// kvsplit-server: the gRPC front end. See docs/server.md.
//
//   kvsplit-server --config configs/default.yaml [--port N --model PATH ...]   (flags override)
//   kvsplit-server --model DIR --port N                                         (no config file)
//   kvsplit-server --check-config FILE                                          (validate, exit)
//
// Signals: SIGHUP reloads the SLA classes and the kvm policy from --config (a bad file is logged,
// the old policy stays; each changed setting elsewhere is logged as needing a restart, not
// applied); SIGTERM/SIGINT drain: stop accepting, wait up to server.drain_timeout_ms for in-flight
// requests, cancel the rest, give the streams up to 2 s to send their last messages, exit 0. A
// second SIGTERM/SIGINT during the drain or those 2 s cancels what is still in flight at once and
// exits, through the same teardown, 128 + its signal number (143 for SIGTERM, 130 for SIGINT).
// A gRPC port that stops accepting connections (out of file descriptors) drains the same way and
// exits 1, for a supervisor to restart the server: gRPC would never accept on it again.
// SIGHUP also reloads server.api_keys and their per-key policies, unless --api-key gave the keys
// (plain keys, full rights).
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <optional>
#include <string_view>
#include <thread>

#include "common/cli_options.h"
#include "common/file_read.h"
#include "common/log.h"
#include "config/config.h"
#include "engine/engine_impl.h"
#include "model/default_model.h"
#include "server/grpc_server.h"
#include "server/metrics.h"
#include "server/protocol.h"

namespace {

using kvsplit::Status;
namespace config = kvsplit::config;
namespace server = kvsplit::server;

struct Flags {
  std::string config_file, check_config, model, tokenizer, host, backend, tls_cert, tls_key,
      log_level = "info";
  std::string metrics_host;
  int port = 0, metrics_port = 0;
  bool port_given = false, metrics_port_given = false;  // a value given is checked as the config's
  std::vector<std::string> api_keys;
};

void apply_flags(const Flags& f, config::Config* c) {
  if (!f.model.empty()) {
    c->engine.model = f.model;
    c->engine.tokenizer = f.tokenizer;
    c->model_given = true;
  } else if (!f.tokenizer.empty()) {
    c->engine.tokenizer = f.tokenizer;
  }
  if (!f.host.empty()) c->server.host = f.host;
  if (f.port_given) c->server.port = f.port;
  if (f.metrics_port_given) c->server.metrics_port = f.metrics_port;
  if (!f.metrics_host.empty()) c->server.metrics_host = f.metrics_host;
  if (!f.backend.empty()) c->engine.backend = f.backend;
  if (!f.tls_cert.empty()) c->server.tls.cert_file = f.tls_cert;
  if (!f.tls_key.empty()) c->server.tls.key_file = f.tls_key;
  if (!f.api_keys.empty()) c->server.api_keys = config::plain_api_keys(f.api_keys);  // full rights
}

// The sections a SIGHUP applies, and server.api_keys when the keys come from the file; a change
// anywhere else needs a restart.
constexpr std::string_view kReloadedSections[] = {"sla_classes", "kvm"};
constexpr std::string_view kReloadedKeys = "server.api_keys";

// SIGHUP: logs each setting of the file, outside kReloadedSections, whose value differs from the
// file the server started with (`started`): it needs a restart and is not applied. Up to
// kMaxLines lines, then a count.
void warn_unapplied_changes(const std::string& started, const std::string& now,
                            bool keys_reloaded) {
  constexpr size_t kMaxLines = 32;
  auto changed = config::changed_settings(started, now);
  if (!changed.ok()) {  // both texts loaded as configs: not expected
    KVSPLIT_LOG_WARN("SIGHUP: cannot compare with the file as started: {}",
                     changed.status().message());
    return;
  }
  size_t n = 0;
  for (const std::string& path : *changed) {
    const std::string_view section = std::string_view(path).substr(0, path.find('.'));
    if (std::find(std::begin(kReloadedSections), std::end(kReloadedSections), section) !=
            std::end(kReloadedSections) ||
        (keys_reloaded && path == kReloadedKeys))
      continue;
    if (++n <= kMaxLines)
      KVSPLIT_LOG_WARN("SIGHUP: {}: changed, needs a restart; not applied", path);
  }
  if (n > kMaxLines) {
    KVSPLIT_LOG_WARN("SIGHUP: {} more changed settings need a restart; not applied", n - kMaxLines);
  }
}

// SIGHUP: re-read the SLA classes and the kvm policy of `path`. Both are checked before either
// is applied (the policy against the new classes), so a rejected policy never leaves new classes
// beside old rules naming a class that is gone; then classes first (the rules name them).
// `running`: the kv.cuts.semantic the engine started with, which the classes' kv blocks are read
// over (a changed kv.cuts.semantic needs a restart). `started`: the file's text at start (none
// when it could not be read), against which a file that loads is checked for changed settings
// this does not apply (warn_unapplied_changes).
void reload_sla_classes(const std::string& path, const kvsplit::SemanticCutConfig& running,
                        const std::optional<std::string>& started, kvsplit::Engine* engine,
                        server::GenerationService* svc, bool keys_from_flags) {
  if (path.empty()) {
    KVSPLIT_LOG_WARN("SIGHUP: no --config file to reload; SLA classes unchanged");
    return;
  }
  // A file with nothing but blanks and comments loads as every default, one `default` class in
  // place of the operator's: an editor or a `>` redirect leaves it so for a moment, and a SIGHUP
  // then replaced every class (clients naming theirs were refused until the next reload).
  auto text = kvsplit::common::read_regular_file(path, size_t{64} << 20, "config file");
  if (text.ok()) {
    bool content = false;
    for (size_t pos = 0; pos < text->size() && !content;) {
      const size_t end = std::min(text->find('\n', pos), text->size());
      const size_t first = text->find_first_not_of(" \t\r", pos);
      content = first < end && (*text)[first] != '#';
      pos = end + 1;
    }
    if (!content) {
      KVSPLIT_LOG_ERROR(
          "SIGHUP: reload rejected, old SLA policy stays in force: {} has no settings (empty, or "
          "comments only: a write in progress?)",
          path);
      return;
    }
  }
  auto fresh = config::load_config_file(path, running);
  if (!fresh.ok()) {
    KVSPLIT_LOG_ERROR("SIGHUP: reload rejected, old SLA policy stays in force: {}",
                      fresh.status().message());
    return;
  }
  if (started && text.ok()) warn_unapplied_changes(*started, *text, !keys_from_flags);
  if (!keys_from_flags) {  // before the SLA policy, whose rejection must not keep a revoked key
    auto ended = svc->update_api_keys(fresh->server.api_keys);
    if (ended.ok()) {
      if (!fresh->server.api_keys.empty())  // a server without keys has nothing to reload
        KVSPLIT_LOG_INFO(
            "SIGHUP: server.api_keys reloaded ({} keys; {} open calls of removed keys ended)",
            fresh->server.api_keys.size(), *ended);
    } else {
      KVSPLIT_LOG_ERROR("SIGHUP: server.api_keys not applied: {}", ended.status().message());
    }
  }
  if (Status pre = engine->check_kvm_policy(fresh->engine.kvm, fresh->engine.sla_classes);
      !pre.ok()) {
    KVSPLIT_LOG_ERROR(
        "SIGHUP: engine rejected the new kvm policy, old SLA classes and policy stay: {}",
        pre.to_string());
    return;
  }
  Status st = engine->update_sla_classes(fresh->engine.sla_classes);
  if (!st.ok()) {
    KVSPLIT_LOG_ERROR("SIGHUP: engine rejected the new SLA classes, old policy stays: {}",
                      st.to_string());
    return;
  }
  svc->set_sla_classes(fresh->engine.sla_classes);
  std::string names;
  for (const auto& c : fresh->engine.sla_classes) names += (names.empty() ? "" : ", ") + c.name;
  KVSPLIT_LOG_INFO("SIGHUP: reloaded {} SLA classes from {}: {}", fresh->engine.sla_classes.size(),
                   path, names);
  // The KV cache manager's policy (docs/kvm.md): a bad one keeps the old.
  st = engine->update_kvm_policy(fresh->engine.kvm);
  if (!st.ok()) {
    KVSPLIT_LOG_ERROR("SIGHUP: engine rejected the new kvm policy, old policy stays: {}",
                      st.to_string());
    return;
  }
  KVSPLIT_LOG_INFO("SIGHUP: kvm policy reloaded ({} rules)", fresh->engine.kvm.rules.size());
}

// host:port with an IPv6 literal bracketed ([::1]:50051), as a URL or a gRPC target needs it.
std::string host_port(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// Startup lines about what is exposed: API keys over plaintext, and the metrics listener (which
// has no authentication). The ports are the bound ones (a configured 0 picks one).
void warn_about_exposure(const config::ServerConfig& c, int grpc_port, int metrics_port) {
  if (!c.api_keys.empty() && !c.tls.enabled()) {
    KVSPLIT_LOG_WARN(
        "API keys are set but TLS is off: bearer keys travel in clear text on {}; set "
        "server.tls (or --tls-cert/--tls-key) or terminate TLS in front of the server",
        host_port(c.host, grpc_port));
  }
  if (metrics_port < 0) {
    KVSPLIT_LOG_INFO("metrics: off (server.metrics_port -1)");
    return;
  }
  const std::string host = c.metrics_bind_host();
  const bool loopback = host == "127.0.0.1" || host == "::1" || host == "localhost";
  const std::string line = fmt::format(
      "metrics: http://{}/metrics has no authentication; anyone who can reach {} can read "
      "them (server.metrics_host{})",
      host_port(host, metrics_port), host,
      c.metrics_host.empty() ? (c.api_keys.empty() ? " unset: server.host"
                                                   : " unset: loopback, since API keys are set")
                             : "");
  if (loopback) {
    KVSPLIT_LOG_INFO("{}", line);
  } else {
    KVSPLIT_LOG_WARN("{}", line);
  }
}

// During the drain and the flush (the streams' last messages, kFlush): a second SIGTERM/SIGINT
// ends the drain at once (Engine::end_drain cancels the requests still in flight, whose clients
// get UNAVAILABLE "engine shut down"), and kFlushAfterSignal after both the signal and the start of
// gRPC's shutdown (flushing()) it cancels every gRPC call still open (server::cancel_all_calls: a
// client that does not read its stream would otherwise hold the exit for the rest of kFlush), so
// that the normal teardown runs at once. If the process is still
// not done kForceGrace later, or a third signal comes, it exits without further cleanup. The exit
// code is 128 + the signal when the second signal found Generate calls still open, 0 when the
// drain had nothing left. SIGHUP is ignored during the drain.
class ForceExitWatch {
 public:
  static constexpr auto kForceGrace = std::chrono::seconds(5);
  // How long gRPC's shutdown waits for the calls to end after the drain: the streams' last
  // messages and statuses (a client that does not read its stream holds its call open).
  static constexpr auto kFlush = std::chrono::seconds(2);
  // After a second signal: time for the final statuses of clients that do read (they get
  // "engine shut down" rather than gRPC's "Cancelling all calls").
  static constexpr auto kFlushAfterSignal = std::chrono::milliseconds(100);

  // `grpc_server` must outlive the watch (finish() or the destructor).
  ForceExitWatch(kvsplit::Engine* engine, const server::GenerationService* service,
                 grpc::Server* grpc_server)
      : thread_([this, engine, service, grpc_server] { run(engine, service, grpc_server); }) {}
  ~ForceExitWatch() { finish(); }

  // Called just before gRPC's Shutdown (the flush starts). grpc_server_cancel_all_calls is only
  // usable after shutdown has started, and before it the engine may still be joining its workers
  // (a long step): the calls are cancelled kFlushAfterSignal after both the signal and this.
  void flushing() {
    flush_start_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  }

  // Stops watching (within 20 ms); the number of a second signal that cut the drain short, or 0.
  int finish() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return cut_short_.load() ? forced_.load() : 0;
  }

 private:
  void run(kvsplit::Engine* engine, const server::GenerationService* service,
           grpc::Server* grpc_server) {
    using Clock = std::chrono::steady_clock;
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
    Clock::time_point cut = Clock::time_point::max();
    Clock::time_point signalled = Clock::time_point::max();  // the second signal
    bool cancelled = false;
    while (!stop_.load()) {
      const auto now = Clock::now();
      if (now >= cut) break;
      const int64_t flush_ns = flush_start_ns_.load();
      if (!cancelled && signalled != Clock::time_point::max() && flush_ns != 0) {
        const Clock::time_point flush{Clock::duration(flush_ns)};
        if (now >= std::max(signalled, flush) + kFlushAfterSignal) {
          server::cancel_all_calls(grpc_server);
          cancelled = true;
        }
      }
      timespec poll{0, 20 * 1000 * 1000};
      const int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig < 0) continue;  // timeout or EINTR
      if (sig == SIGHUP) {
        KVSPLIT_LOG_WARN("SIGHUP during the drain: ignored");
        continue;
      }
      if (forced_.load() != 0) break;  // a third signal: exit now
      forced_.store(sig);
      const int open = service->active_streams();
      cut_short_.store(open > 0);
      KVSPLIT_LOG_WARN(
          "{} during the drain: cancelling what is in flight ({} open streams), exiting",
          strsignal(sig), open);
      engine->end_drain();
      signalled = Clock::now();
      cut = signalled + kForceGrace;
    }
    if (stop_.load()) return;
    KVSPLIT_LOG_ERROR("forced exit: not stopped cleanly; exiting {} now", 128 + forced_.load());
    spdlog::default_logger()->flush();
    std::_Exit(128 + forced_.load());
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> forced_{0};
  std::atomic<bool> cut_short_{false};
  std::atomic<int64_t> flush_start_ns_{
      0};               // steady_clock ticks when flushing() was called; 0: not yet
  std::thread thread_;  // last: starts after the fields above
};

// Where neither the file nor --model names a model: the CLI's default-model rule (the first of
// $KVSPLIT_MODELS, ./models, ../shared/models holding stories260K, else synthetic). Start-up and
// --check-config both apply it, so the check reports the model the start would load.
void apply_default_model(config::Config* cfg) {
  if (cfg->model_given) return;
  const auto def = kvsplit::model::resolve_default_model();
  cfg->engine.model = def.model;
  if (cfg->engine.tokenizer.empty()) cfg->engine.tokenizer = def.tokenizer;
  KVSPLIT_LOG_INFO("no model given: {}", def.note);
}

// What start-up refuses as a bad configuration (exit 2), and so --check-config too: the file's
// own rules, what the engine checks at start beyond them (a KVM rule whose cut is off, a quant
// fraction without a quantized pool...) without loading a model, and the TLS files.
Status check_config(const config::Config& c) {
  KVSPLIT_RETURN_IF_ERROR(config::validate_config(c));
  KVSPLIT_RETURN_IF_ERROR(config::validate_after_flags(c));
  KVSPLIT_RETURN_IF_ERROR(validate_engine_config(c.engine));
  return server::check_tls_files(c.server);
}

// Sent by the process to itself (route_grpc_log's callback) when a gRPC port stops accepting.
constexpr int kListenerFailedSignal = SIGUSR2;

// The soft limit on open files raised to the hard one: each connection and each disk-tier file
// takes a descriptor, and the common soft default (1024) is reached by a few hundred clients.
void raise_open_file_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max) return;
  const rlim_t before = r.rlim_cur;
  r.rlim_cur = r.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &r) != 0) {
    r.rlim_cur = std::max<rlim_t>(before, 1 << 20);  // an unlimited hard limit past fs.nr_open
    if (r.rlim_cur > r.rlim_max || setrlimit(RLIMIT_NOFILE, &r) != 0) {
      KVSPLIT_LOG_WARN("open-file limit stays at {}: cannot raise it toward the hard limit ({})",
                       before, std::strerror(errno));
      return;
    }
  }
  KVSPLIT_LOG_INFO("open-file limit raised from {} to {}", before, r.rlim_cur);
}

int run(const Flags& flags) {
  config::Config cfg;
  std::optional<std::string> started_text;  // the file as started, for SIGHUP's comparison
  if (!flags.config_file.empty()) {
    auto loaded = config::load_config_file(flags.config_file);
    if (!loaded.ok()) {
      std::cerr << "kvsplit-server: " << loaded.status().message() << "\n";
      return 2;
    }
    cfg = std::move(loaded).value();
    if (auto text = kvsplit::common::read_regular_file(
            flags.config_file, kvsplit::common::kMaxConfigFileBytes, "config file");
        text.ok())
      started_text = std::move(text).value();
  }
  apply_flags(flags, &cfg);
  if (Status st = check_config(cfg); !st.ok()) {
    std::cerr << "kvsplit-server: " << st.message() << "\n";
    return 2;  // a bad config value
  }
  apply_default_model(&cfg);
  KVSPLIT_LOG_INFO("config: {}", config::describe(cfg));
  raise_open_file_limit();  // before the engine opens its disk tier and devices

  // The model loads on its own thread (it can take minutes) while this one watches for
  // SIGTERM / SIGINT: a stop asked for during start-up exits at once (nothing to drain yet)
  // instead of waiting for the load and then briefly serving.
  kvsplit::StatusOr<std::unique_ptr<kvsplit::Engine>> engine_or =
      kvsplit::unavailable("not started");
  {
    std::atomic<bool> loaded{false};
    std::thread loader([&] {
      engine_or = kvsplit::Engine::create(cfg.engine);
      loaded.store(true, std::memory_order_release);
    });
    sigset_t stop_set;
    sigemptyset(&stop_set);
    for (int s : {SIGTERM, SIGINT}) sigaddset(&stop_set, s);
    while (!loaded.load(std::memory_order_acquire)) {
      const timespec tick{0, 50'000'000};
      const int sig = sigtimedwait(&stop_set, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        KVSPLIT_LOG_WARN("{} during start-up: exit {} without serving", strsignal(sig), 128 + sig);
        // Flushed, not shut down: the loader's threads may still log through the logger.
        spdlog::default_logger()->flush();
        std::fflush(nullptr);
        std::_Exit(128 + sig);  // the loader thread cannot be stopped mid-load
      }
    }
    loader.join();
  }
  if (!engine_or.ok()) {
    std::cerr << "kvsplit-server: cannot start the engine: " << engine_or.status().to_string()
              << "\n";
    return 1;
  }
  std::unique_ptr<kvsplit::Engine> engine = std::move(engine_or).value();

  server::ServiceOptions opts;
  opts.max_concurrent_streams = cfg.server.max_concurrent_streams;
  opts.max_streams_per_tenant = cfg.server.max_streams_per_tenant;
  opts.max_prompt_bytes = cfg.server.max_prompt_bytes;
  opts.max_tokens_limit = cfg.server.max_tokens_limit;
  opts.default_max_tokens = cfg.server.default_max_tokens;
  opts.api_keys = cfg.server.api_keys;
  opts.request_message_timeout = std::chrono::milliseconds(cfg.server.request_message_timeout_ms);
  // The metrics collector reads the service's stream counter: the counter is patched in once the
  // service exists (before the server starts), and the listener stops before the service goes.
  std::unique_ptr<server::ServerMetrics> metrics;
  if (cfg.server.metrics_port >= 0) {
    auto m = server::ServerMetrics::create(cfg.server.metrics_bind_host(), cfg.server.metrics_port,
                                           engine.get(), nullptr);
    if (!m.ok()) {
      std::cerr << "kvsplit-server: " << m.status().message() << "\n";
      return 1;
    }
    metrics = std::move(m).value();
    opts.metrics = metrics.get();
  }
  server::GenerationService service(engine.get(), opts, cfg.engine.sla_classes);
  if (metrics) metrics->set_active_streams(service.active_streams_counter());
  // Destroyed before `service` on every return from here: the listener stops before the stream
  // counter it reads goes away.
  struct StopMetrics {
    std::unique_ptr<server::ServerMetrics>& metrics;
    ~StopMetrics() { metrics.reset(); }
  } stop_metrics{metrics};
  server::route_grpc_log([] { kill(getpid(), kListenerFailedSignal); });
  auto running = server::start_grpc_server(cfg.server, &service);
  if (!running.ok()) {
    std::cerr << "kvsplit-server: " << running.status().message() << "\n";
    return 1;
  }
  const auto info = engine->model_info();
  KVSPLIT_LOG_INFO("model {} ({}, vocab {}, context {})", info.source, info.architecture,
                   info.vocab_size, info.max_context);
  // before "listening on"
  warn_about_exposure(cfg.server, running->port, metrics ? metrics->port() : -1);
  // Machine-readable lines for scripts and tests (stdout, flushed).
  std::printf("kvsplit-server listening on %s%s\n",
              host_port(cfg.server.host, running->port).c_str(),
              cfg.server.tls.enabled() ? " (TLS)" : "");
  if (metrics)
    std::printf("kvsplit-server metrics on http://%s/metrics\n",
                host_port(cfg.server.metrics_bind_host(), metrics->port()).c_str());
  std::fflush(stdout);

  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP, kListenerFailedSignal}) sigaddset(&set, s);
  bool listener_failed = false;
  for (;;) {
    siginfo_t info{};
    const int sig = sigwaitinfo(&set, &info);
    if (sig < 0) continue;
    if (sig == SIGHUP) {
      reload_sla_classes(flags.config_file, cfg.engine.semantic, started_text, engine.get(),
                         &service, !flags.api_keys.empty());
      continue;
    }
    if (sig == kListenerFailedSignal) {
      if (info.si_pid != getpid()) {
        KVSPLIT_LOG_WARN("{} from pid {} ignored", strsignal(sig), info.si_pid);
        continue;
      }
      listener_failed = true;
      KVSPLIT_LOG_ERROR(
          "the gRPC port stopped accepting connections (gRPC's error above; out of file "
          "descriptors?) and gRPC {} never accepts on it again: draining, then exit 1 so that "
          "a supervisor restarts the server",
          grpc::Version());
    }
    break;
  }
  const auto drain = std::chrono::milliseconds(cfg.server.drain_timeout_ms);
  KVSPLIT_LOG_INFO(
      "draining: no new requests; waiting up to {} ms for {} open streams (a second SIGTERM or "
      "SIGINT cancels them and exits at once)",
      drain.count(), service.active_streams());
  ForceExitWatch force(engine.get(), &service, running->server.get());
  service.start_draining();
  server::set_serving(running->server.get(), false);
  engine->shutdown(drain);  // finishes in-flight requests up to `drain`, then cancels the rest
  // Every request has its final event now; give the reactors a moment to flush them (a second
  // signal cuts this short: ForceExitWatch; it used to wait out the 2 s anyway).
  force.flushing();
  running->server->Shutdown(std::chrono::system_clock::now() + ForceExitWatch::kFlush);
  running->server->Wait();
  if (const int forced = force.finish(); forced != 0) {
    KVSPLIT_LOG_WARN("stopped by a second signal ({}): exit {}", strsignal(forced), 128 + forced);
    return 128 + forced;
  }
  KVSPLIT_LOG_INFO("stopped");
  return listener_failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Block the signals we handle before any thread starts, so only sigwait() sees them.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP, kListenerFailedSignal}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Before any thread starts (protobuf's SetLogHandler is not thread-safe).
  server::install_protobuf_log_handler();

  Flags f;
  CLI::App app{"kvsplit-server: gRPC front end of the kvsplit engine (kvsplit.v1.Generation)"};
  app.add_option("--config", f.config_file, "YAML config (configs/default.yaml); flags override it")
      ->check(CLI::ExistingFile);
  app.add_option("--check-config", f.check_config,
                 "validate FILE and exit (0: valid; 2: names the bad field)");
  app.add_option("--model", f.model, "model: llama2.c .bin, HF directory, or synthetic:<preset>");
  app.add_option("--tokenizer", f.tokenizer, "tokenizer file (default: beside the model)");
  app.add_option("--host", f.host, "listen address (default 0.0.0.0)");
  app.add_option("--port", f.port, "gRPC port (default 50051; 0 = any free port, printed)");
  app.add_option("--metrics-port", f.metrics_port,
                 "Prometheus port (default 9090; -1 = off; 0 = any)");
  app.add_option("--metrics-host", f.metrics_host,
                 "metrics listen address (default: 127.0.0.1 with API keys, else --host)");
  app.add_option("--backend", f.backend, "cpu | cuda");
  app.add_option("--tls-cert", f.tls_cert, "PEM certificate chain (TLS on)");
  app.add_option("--tls-key", f.tls_key, "PEM private key");
  app.add_option("--api-key", f.api_keys,
                 "accepted bearer key, with full rights (repeatable; replaces server.api_keys)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  kvsplit::strict_options(app);
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  f.port_given = app.count("--port") > 0;
  f.metrics_port_given = app.count("--metrics-port") > 0;
  // The log goes to stderr; stdout carries only the "listening on" lines scripts read.
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvsplit-server"));
  spdlog::set_level(spdlog::level::from_str(f.log_level));

  if (!f.check_config.empty()) {
    // Two files would leave which one was checked to a guess: the check reads only its own.
    if (app.count("--config") > 0) {
      std::cerr << "kvsplit-server: --check-config FILE checks FILE; give it without --config\n";
      return 2;
    }
    auto c = config::load_config_file(f.check_config);
    if (!c.ok()) {
      std::cerr << "kvsplit-server: " << c.status().message() << "\n";
      return 2;
    }
    // The flags given beside it override the file as they would at start (--backend cpu for a
    // CUDA file, --port ...), so the check is of the configuration the server would run.
    apply_flags(f, &*c);
    if (Status st = check_config(*c); !st.ok()) {
      std::cerr << "kvsplit-server: " << f.check_config << ": " << st.message() << "\n";
      return 2;
    }
    apply_default_model(&*c);
    std::cout << f.check_config << ": OK (" << config::describe(*c) << ")\n";
    return 0;
  }
  return run(f);
}
