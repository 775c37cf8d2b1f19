// kvsplit-client: streams one generation to the terminal. See docs/server.md.
//
//   kvsplit-client --server 127.0.0.1:50051 "Once upon a time" --max-tokens 64 --temperature 0
//   kvsplit-client --server ADDR "prompt" --json        (one JSON object at the end)
//   kvsplit-client --server ADDR --info | --stats       (GetModelInfo / GetServerStats as JSON)
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/cli_options.h"
#include "common/guided_flags.h"
#include "kvsplit/sampling_params.h"
#include "kvsplit/v1/generation.grpc.pb.h"
#include "server/client_channel.h"

namespace v1 = kvsplit::v1;

namespace {

std::string to_json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

// One TokenLogprob as JSON; its alternatives (most likely first) when it has any.
nlohmann::json logprob_json(const v1::TokenLogprob& lp) {
  nlohmann::json one = {{"token_id", lp.token_id()}, {"logprob", lp.logprob()}};
  if (lp.top_size() > 0) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& t : lp.top())
      top.push_back({{"token_id", t.token_id()}, {"logprob", t.logprob()}});
    one["top"] = std::move(top);
  }
  return one;
}

int fail(const grpc::Status& st) {
  std::cerr << "kvsplit-client: "
            << kvsplit::status_code_name(static_cast<kvsplit::StatusCode>(st.error_code())) << ": "
            << st.error_message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  kvsplit::server::ClientOptions copt;
  std::string prompt, sla_class, request_id;
  std::vector<std::string> stop, logit_bias;
  uint32_t max_tokens = 0, top_logprobs = 0, min_tokens = 0, n = 1;
  std::optional<float> temperature, top_p, min_p, rep;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<uint32_t> prompt_logprobs;
  int32_t priority = 0;
  double timeout_s = 600;
  bool json = false, info = false, stats = false, ignore_eos = false;

  CLI::App app{"kvsplit-client: stream a generation from kvsplit-server"};
  app.add_option("prompt", prompt, "prompt text");
  app.add_option("--server", copt.server, "host:port (default 127.0.0.1:50051)");
  app.add_option("--max-tokens", max_tokens, "tokens to generate (0: server default)");
  app.add_option("--temperature", temperature, "0 = greedy (server default 1.0)");
  app.add_option("--top-p", top_p, "nucleus sampling, (0, 1]");
  app.add_option("--top-k", top_k, "keep the k most likely tokens (0 = off)");
  app.add_option("--min-p", min_p, "[0, 1]");
  app.add_option("--repetition-penalty", rep, "[0.01, 10], 1 = off");
  app.add_option("--seed", seed, "sampling seed");
  // One value per --stop: a vector option would otherwise take the prompt after it as a second
  // stop string and send an empty prompt.
  app.add_option("--stop", stop, "stop string (repeatable: --stop a --stop b)")
      ->allow_extra_args(false);
  app.add_flag("--ignore-eos", ignore_eos, "do not stop on EOS");
  app.add_option("--min-tokens", min_tokens,
                 "tokens before EOS, a stop token or a stop string may end generation");
  app.add_option("--logit-bias", logit_bias,
                 "ID=BIAS: add BIAS in [-100, 100] to token ID's logit (repeatable)")
      ->allow_extra_args(false)
      ->check(kvsplit::kLogitBiasEntry);
  // Guided decoding (GenerateRequest.guided; docs/sampling.md "Guided decoding"): at most one of
  // the four, as `kvsplit generate` takes them.
  kvsplit::GuidedFlags guided_flags;
  kvsplit::add_guided_options(&app, guided_flags);
  app.add_option("--n", n,
                 "completions of the prompt, [1, 128] (text: each printed when it ends, as "
                 "[i] text; --json: a choices array)")
      ->check(CLI::Range(1, 128));
  app.add_option("--sla-class", sla_class, "SLA class name (default: the server's first)");
  app.add_option("--priority", priority,
                 "[-1000, 1000]; orders requests within classes of equal priority");
  app.add_option("--top-logprobs", top_logprobs, "[0, 20] alternatives per token (with --json)");
  app.add_option("--prompt-logprobs", prompt_logprobs,
                 "[0, 20]: each prompt token's logprob and this many alternatives (with --json)")
      ->check(CLI::Range(0, 20));
  app.add_option("--request-id", request_id, "client-chosen request id");
  app.add_option("--timeout", timeout_s, "call deadline in seconds (default 600; at most 1e6)")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--tls-ca", copt.tls_ca, "PEM CA / server cert: use TLS");
  app.add_option("--tls-server-name", copt.tls_server_name, "name to verify in the server cert");
  app.add_option("--api-key", copt.api_key,
                 "bearer API key (default: $KVSPLIT_API_KEY; a flag shows in `ps`, the variable "
                 "does not)");
  app.add_flag("--json", json, "print one JSON object with ids, text, usage and timings");
  app.add_flag("--info", info, "print GetModelInfo as JSON and exit");
  app.add_flag("--stats", stats, "print GetServerStats as JSON and exit");
  kvsplit::strict_options(app);
  if (const auto rc = kvsplit::parse_args(app, argc, argv)) return *rc;
  if (const char* key = std::getenv("KVSPLIT_API_KEY"); copt.api_key.empty() && key != nullptr)
    copt.api_key = key;

  // Flags that would be silently dropped are errors: a server name to verify without TLS (the
  // call would go in plaintext), --info with --stats (one answer), generation flags with either,
  // --top-logprobs without --json (nowhere to print them), no prompt (a BOS-only prompt is asked
  // for with "").
  auto usage_error = [](const std::string& what) {
    std::cerr << "kvsplit-client: " << what << "\n";
    return 2;
  };
  if (!copt.tls_server_name.empty() && copt.tls_ca.empty())
    return usage_error("--tls-server-name needs --tls-ca (without it the call is not TLS)");
  if (info && stats) return usage_error("--info and --stats: give one");
  if ((info || stats) && app.count("prompt") > 0)
    return usage_error("--info / --stats take no prompt");
  if (info || stats) {
    for (const char* flag :
         {"--max-tokens",    "--temperature",        "--top-p",        "--top-k",
          "--min-p",         "--repetition-penalty", "--seed",         "--stop",
          "--ignore-eos",    "--min-tokens",         "--logit-bias",   "--guided-regex",
          "--guided-choice", "--guided-json",        "--json-object",  "--n",
          "--sla-class",     "--priority",           "--top-logprobs", "--prompt-logprobs",
          "--request-id"}) {
      if (app.count(flag) > 0)
        return usage_error(std::string(flag) + " is for a generation, not --info / --stats");
    }
  }
  if (top_logprobs > 0 && !json)
    return usage_error("--top-logprobs needs --json (the text output has no place for them)");
  if (prompt_logprobs && !json)
    return usage_error("--prompt-logprobs needs --json (the text output has no place for them)");
  if (!info && !stats && app.count("prompt") == 0)
    return usage_error("a prompt is required (\"\" for the BOS-only prompt)");

  auto channel = kvsplit::server::make_channel(copt);
  if (!channel.ok()) {
    std::cerr << "kvsplit-client: " << channel.status().message() << "\n";
    return 2;
  }
  auto stub = v1::Generation::NewStub(*channel);
  auto make_ctx = [&](grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    kvsplit::server::add_auth(copt, ctx);
  };
  if (info || stats) {
    grpc::ClientContext ctx;
    make_ctx(&ctx);
    grpc::Status st;
    if (info) {
      v1::GetModelInfoResponse r;
      st = stub->GetModelInfo(&ctx, {}, &r);
      if (st.ok()) std::cout << to_json(r);
    } else {
      v1::GetServerStatsResponse r;
      st = stub->GetServerStats(&ctx, {}, &r);
      if (st.ok()) std::cout << to_json(r);
    }
    return st.ok() ? 0 : fail(st);
  }

  v1::GenerateRequest req;
  req.set_request_id(request_id);
  req.set_prompt(prompt);
  req.set_max_tokens(max_tokens);
  if (temperature) req.mutable_sampling()->set_temperature(*temperature);
  if (top_p) req.mutable_sampling()->set_top_p(*top_p);
  if (top_k) req.mutable_sampling()->set_top_k(*top_k);
  if (min_p) req.mutable_sampling()->set_min_p(*min_p);
  if (rep) req.mutable_sampling()->set_repetition_penalty(*rep);
  if (seed) req.mutable_sampling()->set_seed(*seed);
  for (const auto& s : stop) req.add_stop(s);
  req.set_ignore_eos(ignore_eos);
  req.set_min_tokens(min_tokens);
  for (const auto& entry : logit_bias) {
    const auto [id, bias] = *kvsplit::parse_logit_bias_entry(entry);  // the flag checked the form
    if (!req.mutable_sampling()->mutable_logit_bias()->insert({id, bias}).second)
      return usage_error("--logit-bias: token id " + std::to_string(id) + " is given twice");
  }
  auto guided = kvsplit::guided_from_flags(app, guided_flags);
  if (!guided.ok()) return usage_error(guided.status().message());
  using GuidedKind = kvsplit::GuidedDecoding::Kind;
  switch (guided->kind) {
    case GuidedKind::kNone:
      break;
    case GuidedKind::kRegex:
      req.mutable_guided()->set_regex(guided->spec);
      break;
    case GuidedKind::kChoice:
      for (const auto& c : guided->choices) req.mutable_guided()->mutable_choice()->add_choices(c);
      break;
    case GuidedKind::kJsonSchema:
      req.mutable_guided()->set_json_schema(guided->spec);
      break;
    case GuidedKind::kJsonObject:
      req.mutable_guided()->set_json_object(true);
      break;
    case GuidedKind::kGrammar:
      req.mutable_guided()->set_grammar(guided->spec);
      break;
  }
  req.set_sla_class(sla_class);
  req.set_priority(priority);
  req.set_top_logprobs(top_logprobs);
  req.set_n(n);
  if (prompt_logprobs) req.set_prompt_logprobs(*prompt_logprobs);

  grpc::ClientContext ctx;
  make_ctx(&ctx);
  auto reader = stub->Generate(&ctx, req);
  // Per completion (GenerateResponse.index): its ids, logprobs, text and last message.
  struct Completion {
    nlohmann::json ids = nlohmann::json::array(), logprobs = nlohmann::json::array();
    std::string text;
    v1::GenerateResponse last;
  };
  std::vector<Completion> done(n);
  v1::GenerateResponse msg;
  std::string request_id_seen;
  nlohmann::json prompt_lps = nlohmann::json::array();
  while (reader->Read(&msg)) {
    if (msg.index() >= n) {
      ctx.TryCancel();
      return usage_error("the server sent completion " + std::to_string(msg.index()) +
                         " of a request for " + std::to_string(n));
    }
    Completion& c = done[msg.index()];
    for (int32_t id : msg.token_ids()) c.ids.push_back(id);
    for (const auto& lp : msg.logprobs()) c.logprobs.push_back(logprob_json(lp));
    for (const auto& lp : msg.prompt_logprobs()) prompt_lps.push_back(logprob_json(lp));
    c.text += msg.text();
    if (!json && n == 1) {
      std::fwrite(msg.text().data(), 1, msg.text().size(), stdout);
      std::fflush(stdout);
    }
    // Text of several completions: each printed whole when it ends.
    if (!json && n > 1 && msg.finish_reason() != v1::FINISH_REASON_UNSPECIFIED)
      std::cout << "[" << msg.index() << "] " << c.text << "\n" << std::flush;
    request_id_seen = msg.request_id();
    c.last = msg;
  }
  grpc::Status st = reader->Finish();
  if (!json && n == 1 && !done[0].text.empty()) std::fputc('\n', stdout);
  if (!st.ok()) return fail(st);
  if (json) {
    auto choice = [&](const Completion& c) {
      const auto& u = c.last.usage();
      const auto& t = c.last.timings();
      nlohmann::json out = {{"token_ids", c.ids},
                            {"text", c.text},
                            {"finish_reason", v1::FinishReason_Name(c.last.finish_reason())},
                            {"usage",
                             {{"prompt_tokens", u.prompt_tokens()},
                              {"completion_tokens", u.completion_tokens()},
                              {"cached_tokens", u.cached_tokens()},
                              {"effective_kv_byte_seconds", u.effective_kv_byte_seconds()},
                              {"kv_token_seconds", u.kv_token_seconds()}}},
                            {"timings",
                             {{"queue_ms", t.queue_ms()},
                              {"ttft_ms", t.ttft_ms()},
                              {"mean_itl_ms", t.mean_itl_ms()},
                              {"max_itl_ms", t.max_itl_ms()},
                              {"e2e_ms", t.e2e_ms()}}}};
      if (top_logprobs > 0) out["logprobs"] = c.logprobs;
      return out;
    };
    nlohmann::json out;
    if (n == 1) {  // one completion: its fields at the top level
      out = choice(done[0]);
      out["request_id"] = request_id_seen;
    } else {
      nlohmann::json choices = nlohmann::json::array();
      for (uint32_t i = 0; i < n; ++i) {
        choices.push_back(choice(done[i]));
        choices.back()["index"] = i;
      }
      out = {{"request_id", request_id_seen}, {"choices", std::move(choices)}};
    }
    if (prompt_logprobs) out["prompt_logprobs"] = prompt_lps;  // prompt tokens 1, 2, ...
    std::cout << out.dump() << "\n";
  }
  return 0;
}
