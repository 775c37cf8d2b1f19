#include "cli/policy.h"

#include <cstdio>
#include <iostream>

#include "cli/exit_codes.h"
#include "config/config.h"
#include "kvm/profile.h"
#include "kvm/simulator.h"

namespace kvsplit::cli {

namespace {

int policy_fail(const Status& st) {
  std::fprintf(stderr, "kvsplit policy: %s\n", st.to_string().c_str());
  return exit_code_for(st.code());
}

int run_simulate(const PolicyFlags& f) {
  auto cfg = config::load_config_file(f.config);
  if (!cfg.ok()) return policy_fail(cfg.status().with_prefix("--config"));
  auto trace = kvm::read_trace_file(f.trace);
  if (!trace.ok()) return policy_fail(trace.status().with_prefix("--trace"));
  kvm::EngineProfile profile = kvm::default_profile();
  if (!f.profile.empty()) {
    auto p = kvm::read_profile_file(f.profile);
    if (!p.ok()) return policy_fail(p.status().with_prefix("--profile"));
    profile = *p;
  } else {
    std::fprintf(stderr,
                 "kvsplit policy: no --profile, using the built-in profile (%s on %s, %d "
                 "thread); write one for this machine with bench_engine --write-profile FILE\n",
                 profile.model.c_str(), profile.backend.c_str(), profile.threads);
  }
  auto res = kvm::simulate(cfg->engine, profile, *trace);
  if (!res.ok()) return policy_fail(res.status());
  if (!f.write_requests.empty()) {
    if (Status st = kvm::write_outcomes_file(f.write_requests, res->requests); !st.ok())
      return policy_fail(st.with_prefix("--write-requests"));
  }
  for (const std::string& w : res->unmodelled)
    std::fprintf(stderr, "kvsplit policy: warning: %s\n", w.c_str());
  if (f.json) {
    std::cout << kvm::sim_result_json(*res) << "\n";
    Status st = flush_stdout();
    return st.ok() ? 0 : policy_fail(st);
  }
  const EngineConfig& e = cfg->engine;
  std::printf(
      "simulated %zu requests, %s, %d worker(s), kvm %s: last finish at %.1f ms, %lld "
      "steps, %lld preemptions (%lld swapped out, %lld recomputed), device KV use peak "
      "%.2f mean %.2f\n",
      trace->size(), e.mode == ServingMode::kColocated ? "colocated" : "disaggregated",
      e.mode == ServingMode::kColocated ? e.num_decode_workers
                                        : e.num_prefill_workers + e.num_decode_workers,
      !e.kvm.enabled                    ? "off"
      : e.kvm.mode == KvmMode::kEnforce ? "enforce"
                                        : "dry-run",
      res->end_ms, static_cast<long long>(res->steps), static_cast<long long>(res->preemptions),
      static_cast<long long>(res->swaps_out), static_cast<long long>(res->recomputes),
      res->peak_device_kv_use, res->mean_device_kv_use);
  std::printf("KV per decode worker: %lld full blocks",
              static_cast<long long>(res->kv_blocks_per_worker));
  if (res->int8_pages_per_worker > 0 || res->int4_pages_per_worker > 0)
    std::printf(", %lld int8 and %lld int4 arena pages",
                static_cast<long long>(res->int8_pages_per_worker),
                static_cast<long long>(res->int4_pages_per_worker));
  std::printf("; mean step %.3f ms (step_overhead_ms %.4f), at most %lld decoding at once\n",
              res->mean_step_ms, profile.step_overhead_ms,
              static_cast<long long>(res->peak_running));
  if (res->over_context > 0)
    std::printf(
        "warning: %lld request(s) need more than the model context (prompt + output - 1 > "
        "max_context %d): a server refuses them (INVALID_ARGUMENT); simulated here fitted to the "
        "context, as bench_serving_offline --trace fits them\n",
        static_cast<long long>(res->over_context), profile.max_context);
  if (res->thrashed > 0)
    std::printf(
        "warning: %lld request(s) preempted more than 20 times in a row without a token (thrashing "
        "in a full pool), "
        "counted as rejected\n",
        static_cast<long long>(res->thrashed));
  std::printf("\ndecisions (%zu):\n", res->decisions.size());
  for (const KvmDecision& d : res->decisions) {
    std::printf("  %10.1f ms  %-20s %-9s %s%s%s: %g -> %g  (%s)%s\n", d.time_ms, d.rule.c_str(),
                d.action.c_str(), d.param.c_str(), d.sla_class.empty() ? "" : "[",
                d.sla_class.empty() ? "" : (d.sla_class + "]").c_str(), d.before, d.after,
                d.monitors.c_str(), d.applied ? "" : "  [not applied]");
  }
  std::printf("\n%-16s %8s %8s %10s %10s %10s %10s %11s\n", "class", "requests", "rejected",
              "ttft p50", "ttft p99", "itl p50", "itl p99", "attainment");
  for (const kvm::SimClassResult& c : res->classes) {
    std::printf("%-16s %8lld %8lld %10.1f %10.1f %10.2f %10.2f %10.1f%%\n", c.name.c_str(),
                static_cast<long long>(c.requests), static_cast<long long>(c.rejected),
                c.ttft_p50_ms, c.ttft_p99_ms, c.itl_p50_ms, c.itl_p99_ms, 100.0 * c.attainment);
  }
  std::printf(
      "(ms; ITL is each request's mean inter-token latency; attainment: requests with "
      "TTFT and ITL within the class targets)\n");
  Status st = flush_stdout();
  return st.ok() ? 0 : policy_fail(st);
}

int run_make_trace(const PolicyFlags& f) {
  if (!f.phased)
    return policy_fail(
        invalid_argument("make-trace: --phased is required (the only "
                         "generator so far)"));
  if (Status st = kvm::validate(f.phase); !st.ok()) return policy_fail(st);
  const std::vector<kvm::TraceRequest> t = kvm::make_phased_trace(f.phase);
  if (Status st = kvm::write_trace_file(f.out, t); !st.ok())
    return policy_fail(st.with_prefix("--out"));
  std::fprintf(stderr, "kvsplit policy: wrote %zu requests to %s\n", t.size(), f.out.c_str());
  return 0;
}

}  // namespace

CLI::App* add_policy_command(CLI::App& app, PolicyFlags& f) {
  CLI::App* policy = app.add_subcommand("policy", "KV cache manager policies: simulate, traces");
  policy->require_subcommand(1);
  CLI::App* sim = policy->add_subcommand(
      "simulate",
      "replay a request trace against a config's engine settings, SLA classes and kvm "
      "rules in a discrete-event model of the engine (no model weights)");
  sim->add_option("--config", f.config, "server YAML config")->required();
  sim->add_option("--trace", f.trace, "request trace, JSON lines")->required();
  sim->add_option("--profile", f.profile,
                  "engine cost profile (bench_engine --write-profile); default: built in");
  sim->add_flag("--json", f.json, "print one JSON line: classes and decisions");
  sim->add_option("--write-requests", f.write_requests,
                  "write each request's predicted TTFT, mean ITL and preemptions (JSON lines, "
                  "as bench_serving_offline --write-requests measures them)");

  CLI::App* mk = policy->add_subcommand("make-trace", "write a synthetic request trace");
  kvm::PhasedTraceOptions& p = f.phase;
  mk->add_flag("--phased", f.phased, "calm, a memory spike of long prompts, calm; two classes");
  mk->add_option("--out", f.out, "trace file to write")->required();
  mk->add_option("--seed", p.seed, "generator seed")->capture_default_str();
  mk->add_option("--calm-ms", p.calm_ms, "each calm phase (ms)")->capture_default_str();
  mk->add_option("--spike-ms", p.spike_ms, "the spike phase (ms)")->capture_default_str();
  mk->add_option("--interactive-class", p.interactive_class, "class of the short requests")
      ->capture_default_str();
  mk->add_option("--interactive-rate", p.interactive_rate, "its requests per second")
      ->capture_default_str();
  mk->add_option("--interactive-prompt", p.interactive_prompt, "its median prompt tokens")
      ->capture_default_str();
  mk->add_option("--interactive-output", p.interactive_output, "its median output tokens")
      ->capture_default_str();
  mk->add_option("--batch-class", p.batch_class, "class of the long requests")
      ->capture_default_str();
  mk->add_option("--batch-rate-calm", p.batch_rate_calm, "its requests per second when calm")
      ->capture_default_str();
  mk->add_option("--batch-rate-spike", p.batch_rate_spike, "its requests per second in the spike")
      ->capture_default_str();
  mk->add_option("--batch-prompt", p.batch_prompt, "its median prompt tokens when calm")
      ->capture_default_str();
  mk->add_option("--batch-output", p.batch_output, "its median output tokens when calm")
      ->capture_default_str();
  mk->add_option("--spike-prompt", p.spike_prompt, "its median prompt tokens in the spike")
      ->capture_default_str();
  mk->add_option("--spike-output", p.spike_output, "its median output tokens in the spike")
      ->capture_default_str();
  mk->add_option("--rate-scale", p.rate_scale,
                 "multiplies every rate: the same phases at a load scaled to the machine")
      ->capture_default_str();
  return policy;
}

int run_policy(CLI::App* policy, const PolicyFlags& f) {
  if (policy->get_subcommand("simulate")->parsed()) return run_simulate(f);
  if (policy->get_subcommand("make-trace")->parsed()) return run_make_trace(f);
  return kExitBadInput;
}

}  // namespace kvsplit::cli
