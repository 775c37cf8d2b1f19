#include "server/convert.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>

#include "common/escape.h"
#include "common/utf8.h"

namespace kvsplit::server {
namespace {

// Integers print as integers in every message.
Status bad(const std::string& field, const std::string& rule, int64_t got) {
  return invalid_argument(field + ": must be " + rule + ", got " + std::to_string(got));
}

// GenerateRequest.guided -> SamplingParams::guided. The oneof's own rules are checked here (a
// json_object set to false, an empty choice list); sizes and syntax by SamplingParams::validate.
Status to_guided(const v1::GuidedDecoding& in, GuidedDecoding* out) {
  using Kind = GuidedDecoding::Kind;
  switch (in.constraint_case()) {
    case v1::GuidedDecoding::kRegex:
      out->kind = Kind::kRegex;
      out->spec = in.regex();
      break;
    case v1::GuidedDecoding::kChoice:
      if (in.choice().choices().empty())
        return invalid_argument("guided.choice: needs at least one choice");
      out->kind = Kind::kChoice;
      out->choices.assign(in.choice().choices().begin(), in.choice().choices().end());
      break;
    case v1::GuidedDecoding::kJsonSchema:
      out->kind = Kind::kJsonSchema;
      out->spec = in.json_schema();
      break;
    case v1::GuidedDecoding::kGrammar:
      out->kind = Kind::kGrammar;
      out->spec = in.grammar();
      break;
    case v1::GuidedDecoding::kJsonObject:
      if (!in.json_object()) return invalid_argument("guided.json_object: must be true when set");
      out->kind = Kind::kJsonObject;
      break;
    case v1::GuidedDecoding::CONSTRAINT_NOT_SET:
      break;
  }
  return ok_status();
}

}  // namespace

StatusOr<Request> to_engine_request(const v1::GenerateRequest& in, const RequestLimits& limits) {
  Request r;
  if (in.request_id().size() > 128) return invalid_argument("request_id: at most 128 bytes");
  for (unsigned char ch : in.request_id()) {
    if (ch < 0x21 || ch > 0x7E)
      return invalid_argument("request_id: printable ASCII without spaces only");
  }
  if (std::string_view(in.request_id()).substr(0, kServerIdPrefix.size()) == kServerIdPrefix) {
    return invalid_argument("request_id: the prefix '" + std::string(kServerIdPrefix) +
                            "' is reserved for ids the server assigns");
  }
  r.request_id = in.request_id();

  switch (in.input_case()) {
    case v1::GenerateRequest::kPrompt: {
      const std::string& p = in.prompt();
      if (p.size() > static_cast<size_t>(limits.max_prompt_bytes))
        return invalid_argument("prompt: " + std::to_string(p.size()) +
                                " bytes exceeds the limit of " +
                                std::to_string(limits.max_prompt_bytes));
      size_t at = 0;
      if (!utf8::is_valid(p, &at))
        return invalid_argument("prompt: invalid UTF-8 at byte " + std::to_string(at));
      r.prompt = p;
      break;
    }
    case v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = in.prompt_token_ids().ids();
      if (ids.empty()) return invalid_argument("prompt_token_ids: must not be empty");
      if (ids.size() > limits.max_context)
        return invalid_argument("prompt_token_ids: " + std::to_string(ids.size()) +
                                " tokens exceed the model context of " +
                                std::to_string(limits.max_context));
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size)
          return invalid_argument("prompt_token_ids[" + std::to_string(i) +
                                  "]: " + std::to_string(ids[i]) + " is not in [0, " +
                                  std::to_string(limits.vocab_size) + ")");
      }
      r.prompt_token_ids.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return invalid_argument("prompt: one of prompt or prompt_token_ids is required");
  }

  SamplingParams& s = r.sampling;
  // Unset: the server's default, raised to min_tokens (within the limit) so that a client asking
  // for a minimum is not refused for a default it did not choose.
  const uint32_t max_tokens =
      in.max_tokens()
          ? in.max_tokens()
          : std::max<uint32_t>(limits.default_max_tokens,
                               std::min<uint32_t>(in.min_tokens(),
                                                  static_cast<uint32_t>(limits.max_tokens_limit)));
  if (max_tokens > static_cast<uint32_t>(limits.max_tokens_limit))
    return invalid_argument("max_tokens: " + std::to_string(max_tokens) + " exceeds the limit of " +
                            std::to_string(limits.max_tokens_limit));
  s.max_tokens = static_cast<int32_t>(max_tokens);
  r.max_tokens_is_default = in.max_tokens() == 0;  // the engine fits it to the prompt's room

  // Fields are copied as given; SamplingParams::validate is the one set of rules (the engine
  // checks the same again). Its errors name the field; those under `sampling` get that prefix.
  const v1::SamplingParams& sp = in.sampling();
  if (sp.has_temperature()) s.temperature = sp.temperature();
  if (sp.has_top_p()) s.top_p = sp.top_p();
  if (sp.has_top_k()) s.top_k = sp.top_k();
  if (sp.has_min_p()) s.min_p = sp.min_p();
  if (sp.has_repetition_penalty()) s.repetition_penalty = sp.repetition_penalty();
  if (sp.has_presence_penalty()) s.presence_penalty = sp.presence_penalty();
  if (sp.has_frequency_penalty()) s.frequency_penalty = sp.frequency_penalty();
  if (sp.has_seed()) s.seed = sp.seed();
  s.stop.assign(in.stop().begin(), in.stop().end());
  s.stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  s.ignore_eos = in.ignore_eos();
  // Capped so that the int32 field cannot wrap; validate() bounds it by max_tokens.
  s.min_tokens = static_cast<int32_t>(std::min<uint32_t>(in.min_tokens(), INT32_MAX));
  // Sorted by id: a protobuf map's order is unspecified, and the engine's copy should not vary.
  s.logit_bias.assign(sp.logit_bias().begin(), sp.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  KVSPLIT_RETURN_IF_ERROR(to_guided(in.guided(), &s.guided));
  if (Status st = s.validate(limits.vocab_size); !st.ok()) {
    // GenerateRequest's own fields; validate names guided's by the proto's ("guided.regex").
    static constexpr std::string_view kTopLevel[] = {
        "max_tokens:", "min_tokens:", "stop:", "stop_token_ids:", "ignore_eos:", "guided"};
    for (std::string_view field : kTopLevel) {
      if (st.message().rfind(field, 0) == 0) return st;
    }
    return Status(st.code(), "sampling." + st.message());
  }

  if (!in.sla_class().empty()) {
    bool known = false;
    for (const auto& n : limits.class_names) known = known || n == in.sla_class();
    if (!known) {
      std::string names;
      for (const auto& n : limits.class_names) names += (names.empty() ? "" : ", ") + n;
      return invalid_argument("sla_class: unknown class '" + escape_for_message(in.sla_class()) +
                              "' (known: " + names + ")");
    }
  }
  // Empty means the default class: name it, so that metrics and logs carry the real name.
  r.sla_class = in.sla_class().empty() && !limits.class_names.empty() ? limits.class_names.front()
                                                                      : in.sla_class();
  if (in.priority() < -kMaxRequestPriority || in.priority() > kMaxRequestPriority)
    return bad("priority", "in [-1000, 1000]", in.priority());
  r.priority = in.priority();
  if (in.n() > static_cast<uint32_t>(kMaxCompletions))
    return bad("n", "in [0, 128] (0: 1)", in.n());
  r.n = std::max<int32_t>(1, static_cast<int32_t>(in.n()));
  if (in.top_logprobs() > 20) return bad("top_logprobs", "in [0, 20]", in.top_logprobs());
  if (in.has_prompt_logprobs()) {
    if (in.prompt_logprobs() > 20)
      return bad("prompt_logprobs", "in [0, 20]", in.prompt_logprobs());
    r.prompt_logprobs = static_cast<int32_t>(in.prompt_logprobs());
  }
  r.top_logprobs = in.top_logprobs();
  if (in.cache_salt().size() > 256)
    return bad("cache_salt", "at most 256 bytes", in.cache_salt().size());
  r.cache_salt = in.cache_salt();
  return r;
}

void to_proto(const TokenLogprob& lp, v1::TokenLogprob* p) {
  p->set_token_id(lp.token_id);
  p->set_logprob(lp.logprob);
  for (const auto& [id, logprob] : lp.top) {
    v1::TopLogprob* t = p->add_top();
    t->set_token_id(id);
    t->set_logprob(logprob);
  }
}

void append_tokens(const TokenEvent& event, bool want_logprobs, v1::GenerateResponse* out) {
  for (int32_t id : event.token_ids) out->add_token_ids(id);
  if (!want_logprobs) return;
  for (const TokenLogprob& lp : event.logprobs) to_proto(lp, out->add_logprobs());
}

v1::FinishReason to_proto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void set_final_fields(const TokenEvent& event, v1::GenerateResponse* out) {
  out->set_finish_reason(to_proto(event.finish_reason));
  v1::Usage* u = out->mutable_usage();
  u->set_prompt_tokens(static_cast<uint32_t>(std::max(0, event.usage.prompt_tokens)));
  u->set_completion_tokens(static_cast<uint32_t>(std::max(0, event.usage.completion_tokens)));
  u->set_cached_tokens(static_cast<uint32_t>(std::max(0, event.usage.cached_tokens)));
  u->set_effective_kv_byte_seconds(event.usage.effective_kv_byte_seconds);
  u->set_kv_token_seconds(event.usage.kv_token_seconds);
  const Timings& t = event.timings;
  v1::Timings* p = out->mutable_timings();
  p->set_queue_ms(t.queue_ms);
  p->set_ttft_ms(t.ttft_ms);
  p->set_mean_itl_ms(t.mean_itl_ms);
  p->set_max_itl_ms(t.max_itl_ms);
  p->set_e2e_ms(t.e2e_ms);
  p->set_prefill_ms(t.prefill_ms);
  p->set_handoff_ms(t.handoff_ms);
  p->set_decode_ms(t.decode_ms);
  p->set_preempted_ms(t.preempted_ms);
  p->set_preemptions(static_cast<uint32_t>(std::max(0, t.preemptions)));
}

grpc::Status to_grpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string msg = status.message();
  if (!utf8::is_valid(msg)) msg = "(message not UTF-8)";
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), msg);
}

void fill_model_info(const ModelInfo& info, const RequestLimits& limits,
                     v1::GetModelInfoResponse* out) {
  // A path is bytes; the proto field is a string, and invalid UTF-8 there fails the whole reply.
  std::string source;
  utf8::append_valid(info.source, /*final=*/true, source);
  out->set_source(source);
  out->set_architecture(info.architecture);
  out->set_vocab_size(info.vocab_size);
  out->set_max_context(info.max_context);
  out->set_num_layers(info.num_layers);
  out->set_dim(info.dim);
  out->set_max_tokens_limit(static_cast<uint32_t>(limits.max_tokens_limit));
  out->set_default_max_tokens(static_cast<uint32_t>(limits.default_max_tokens));
  for (const auto& n : limits.class_names) out->add_sla_classes(n);
}

void fill_server_stats(const EngineStats& stats, const std::vector<SlaClass>& classes,
                       int32_t active_streams, v1::GetServerStatsResponse* out) {
  for (const PoolStats& p : stats.pools) {
    v1::PoolStats* o = out->add_pools();
    o->set_name(p.name);
    o->set_kv_blocks_total(p.kv_blocks_total);
    o->set_kv_blocks_free(p.kv_blocks_free);
    o->set_running(p.running);
    o->set_waiting(p.waiting);
    o->set_kv_pages_full(p.kv_pages_full);
    o->set_kv_pages_int8(p.kv_pages_int8);
    o->set_kv_pages_int4(p.kv_pages_int4);
    o->set_kv_pages_evicted(p.kv_pages_evicted);
    o->set_kv_demotions(p.kv_demotions);
    o->set_kv_evictions(p.kv_evictions);
    o->set_kv_recalls(p.kv_recalls);
    o->set_kv_refused_transitions(p.kv_refused_transitions);
    o->set_kv_recall_ms_mean(p.kv_recall_ms_mean);
    o->set_kv_recalls_late(p.kv_recalls_late);
    o->set_kv_host_bytes_used(p.kv_host_bytes_used);
    o->set_kv_host_bytes_total(p.kv_host_bytes_total);
    o->set_kv_pages_host(p.kv_pages_host);
    o->set_kv_swaps_out(p.kv_swaps_out);
    o->set_kv_swaps_in(p.kv_swaps_in);
    o->set_kv_swap_bytes(p.kv_swap_bytes);
    o->set_kv_swap_choices(p.kv_swap_choices);
    o->set_kv_recompute_choices(p.kv_recompute_choices);
    o->set_kv_swap_fallbacks(p.kv_swap_fallbacks);
    o->set_kv_swaps_to_disk(p.kv_swaps_to_disk);
    o->set_kv_disk_faults(p.kv_disk_faults);
    o->set_kv_prefix_cache_pages(p.kv_prefix_cache_pages);
    o->set_kv_prefix_queries(p.kv_prefix_queries);
    o->set_kv_prefix_hits(p.kv_prefix_hits);
    o->set_kv_prefix_hits_host(p.kv_prefix_hits_host);
    o->set_kv_prefix_hits_disk(p.kv_prefix_hits_disk);
    o->set_kv_prefix_spills_host(p.kv_prefix_spills_host);
    o->set_kv_prefix_spills_disk(p.kv_prefix_spills_disk);
    o->set_kv_prefix_spill_faults(p.kv_prefix_spill_faults);
    o->set_kv_prefix_pages_host(p.kv_prefix_pages_host);
    o->set_kv_prefix_pages_disk(p.kv_prefix_pages_disk);
    o->set_kv_shards(p.kv_shards);
    o->set_kv_pages_remote(p.kv_pages_remote);
    o->set_kv_shard_exchange_bytes(p.kv_shard_exchange_bytes);
    o->set_kv_shard_exchange_host_bytes(p.kv_shard_exchange_host_bytes);
    o->set_kv_shard_communicator(p.kv_shard_communicator);
    o->set_kv_shard_exchange_seconds(p.kv_shard_exchange_seconds);
    o->set_decode_rows_stalled(p.decode_rows_stalled);
    o->set_spec_rows(p.spec_rows);
    o->set_spec_draft_tokens(p.spec_draft_tokens);
    o->set_spec_accepted_tokens(p.spec_accepted_tokens);
    o->set_handoffs_rerouted(p.handoffs_rerouted);
    o->set_handoff_pages_copied(p.handoff_pages_copied);
    o->set_handoff_pages_cached(p.handoff_pages_cached);
    o->set_handoffs_to_cached(p.handoffs_to_cached);
    o->set_handoffs_forwarded(p.handoffs_forwarded);
    o->set_marked_down(p.marked_down);
    o->set_kv_migrated_pages(p.kv_migrated_pages);
    o->set_kv_prefetch_hits(p.kv_prefetch_hits);
    o->set_kv_prefetch_misses(p.kv_prefetch_misses);
    o->set_kv_host_prefetches(p.kv_host_prefetches);
    o->set_kv_host_prefetch_hits(p.kv_host_prefetch_hits);
    o->set_kv_host_prefetch_misses(p.kv_host_prefetch_misses);
    o->set_kv_host_prefetch_dropped(p.kv_host_prefetch_dropped);
    o->set_kv_host_prefetch_deferred(p.kv_host_prefetch_deferred);
    o->set_kv_disk_write_behind(p.kv_disk_write_behind);
    o->set_kv_disk_write_behind_waits(p.kv_disk_write_behind_waits);
    o->set_kv_disk_write_behind_rescues(p.kv_disk_write_behind_rescues);
    o->set_kv_window_dropped_pages(p.kv_window_dropped_pages);
    o->set_kv_recalls_quantized(p.kv_recalls_quantized);
    o->set_kv_recalls_cold(p.kv_recalls_cold);
    o->set_kv_disk_bytes_used(p.kv_disk_bytes_used);
    o->set_kv_disk_bytes_total(p.kv_disk_bytes_total);
    o->set_kv_disk_latency_ms(p.kv_disk_latency_ms);
    for (double u : p.kv_shard_use) o->add_kv_shard_use(u);
  }
  for (const SlaClassStats& c : stats.classes) {
    v1::SlaClassStats* o = out->add_classes();
    o->set_name(c.name);
    for (const SlaClass& def : classes) {
      if (def.name != c.name) continue;
      o->set_max_ttft_ms(def.max_ttft_ms);
      o->set_max_itl_ms(def.max_itl_ms);
      o->set_priority(def.priority);
    }
    o->set_finished(c.finished);
    o->set_met_ttft(c.met_ttft);
    o->set_met_itl(c.met_itl);
    o->set_met_both(c.met_both);
    o->set_queued(c.queued);
    o->set_failed(c.failed);
    o->set_oldest_queued_ms(c.oldest_queued_ms);
  }
  out->set_requests_submitted(stats.requests_submitted);
  out->set_requests_finished(stats.requests_finished);
  out->set_requests_cancelled(stats.requests_cancelled);
  out->set_requests_failed(stats.requests_failed);
  out->set_preemptions(stats.preemptions);
  out->set_prompt_tokens(stats.prompt_tokens);
  out->set_generated_tokens(stats.generated_tokens);
  out->set_num_running(stats.num_running);
  out->set_num_waiting(stats.num_waiting);
  out->set_active_streams(active_streams);
  fill_kvm_stats(stats, out);
}

void fill_kvm_stats(const EngineStats& stats, v1::GetServerStatsResponse* out) {
  out->set_kvm_enabled(stats.kvm_enabled);
  if (!stats.kvm_enabled) return;
  const KvmSnapshot& k = stats.kvm;
  v1::KvmSnapshot* o = out->mutable_kvm();
  o->set_time_ms(k.time_ms);
  for (const KvmWorkerUse& w : k.workers) {
    v1::KvmWorkerUse* ow = o->add_workers();
    ow->set_name(w.name);
    ow->set_device_kv_use(w.device_kv_use);
    ow->set_host_kv_use(w.host_kv_use);
    ow->set_disk_kv_use(w.disk_kv_use);
    for (double u : w.shard_use) ow->add_shard_use(u);
  }
  o->set_device_kv_use(k.device_kv_use);
  o->set_host_kv_use(k.host_kv_use);
  o->set_disk_kv_use(k.disk_kv_use);
  o->set_link_use(k.link_use);
  o->set_peer_exchange_mb_s(k.peer_exchange_mb_s);
  o->set_storage_latency_ms(k.storage_latency_ms);
  o->set_prefix_hit_rate(k.prefix_hit_rate);
  o->set_swap_rate(k.swap_rate);
  o->set_recall_rate(k.recall_rate);
  o->set_pages_evicted_fraction(k.pages_evicted_fraction);
  o->set_pages_full(k.pages_full);
  o->set_pages_int8(k.pages_int8);
  o->set_pages_int4(k.pages_int4);
  o->set_pages_evicted(k.pages_evicted);
  for (const KvmClassLatency& c : k.classes) {
    v1::KvmClassLatency* oc = o->add_classes();
    oc->set_name(c.name);
    oc->set_queue_depth(c.queue_depth);
    oc->set_samples(c.samples);
    oc->set_ttft_p50_ms(c.ttft_p50_ms);
    oc->set_ttft_p99_ms(c.ttft_p99_ms);
    oc->set_itl_p50_ms(c.itl_p50_ms);
    oc->set_itl_p99_ms(c.itl_p99_ms);
    oc->set_queue_wait_ms(c.queue_wait_ms);
  }
  for (const KvmDecision& d : stats.kvm_decisions) {
    v1::KvmDecision* od = out->add_kvm_decisions();
    od->set_time_ms(d.time_ms);
    od->set_rule(d.rule);
    od->set_action(d.action);
    od->set_param(d.param);
    od->set_sla_class(d.sla_class);
    od->set_before(d.before);
    od->set_after(d.after);
    od->set_monitors(d.monitors);
    od->set_applied(d.applied);
    od->set_error(d.error);
  }
  out->set_kvm_decisions_total(stats.kvm_decisions_total);
  for (const EngineStats::KvmParam& p : stats.kvm_params) {
    v1::KvmParam* op = out->add_kvm_params();
    op->set_param(p.param);
    op->set_sla_class(p.sla_class);
    op->set_value(p.value);
  }
}

}  // namespace kvsplit::server
