// kvsplit-bench-serving: gRPC load generator. See docs/server.md.
//
//   kvsplit-bench-serving --server 127.0.0.1:50051 --rate 20 --num-requests 500 --json-out r.json
//   kvsplit-bench-serving --server ADDR --concurrency 64 --prompt-len 16:128 --output-len 32:128
//   kvsplit-bench-serving --in-process-model synthetic:llama-110m --concurrency 64
//       (starts an engine + gRPC server in this process and runs the same workload through gRPC
//        on loopback and directly through the engine, reporting the tokens/s ratio; --warmup
//        requests through both paths first, --rounds N alternates the order of the two passes)
//
// Requests are token-id prompts (uniform random ids, seeded) with uniform length ranges, Poisson
// arrivals at --rate (0: as fast as --concurrency allows), an SLA class mix, ignore_eos so every
// request produces its full length. --trace FILE replays a request trace instead (docs/kvm.md:
// arrivals, lengths and classes from the file); --write-trace FILE saves the workload sent.
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/cli_options.h"
#include "config/config.h"
#include "kvm/trace.h"
#include "server/bench_report.h"
#include "server/client_channel.h"
#include "server/grpc_server.h"

namespace v1 = kvsplit::v1;
using kvsplit::server::bench::Outcome;
using kvsplit::server::bench::Work;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

// CPU seconds (user + system) used by this process so far: with an in-process engine, the cost
// of serving (engine + gRPC server + client) independent of what else runs on the machine.
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return s(u.ru_utime) + s(u.ru_stime);
}

// One streamed request on the callback client API.
class StreamCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamCall(v1::Generation::Stub* stub, const kvsplit::server::ClientOptions& copt, const Work& w,
             Outcome* out, std::function<void()> done)
      : out_(out), done_(std::move(done)) {
    kvsplit::server::add_auth(copt, &ctx_);
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    req_.mutable_prompt_token_ids()->mutable_ids()->Add(w.prompt.begin(), w.prompt.end());
    req_.set_max_tokens(w.max_tokens);
    req_.set_ignore_eos(true);
    req_.set_sla_class(w.sla_class);
    req_.mutable_sampling()->set_temperature(0.0f);
    out_->sla_class = w.sla_class;
    start_ = last_ = Clock::now();
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (resp_.token_ids_size() > 0) {
      const Clock::time_point previous = last_;
      last_ = Clock::now();
      out_->record_message(since(start_, last_) * 1e3, since(previous, last_) * 1e3,
                           resp_.token_ids_size());
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    out_->e2e_ms = since(start_, Clock::now()) * 1e3;
    out_->ok = s.ok();
    if (!s.ok()) out_->error = s.error_message();
    auto done = std::move(done_);
    delete this;
    done();
  }

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
  Outcome* out_;
  std::function<void()> done_;
  Clock::time_point start_, last_;
};

// Same request straight through the engine (a thread per in-flight request).
void run_in_engine(kvsplit::Engine* engine, const Work& w, Outcome* out) {
  kvsplit::Request r;
  r.prompt_token_ids = w.prompt;
  r.sampling.max_tokens = static_cast<int32_t>(w.max_tokens);
  r.sampling.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.sla_class = w.sla_class;
  out->sla_class = w.sla_class;
  const auto start = Clock::now();
  auto last = start;
  auto h = engine->submit(std::move(r));
  if (!h.ok()) {
    out->error = h.status().to_string();
    return;
  }
  kvsplit::TokenEvent ev;
  while (h->next(&ev, std::chrono::minutes(10))) {
    const auto now = Clock::now();
    if (!ev.token_ids.empty()) {
      out->record_message(since(start, now) * 1e3, since(last, now) * 1e3,
                          static_cast<int>(ev.token_ids.size()));
      last = now;
    }
    if (ev.final) {
      out->ok = ev.status.ok();
      if (!ev.status.ok()) out->error = ev.status.to_string();
      break;
    }
  }
  out->e2e_ms = since(start, Clock::now()) * 1e3;
}

// Dispatches `works` (arrival times, concurrency cap) through `launch`; shows progress on a TTY.
double dispatch(const std::vector<Work>& works, int concurrency,
                const std::function<void(size_t, std::function<void()>)>& launch) {
  std::mutex mu;
  std::condition_variable cv;
  int inflight = 0;
  size_t finished = 0;
  const bool tty = isatty(2);
  const auto t0 = Clock::now();
  auto on_done = [&] {
    std::lock_guard<std::mutex> l(mu);
    --inflight;
    ++finished;
    cv.notify_all();
  };
  std::thread progress([&] {
    if (!tty) return;
    std::unique_lock<std::mutex> l(mu);
    while (finished < works.size()) {
      const int width = 40, filled = static_cast<int>(width * finished / works.size());
      std::fprintf(stderr, "\r[%s%s] %zu/%zu  in flight %d  %.1fs",
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   finished, works.size(), inflight, since(t0, Clock::now()));
      cv.wait_for(l, std::chrono::milliseconds(200));
    }
    std::fprintf(stderr, "\r%80s\r", "");
  });
  for (size_t i = 0; i < works.size(); ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(works[i].arrival_s)));
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return inflight < concurrency; });
      ++inflight;
    }
    launch(i, on_done);
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return finished == works.size(); });
  }
  const double elapsed = since(t0, Clock::now());
  cv.notify_all();
  progress.join();
  return elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  kvsplit::server::ClientOptions copt;
  kvsplit::server::bench::Spec spec;
  std::string json_out, in_process_model, prompt_len = "16:64", output_len = "32:128", class_mix;
  std::string trace_in, trace_out;
  CLI::App app{"kvsplit-bench-serving: gRPC load generator for kvsplit-server"};
  app.add_option("--server", copt.server, "host:port");
  app.add_option("--num-requests", spec.num_requests, "requests to send (default 200)");
  app.add_option("--rate", spec.rate,
                 "Poisson arrivals per second; 0 = send as fast as --concurrency allows");
  app.add_option("--concurrency", spec.concurrency, "max requests in flight (default 64)");
  app.add_option("--prompt-len", prompt_len, "prompt tokens MIN:MAX, uniform (default 16:64)");
  app.add_option("--output-len", output_len, "max_tokens MIN:MAX, uniform (default 32:128)");
  app.add_option("--class-mix", class_mix,
                 "SLA class weights, e.g. voice:0.7,batch:0.3 (default: server default)");
  app.add_option("--seed", spec.seed, "workload seed (default 0)");
  app.add_option("--trace", trace_in,
                 "replay this request trace (JSON lines, docs/kvm.md): each request sent at its "
                 "arrival_ms with a synthetic prompt of prompt_tokens ids, max_tokens = "
                 "output_tokens (EOS ignored) and its class; replaces --num-requests, --rate, "
                 "--prompt-len, --output-len and --class-mix");
  app.add_option("--write-trace", trace_out, "write the workload sent as a request trace");
  app.add_option("--json-out", json_out,
                 "write the result (summary + per-request samples) as JSON");
  app.add_option("--tls-ca", copt.tls_ca, "PEM CA / server cert: use TLS");
  app.add_option("--api-key", copt.api_key, "bearer API key");
  app.add_option(
      "--in-process-model", in_process_model,
      "start an engine + server in-process on this model; compare gRPC vs direct engine");
  int warmup = -1, rounds = 1, kv_capacity_mb = 0, max_num_seqs = 0, threads_per_worker = -1;
  app.add_option("--warmup", warmup,
                 "requests sent (through both paths) before measuring; default: --concurrency with "
                 "--in-process-model, else 0");
  app.add_option("--rounds", rounds,
                 "measured passes per path; the order alternates per round (default 1)")
      ->check(CLI::Range(1, 100));
  app.add_option("--kv-capacity-mb", kv_capacity_mb,
                 "in-process engine: KV MiB per worker (default: engine's)");
  app.add_option("--max-num-seqs", max_num_seqs,
                 "in-process engine: running sequences per decode worker");
  app.add_option("--threads-per-worker", threads_per_worker,
                 "in-process engine: CPU threads per worker");
  kvsplit::strict_options(app);  // decimal, in-range, finite, non-empty values
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  spdlog::set_level(spdlog::level::warn);
  if (auto st = kvsplit::server::bench::parse_spec(prompt_len, output_len, class_mix, &spec);
      !st.ok()) {
    std::cerr << "kvsplit-bench-serving: " << st.message() << "\n";
    return 2;
  }

  // Optional in-process engine + server on an ephemeral loopback port.
  std::unique_ptr<kvsplit::Engine> engine;
  std::unique_ptr<kvsplit::server::GenerationService> service;
  kvsplit::server::RunningServer local;
  std::vector<kvsplit::SlaClass> engine_classes;
  if (!in_process_model.empty()) {
    kvsplit::EngineConfig ec;
    ec.model = in_process_model;
    if (kv_capacity_mb > 0) ec.kv_capacity_bytes = static_cast<int64_t>(kv_capacity_mb) << 20;
    if (max_num_seqs > 0) ec.max_num_seqs = max_num_seqs;
    if (threads_per_worker >= 0) ec.threads_per_worker = threads_per_worker;
    auto e = kvsplit::Engine::create(ec);
    if (!e.ok()) {
      std::cerr << "kvsplit-bench-serving: " << e.status().to_string() << "\n";
      return 1;
    }
    engine = std::move(e).value();
    engine_classes = ec.sla_classes;
    kvsplit::server::ServiceOptions so;
    so.max_concurrent_streams = 100000;
    so.max_tokens_limit = 1 << 20;
    service =
        std::make_unique<kvsplit::server::GenerationService>(engine.get(), so, ec.sla_classes);
    kvsplit::config::ServerConfig sc;
    sc.host = "127.0.0.1";
    sc.port = 0;
    sc.max_concurrent_streams = 100000;
    auto r = kvsplit::server::start_grpc_server(sc, service.get());
    if (!r.ok()) {
      std::cerr << "kvsplit-bench-serving: " << r.status().message() << "\n";
      return 1;
    }
    local = std::move(r).value();
    copt.server = "127.0.0.1:" + std::to_string(local.port);
  }

  auto channel = kvsplit::server::make_channel(copt);
  if (!channel.ok()) {
    std::cerr << "kvsplit-bench-serving: " << channel.status().message() << "\n";
    return 2;
  }
  auto stub = v1::Generation::NewStub(*channel);
  v1::GetModelInfoResponse info;
  v1::GetServerStatsResponse stats;
  {
    grpc::ClientContext c1, c2;
    kvsplit::server::add_auth(copt, &c1);
    kvsplit::server::add_auth(copt, &c2);
    c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s1 = stub->GetModelInfo(&c1, {}, &info);
    grpc::Status s2 = s1.ok() ? stub->GetServerStats(&c2, {}, &stats) : s1;
    if (!s2.ok()) {
      std::cerr << "kvsplit-bench-serving: cannot reach " << copt.server << ": "
                << s2.error_message() << "\n";
      return 1;
    }
  }
  std::map<std::string, std::pair<double, double>> targets;  // class -> (max_ttft_ms, max_itl_ms)
  for (const auto& c : stats.classes()) targets[c.name()] = {c.max_ttft_ms(), c.max_itl_ms()};
  if (spec.classes.empty())
    spec.classes = {{info.sla_classes_size() ? info.sla_classes(0) : "", 1.0}};
  std::vector<Work> works;
  if (!trace_in.empty()) {
    auto trace = kvsplit::kvm::read_trace_file(trace_in);
    if (!trace.ok()) {
      std::cerr << "kvsplit-bench-serving: --trace: " << trace.status().message() << "\n";
      return 2;
    }
    std::mt19937_64 rng(spec.seed);
    const int vocab = std::max(4, info.vocab_size());
    const int context = std::max(2, info.max_context());
    for (const kvsplit::kvm::TraceRequest& t : *trace) {
      Work w;
      const int p = std::clamp(t.prompt_tokens, 1, context - 1);
      w.prompt.resize(p);
      for (int32_t& id : w.prompt) id = 3 + static_cast<int32_t>(rng() % (vocab - 3));
      w.max_tokens =
          static_cast<uint32_t>(std::clamp(t.output_tokens, 1, std::max(1, context - p)));
      w.sla_class = t.sla_class;
      w.arrival_s = t.arrival_ms / 1000.0;
      works.push_back(std::move(w));
    }
    std::stable_sort(works.begin(), works.end(),
                     [](const Work& a, const Work& b) { return a.arrival_s < b.arrival_s; });
    spec.num_requests = static_cast<int>(works.size());
  } else {
    works = kvsplit::server::bench::make_workload(spec, info.vocab_size(), info.max_context());
  }
  if (!trace_out.empty()) {
    std::vector<kvsplit::kvm::TraceRequest> t;
    for (const Work& w : works) {
      t.push_back({std::round(w.arrival_s * 1e6) / 1e3, static_cast<int>(w.prompt.size()),
                   static_cast<int>(w.max_tokens), w.sla_class});
    }
    if (auto st = kvsplit::kvm::write_trace_file(trace_out, t); !st.ok()) {
      std::cerr << "kvsplit-bench-serving: --write-trace: " << st.message() << "\n";
      return 2;
    }
  }

  auto preemptions = [&]() -> int64_t {
    grpc::ClientContext c;
    kvsplit::server::add_auth(copt, &c);
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetServerStatsResponse st;
    return stub->GetServerStats(&c, {}, &st).ok() ? st.preemptions() : -1;
  };
  auto grpc_pass = [&](const std::vector<Work>& ws, std::vector<Outcome>* outcomes) {
    return dispatch(ws, spec.concurrency, [&](size_t i, std::function<void()> done) {
      new StreamCall(stub.get(), copt, ws[i], &(*outcomes)[i], std::move(done));
    });
  };
  auto engine_pass = [&](const std::vector<Work>& ws, std::vector<Outcome>* outcomes) {
    std::vector<std::thread> threads;
    std::mutex tm;
    const double secs = dispatch(ws, spec.concurrency, [&](size_t i, std::function<void()> done) {
      std::lock_guard<std::mutex> l(tm);
      threads.emplace_back([&, i, done] {
        run_in_engine(engine.get(), ws[i], &(*outcomes)[i]);
        done();
      });
    });
    for (auto& t : threads) t.join();
    return secs;
  };
  // One measured pass: the summary plus process CPU per token and the preemptions it caused.
  auto measure = [&](bool grpc_path) {
    std::vector<Outcome> outcomes(works.size());
    const double cpu0 = process_cpu_s();
    const int64_t pre0 = preemptions();
    const double secs = grpc_path ? grpc_pass(works, &outcomes) : engine_pass(works, &outcomes);
    nlohmann::json s = kvsplit::server::bench::summarize(grpc_path ? "grpc" : "in-process", spec,
                                                         outcomes, secs, targets);
    const double cpu = process_cpu_s() - cpu0;
    s["preemptions"] = preemptions() - pre0;
    if (engine) {  // the CPU of this process covers the server only when it runs here
      s["cpu_s"] = cpu;
      const auto tokens = s["generated_tokens"].get<int64_t>();
      s["cpu_ms_per_token"] = tokens > 0 ? cpu * 1e3 / static_cast<double>(tokens) : 0.0;
    }
    return s;
  };

  if (warmup < 0) warmup = engine ? spec.concurrency : 0;
  if (warmup > 0) {  // first-touch of KV pages, thread pools, HTTP/2 connection: not measured
    kvsplit::server::bench::Spec ws = spec;
    ws.num_requests = warmup;
    ws.seed = spec.seed + 1;
    ws.rate = 0;
    const auto warm =
        kvsplit::server::bench::make_workload(ws, info.vocab_size(), info.max_context());
    std::vector<Outcome> o(warm.size());
    grpc_pass(warm, &o);
    if (engine) engine_pass(warm, &o);
  }
  std::vector<nlohmann::json> grpc_runs, engine_runs;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which path goes first (round 0: gRPC first), so drift in machine load evens out.
    const bool grpc_first = r % 2 == 0;
    for (int k = 0; k < (engine ? 2 : 1); ++k) {
      const bool grpc_path = (k == 0) == grpc_first || !engine;
      nlohmann::json s = measure(grpc_path);
      s["round"] = r;
      (grpc_path ? grpc_runs : engine_runs).push_back(std::move(s));
    }
  }
  auto print_runs = [](const std::vector<nlohmann::json>& rs) {
    for (const auto& s : rs) {
      kvsplit::server::bench::print_summary(s);
      std::printf("   preemptions %lld", static_cast<long long>(s["preemptions"].get<int64_t>()));
      if (s.contains("cpu_ms_per_token"))
        std::printf("   process CPU %.3f ms/token", s["cpu_ms_per_token"].get<double>());
      std::printf("   (round %d)\n", s["round"].get<int>());
    }
  };
  print_runs(grpc_runs);
  print_runs(engine_runs);
  nlohmann::json result = grpc_runs.front();
  if (!engine_runs.empty()) {
    // Aggregate over rounds: total tokens / total time per path; CPU per token per path.
    auto totals = [](const std::vector<nlohmann::json>& rs) {
      double tokens = 0, secs = 0, cpu = 0;
      for (const auto& s : rs) {
        tokens += s["generated_tokens"].get<double>();
        secs += s["duration_s"].get<double>();
        cpu += s["cpu_s"].get<double>();
      }
      return std::array<double, 3>{tokens / secs, cpu * 1e3 / tokens, tokens};
    };
    const auto g = totals(grpc_runs), e = totals(engine_runs);
    std::vector<double> per_round;
    for (size_t i = 0; i < grpc_runs.size(); ++i)
      per_round.push_back(grpc_runs[i]["tokens_per_s"].get<double>() /
                          engine_runs[i]["tokens_per_s"].get<double>());
    result["in_process"] = engine_runs.front();
    result["grpc_over_in_process_tokens_per_s"] = g[0] / e[0];
    result["grpc_over_in_process_per_round"] = per_round;
    result["cpu_ms_per_token"] = {{"grpc", g[1]}, {"in_process", e[1]}};
    nlohmann::json all = nlohmann::json::array();
    for (const auto* rs : {&grpc_runs, &engine_runs})
      for (nlohmann::json s : *rs) {
        s.erase("samples");
        all.push_back(std::move(s));
      }
    result["passes"] = all;
    std::printf(
        "over %d round(s): gRPC %.1f tokens/s, in-process %.1f tokens/s; process CPU %.3f vs %.3f "
        "ms/token\n",
        rounds, g[0], e[0], g[1], e[1]);
    std::string rs;
    for (double x : per_round) rs += (rs.empty() ? "" : " ") + std::to_string(x).substr(0, 5);
    // The median round resists a burst of outside load on one pass; the CPU ratio ignores it.
    const double median = kvsplit::server::bench::quantile(per_round, 0.5);
    result["grpc_over_in_process_median_round"] = median;
    std::printf("gRPC / in-process tokens/s: %.3f   median round %.3f   (per round: %s)\n",
                g[0] / e[0], median, rs.c_str());
    std::printf("in-process / gRPC process CPU per token: %.3f\n", e[1] / g[1]);
  }
  result["model"] = info.source();
  result["server"] = copt.server;
  if (!json_out.empty()) std::ofstream(json_out) << result.dump(1) << "\n";
  if (local.server) {
    engine->shutdown(std::chrono::milliseconds(0));
    local.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  int errors = 0;
  for (const auto* rs : {&grpc_runs, &engine_runs})
    for (const auto& s : *rs) errors += s["errors"].get<int>();
  return errors == 0 ? 0 : 1;
}
