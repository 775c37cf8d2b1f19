// Worker: the command inbox (worker_command.h).
#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "cuts/semantic/semantic.h"
#include "kv/migrate.h"
#include "sched/worker.h"

namespace kvsplit::sched {
namespace {

Status check_range(const char* field, const std::optional<int>& v, int lo, int hi) {
  if (v && (*v < lo || *v > hi)) {
    return invalid_argument(fmt::format("{}: must be in [{}, {}], got {}", field, lo, hi, *v));
  }
  return ok_status();
}

}  // namespace

void Worker::post_command(WorkerCommand command, CommandDone done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      inbox_commands_.emplace_back(std::move(command), std::move(done));
      wake_ = true;
      cv_.notify_all();
      return;
    }
  }
  done(CommandReply{unavailable(options_.name + " stopped"), {}});
}

Status Worker::apply(const WorkerCommand& command, Clock::time_point now) {
  if (const auto* p = std::get_if<SetSchedulerParams>(&command)) {
    SchedulerConfig c = scheduler_.config();
    KVSPLIT_RETURN_IF_ERROR(check_range("max_batch_tokens", p->max_batch_tokens, 1, 1 << 20));
    const int batch = p->max_batch_tokens.value_or(c.max_batch_tokens);
    KVSPLIT_RETURN_IF_ERROR(check_range("min_chunk_tokens", p->min_chunk_tokens, 1, batch));
    KVSPLIT_RETURN_IF_ERROR(check_range("max_num_seqs", p->max_num_seqs, 1, 65536));
    KVSPLIT_RETURN_IF_ERROR(check_range("max_chunk_tokens", p->max_chunk_tokens, 0, 1 << 20));
    if (p->max_chunk_ms && !(*p->max_chunk_ms >= 0 && *p->max_chunk_ms <= 1e6))
      return invalid_argument(
          fmt::format("max_chunk_ms: must be in [0, 1e6], got {}", *p->max_chunk_ms));
    c.max_batch_tokens = batch;
    c.min_chunk_tokens = p->min_chunk_tokens.value_or(std::min(c.min_chunk_tokens, batch));
    c.max_num_seqs = p->max_num_seqs.value_or(c.max_num_seqs);
    // The worker's own cap, not the scheduler's (which holds the step's time-based cap).
    c.max_chunk_tokens = p->max_chunk_tokens.value_or(options_.max_chunk_tokens);
    scheduler_ = Scheduler(c);
    options_.max_batch_tokens = c.max_batch_tokens;
    options_.min_chunk_tokens = c.min_chunk_tokens;
    // As the engine set it for the configured budget: a lower budget kept the prompts pulled for
    // the old one (more than a step can give a chunk each: the round robin's wait grows, and they
    // are not queued for other workers), a higher one too few to fill a step.
    options_.max_prefill_seqs = default_max_prefill_seqs(c.max_batch_tokens, c.min_chunk_tokens);
    options_.max_num_seqs = c.max_num_seqs;
    max_seqs_.store(c.max_num_seqs, std::memory_order_relaxed);
    options_.max_chunk_tokens = c.max_chunk_tokens;
    options_.max_chunk_ms = p->max_chunk_ms.value_or(options_.max_chunk_ms);
    KVSPLIT_LOG_INFO(
        "{}: scheduler set to max_batch_tokens {}, min_chunk_tokens {}, max_num_seqs {}, "
        "max_chunk_tokens {}, max_chunk_ms {}",
        options_.name, c.max_batch_tokens, c.min_chunk_tokens, c.max_num_seqs, c.max_chunk_tokens,
        options_.max_chunk_ms);
    return ok_status();
  }
  if (const auto* r = std::get_if<ReleaseKv>(&command)) {
    auto owns = [&](const Sequence& s) {
      return s.next == Sequence::Next::kStay && s.ctl->key() == r->key && !s.table.blocks.empty();
    };
    for (std::unique_ptr<Sequence>& s : running_) {
      if (!owns(*s)) continue;
      Preemption why;
      why.reason = PreemptReason::kCommand;
      why.for_priority = s->priority;
      preempt(*s, why, now);
      compact(now);
      return ok_status();
    }
    for (std::unique_ptr<Sequence>& s : waiting_) {
      if (!owns(*s)) continue;
      KVSPLIT_LOG_WARN("{}: releasing the KV of waiting request {} ({} tokens computed)",
                       options_.name, s->display_id(), s->num_computed);
      release_kv(*s);
      s->num_computed = 0;
      account_kv(*s, now);
      return ok_status();
    }
    return not_found(fmt::format("{} holds no KV of request '{}'", options_.name,
                                 escape_for_message(r->key.request_id)));
  }
  if (const auto* m = std::get_if<MigrateKv>(&command)) {
    for (const auto* list : {&running_, &waiting_}) {
      for (const std::unique_ptr<Sequence>& s : *list) {
        if (s->next != Sequence::Next::kStay || !(s->ctl->key() == m->key) ||
            s->table.blocks.empty())
          continue;
        const int end = m->end_page < 0 ? static_cast<int>(s->table.blocks.size()) : m->end_page;
        kv::MigrateStats st;
        settle_cut(*s, now, /*all=*/true);
        // A host prefetch reads the slots this may free; it is given up (counted) first.
        kv::drop_host_prefetch(*pool_, s->table, &swap_stats_);
        int max_pages = m->max_pages;
        if (m->up_to_room && m->to_shard >= 0 && m->to_shard < pool_->num_shards()) {
          const int room = pool_->shard(m->to_shard).local_available();
          if (room < 1)
            return resource_exhausted(
                fmt::format("migrate: shard {} has no free block", m->to_shard));
          max_pages = max_pages > 0 ? std::min(max_pages, room) : room;
        }
        KVSPLIT_ASSIGN_OR_RETURN(
            const int moved,
            kv::migrate_pages(*pool_, s->table, m->first_page, end, m->to_shard, &st, max_pages));
        migrate_stats_.add(st);
        account_kv(*s, now);  // pages brought back from the host tier are device bytes again
        KVSPLIT_LOG_INFO("{}: migrated {} pages of request {} to shard {} ({} from the host tier)",
                         options_.name, moved, s->display_id(), m->to_shard, st.from_host);
        // A swapped-out sequence whose every page came back waits with all its KV on the
        // device; the Scheduler resumes it (a swap-in of no pages) once its next token has room
        // and its reader keeps up.
        return ok_status();
      }
    }
    return not_found(fmt::format("{} holds no KV of request '{}'", options_.name,
                                 escape_for_message(m->key.request_id)));
  }
  if (const auto* c = std::get_if<SetCutParams>(&command)) return apply_cut_params(*c);
  return ok_status();  // SnapshotState
}

Status Worker::apply_cut_params(const SetCutParams& c) {
  if (c.temporal_step_size && *c.temporal_step_size < 1) {
    return invalid_argument(
        fmt::format("temporal_step_size: must be >= 1, got {}", *c.temporal_step_size));
  }
  if (c.semantic) {
    if (options_.kv_policy == KvPolicy::kFull) {
      return failed_precondition(options_.name +
                                 ": no semantic cut on this worker (kv_policy full)");
    }
    KVSPLIT_RETURN_IF_ERROR(cuts::semantic::validate(*c.semantic, "semantic."));
  }
  const bool global = c.sla_class.empty();
  if (global) {
    if (c.semantic) {
      const int64_t host_mb = options_.semantic.host_capacity_mb;
      const int32_t parts = options_.semantic.summary_parts;
      options_.semantic = *c.semantic;
      options_.semantic.host_capacity_mb = host_mb;
      options_.semantic.summary_parts = parts;
    }
    if (c.swap) options_.temporal.swap = *c.swap;
    if (c.temporal_step_size) options_.temporal.temporal_step_size = *c.temporal_step_size;
  }
  int changed = 0;
  for (const auto* list : {&running_, &waiting_}) {
    for (const std::unique_ptr<Sequence>& s : *list) {
      if (s->next == Sequence::Next::kRemove) continue;
      if (global) {
        // The worker's settings reach the sequences that use them (no class override).
        if (c.semantic && !s->sla.semantic && s->cut) s->cut->set_config(options_.semantic);
        ++changed;
        continue;
      }
      if (s->sla.name != c.sla_class) continue;
      if (c.semantic) {
        SemanticCutConfig sc = *c.semantic;
        sc.host_capacity_mb = options_.semantic.host_capacity_mb;
        sc.summary_parts = options_.semantic.summary_parts;
        s->sla.semantic = sc;
        if (s->cut) s->cut->set_config(sc);
      }
      if (c.swap) s->sla.swap = c.inherit ? std::nullopt : std::optional<SwapMode>(*c.swap);
      if (c.temporal_step_size) s->sla.temporal_step_size = c.inherit ? 0 : *c.temporal_step_size;
      ++changed;
    }
  }
  KVSPLIT_LOG_INFO("{}: cut settings of {} changed ({} sequences)", options_.name,
                   global ? std::string("the worker") : "class " + c.sla_class, changed);
  return ok_status();
}

WorkerState Worker::state() const {
  WorkerState st;
  st.worker = options_.name;
  st.device = backend_->device();
  for (int r = 0; r < 3; ++r) st.handoffs_by_route[r] = handoffs_by_route_[r];
  st.scheduler = scheduler_.config();
  st.scheduler.max_chunk_tokens = options_.max_chunk_tokens;  // configured, not this step's cap
  st.max_chunk_ms = options_.max_chunk_ms;
  st.max_prefill_seqs = options_.max_prefill_seqs;
  st.free_blocks = pool_->available_blocks();
  st.total_blocks = total_blocks_;
  st.num_shards = pool_->num_shards();
  for (int sh = 0; sh < st.num_shards; ++sh)
    st.shard_available.push_back(pool_->shard(sh).local_available());
  st.migrated_pages = migrate_stats_.pages;
  st.pending_handoffs = static_cast<int>(pending_.size());
  st.steps = steps_.load(std::memory_order_relaxed);
  for (const auto* list : {&running_, &waiting_}) {
    for (const std::unique_ptr<Sequence>& s : *list) {
      if (s->next == Sequence::Next::kRemove) continue;
      SequenceState q;
      q.tenant = s->ctl->tenant;
      q.request_id = s->display_id();
      q.key = s->ctl->key();
      q.running = list == &running_;
      q.priority = s->priority;
      q.num_tokens = static_cast<int>(s->tokens.size());
      q.num_computed = s->num_computed;
      q.num_blocks = static_cast<int>(s->table.blocks.size());
      q.preemptions = s->preemptions;
      q.pages_per_shard.assign(pool_->num_shards(), 0);
      q.full_pages_per_shard.assign(pool_->num_shards(), 0);
      for (size_t i = 0; i < s->table.blocks.size(); ++i) {
        const kv::PageEntry pe = s->table.page(i);
        if (pe.resident()) ++q.pages_per_shard[pe.shard];
        if (pe.resident() && pe.precision == kernels::KvPrecision::kFull)
          ++q.full_pages_per_shard[pe.shard];
        if (pe.location == kv::PageLocation::kHost) ++q.host_pages;
      }
      st.sequences.push_back(std::move(q));
    }
  }
  return st;
}

}  // namespace kvsplit::sched
