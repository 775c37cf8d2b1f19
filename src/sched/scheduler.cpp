#include "sched/scheduler.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "common/check.h"
#include "sched/swap_predictor.h"

namespace kvsplit::sched {
namespace {

int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

// Blocks a table of `blocks` pages needs beyond them to hold `positions` + 1 (its next token).
int next_token_blocks(int positions, int blocks, int block_size) {
  return std::max(0, blocks_for(positions + 1, block_size) - blocks);
}

PriorityKey key_of(const SchedSeq& s) { return {s.priority, s.arrival}; }

}  // namespace

const char* preempt_reason_name(PreemptReason reason) {
  switch (reason) {
    case PreemptReason::kDecodeGrowth:
      return "decode growth";
    case PreemptReason::kHandoff:
      return "higher-priority handoff";
    case PreemptReason::kCommand:
      return "worker command";
    case PreemptReason::kTimeSlice:
      return "time slice expired";
  }
  return "?";
}

Scheduler::Scheduler(SchedulerConfig config, std::shared_ptr<const SwapPredictor> predictor)
    : config_(config), predictor_(predictor ? std::move(predictor) : default_swap_predictor()) {}

int SchedulerOutput::num_tokens() const {
  int n = static_cast<int>(decode.size());
  for (const PrefillChunk& c : prefill) n += c.tokens;
  return n;
}

bool Scheduler::can_admit_prompt(int num_prompt, int free_blocks, int total_blocks, int num_running,
                                 int num_owned) const {
  if (num_owned >= config_.max_num_seqs) return false;
  const int watermark = num_running == 0 ? 0 : std::max(1, total_blocks / 100);
  return blocks_for(config_.prefill_reach(0, num_prompt), config_.block_size) + watermark <=
         free_blocks;
}

// The step's mutable view: free blocks, the running set (admitted handoffs join it), victims.
struct Scheduler::StepState {
  // The step's view of one running sequence (an admitted handoff included).
  struct Run {
    const SchedSeq* seq;
    int num_blocks;  // pages of its table
    int held;        // full-pool blocks among them (freed by a preemption)
    bool preempted = false;
    bool admitted_now = false;  // a handoff admitted in this step: never a victim in it
    int counted = 0;            // its blocks in `sums`
  };
  // A walk over the victim rankings: the runs it passed are passed for good.
  struct Walk {
    size_t stalled = 0, all = 0;
  };

  const SchedulerInput& in;
  const SwapPredictor& predictor;
  int free;
  std::vector<Run> runs;
  std::vector<SchedSeq> admitted_seqs;  // backing store of admitted handoffs' Run::seq
  // The highest priority among this step's victims (they wait for blocks next).
  std::optional<int32_t> top_victim;
  // A fixed-order predictor's ranking of the running sequences (indices of `runs`; admitted
  // handoffs are never victims), victim first, and the stalled ones among them in that order:
  // a subset ranks as it does within the whole (SwapPredictor::fixed_order). Built at the first
  // pick.
  std::vector<int> ranked, ranked_stalled;
  std::vector<const SchedSeq*> cands;  // ask_predictor's
  std::vector<size_t> cand_run;
  // Per-run block counts by service key for the phase under way: in admit() the blocks each
  // run's next token needs, in plan_prefill() the blocks each needs to reach its final positions.
  // A preemption takes its run's count away. Null otherwise.
  std::optional<ServiceSums> sums;

  StepState(const SchedulerInput& input, const SwapPredictor& p)
      : in(input), predictor(p), free(input.free_blocks) {
    runs.reserve(in.running.size() + in.handoffs.size());
    admitted_seqs.reserve(in.handoffs.size());  // stable addresses
    for (const SchedSeq& s : in.running)
      runs.push_back({&s, s.num_blocks, s.held_blocks >= 0 ? s.held_blocks : s.num_blocks});
  }

  // Victim among the running sequences that may still be preempted and satisfy `eligible`: the
  // predictor's first choice (the one rule everywhere), but a stalled run (its reader far
  // behind: SchedSeq::stalled) first whenever one is eligible: it holds blocks and will not
  // decode. -1 when none is eligible. With a fixed-order predictor, the runs `walk` passes are
  // passed for good: `eligible` must refuse a run for the rest of the walk once it refused it.
  template <typename Eligible>
  int pick_victim(Walk& walk, Eligible eligible) {
    if (!predictor.fixed_order()) {
      const int v = ask_predictor([&](const Run& r) { return r.seq->stalled && eligible(r); });
      return v >= 0 ? v : ask_predictor(eligible);
    }
    if (ranked.empty() && !in.running.empty()) rank();
    const int v = first_eligible(ranked_stalled, walk.stalled, eligible);
    return v >= 0 ? v : first_eligible(ranked, walk.all, eligible);
  }
  template <typename Eligible>
  int first_eligible(const std::vector<int>& order, size_t& next, Eligible eligible) const {
    for (; next < order.size(); ++next) {
      const Run& r = runs[static_cast<size_t>(order[next])];
      if (!r.preempted && eligible(r)) return order[next];
    }
    return -1;
  }
  // The predictor's choice among the eligible runs, shown only those.
  template <typename Eligible>
  int ask_predictor(Eligible eligible) {
    cands.clear();
    cand_run.clear();
    for (size_t r = 0; r < runs.size(); ++r) {
      if (runs[r].preempted || runs[r].admitted_now || !eligible(runs[r])) continue;
      cands.push_back(runs[r].seq);
      cand_run.push_back(r);
    }
    const int k = predictor.choose_victim(cands);
    KVSPLIT_CHECK(k < static_cast<int>(cands.size()));
    return k < 0 ? -1 : static_cast<int>(cand_run[k]);
  }
  void rank() {
    std::vector<const SchedSeq*> seqs;
    seqs.reserve(in.running.size());
    for (const SchedSeq& s : in.running) seqs.push_back(&s);
    ranked = predictor.rank_victims(seqs);
    KVSPLIT_CHECK(ranked.size() == seqs.size());
    for (int r : ranked)
      if (in.running[static_cast<size_t>(r)].stalled) ranked_stalled.push_back(r);
  }
  void count(Run& r, int blocks) {
    r.counted = blocks;
    sums->add(key_of(*r.seq), blocks);
  }
  void preempt(Run& v, PreemptReason reason, int for_id, int32_t for_priority,
               SchedulerOutput& out) {
    v.preempted = true;
    free += v.held;
    if (sums) sums->add(key_of(*v.seq), -v.counted);
    v.counted = 0;
    out.preempted.push_back({v.seq->id, reason, v.held, for_id, for_priority});
    top_victim = std::max(top_victim.value_or(v.seq->priority), v.seq->priority);
  }
};

SchedulerOutput Scheduler::admit_handoffs(const SchedulerInput& in) const {
  KVSPLIT_CHECK(config_.block_size >= 1 && config_.max_num_seqs >= 1);
  SchedulerOutput out;
  StepState st(in, *predictor_);
  admit(st, out);
  out.free_blocks_after = st.free;
  return out;
}

SchedulerOutput Scheduler::schedule(const SchedulerInput& in) const {
  KVSPLIT_CHECK(config_.block_size >= 1 && config_.max_num_seqs >= 1);
  SchedulerOutput out;
  StepState st(in, *predictor_);
  admit(st, out);
  grow_decodes(st, out);
  plan_prefill(st, out);
  out.free_blocks_after = st.free;
  return out;
}

// 1. Handoffs, in arrival order, no overtaking.
void Scheduler::admit(StepState& st, SchedulerOutput& out) const {
  const SchedulerInput& in = st.in;
  if (in.handoffs.empty()) return;
  int slots =
      config_.max_num_seqs - static_cast<int>(in.running.size() + in.waiting.size()) - in.unlisted;
  bool discounted = false;  // an offer admitted this pass without blocks for its shared pages
  // The highest priority among the waiting sequences without blocks (preempted earlier).
  std::optional<int32_t> top_paused;
  for (const SchedSeq& w : in.waiting) {
    if (w.num_blocks == 0 || w.swapped_pages > 0 || w.resident_paused())
      top_paused = std::max(top_paused.value_or(w.priority), w.priority);
  }
  // The blocks the next tokens of the running sequences need (those admitted below included),
  // summed by service key.
  std::vector<PriorityKey> keys;
  keys.reserve(st.runs.size() + in.handoffs.size());
  for (const StepState::Run& r : st.runs) keys.push_back(key_of(*r.seq));
  for (const SchedHandoff& h : in.handoffs) keys.push_back({h.priority, h.arrival});
  st.sums.emplace(std::move(keys));
  for (StepState::Run& r : st.runs) {
    if (!r.seq->stalled)
      st.count(r, next_token_blocks(r.seq->num_computed, r.num_blocks, config_.block_size));
  }
  for (const SchedHandoff& h : in.handoffs) {
    const int pages = blocks_for(h.num_tokens, config_.block_size);
    // The pages it brings; dropped ones need none.
    const int full_need = pages - h.dropped_pages;
    if (full_need > in.total_blocks) {
      out.never_fit.push_back(h.id);
      continue;
    }
    if (slots <= 0) {
      out.handoff_wait = HandoffWait::kNoSlot;
      break;
    }
    // Waiting sequences without blocks (preempted earlier) get blocks before a handoff of no
    // higher priority, so a stream of handoffs cannot starve them.
    const bool blocked = (top_paused && *top_paused >= h.priority) ||
                         (st.top_victim && *st.top_victim >= h.priority);
    if (blocked) {
      out.handoff_wait = HandoffWait::kPreemptedFirst;
      break;
    }
    // The sequences served before it decode this step after admission (grow_decodes): the
    // blocks their next tokens need are not the handoff's. Otherwise the first of them to need
    // one finds none and preempts the handoff just copied in (the worker schedules the step
    // after admitting) or, where the handoff is protected, itself.
    // Its own first decode comes in this step too: without the block its next token needs, it
    // would be copied in only to preempt itself at once (grow_decodes) when no one else may
    // yield.
    const PriorityKey hk{h.priority, h.arrival};
    const int next = next_token_blocks(h.num_tokens, pages, config_.block_size);
    const int others = st.sums->before(hk);
    auto room_for = [&](int need) {
      return need + (need + next <= in.total_blocks ? next : 0) + others;
    };
    // Pages it shares with running sequences need no block. Not in a pass that preempts: a
    // victim's held blocks count the pages it shares with the cache alone, which then become
    // idle cached pages that a handoff takes at one block each. So a discount is taken only
    // before any preemption of the pass, and a preemption only before any discount (the offer
    // waits a step, when the shares are counted again).
    int need = out.preempted.empty() ? full_need - h.shared_pages : full_need;
    int room = room_for(need);
    // Strictly lower priorities, and stalled runs of any priority (they hold blocks and will not
    // decode), only when that frees enough.
    auto may_yield = [&](const StepState::Run& r) {
      return r.seq->stalled || r.seq->priority < h.priority;
    };
    if (room > st.free && need < full_need) {
      need = full_need;
      room = room_for(need);
    }
    if (room > st.free) {
      if (discounted) {
        out.handoff_wait = HandoffWait::kNoBlocks;
        break;
      }
      int available = st.free;
      for (const StepState::Run& r : st.runs) {
        if (!r.preempted && !r.admitted_now && may_yield(r)) available += r.held;
      }
      if (available < room) {
        out.handoff_wait = HandoffWait::kNoBlocks;
        break;
      }
      StepState::Walk walk;
      while (st.free < room) {
        const int v = st.pick_victim(walk, may_yield);
        KVSPLIT_CHECK(v >= 0);
        st.preempt(st.runs[v], PreemptReason::kHandoff, h.id, h.priority, out);
      }
    }
    st.free -= need;
    discounted = discounted || need < full_need;
    --slots;
    out.admitted.push_back({h.id, need});
    SchedSeq s;
    s.id = h.id;
    s.priority = h.priority;
    s.arrival = h.arrival;
    s.num_computed = h.num_tokens;
    s.num_blocks = pages;
    s.held_blocks = need;
    st.admitted_seqs.push_back(s);
    st.runs.push_back({&st.admitted_seqs.back(), pages, need, false, true});
    st.count(st.runs.back(), next);
  }
  st.sums.reset();
}

// 2. Decode: one token each, best served first.
void Scheduler::grow_decodes(StepState& st, SchedulerOutput& out) const {
  std::vector<StepState::Run>& runs = st.runs;
  std::vector<size_t> order(runs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return serves_before(key_of(*runs[a].seq), key_of(*runs[b].seq));
  });
  // Runs served before the one being grown stay ineligible for the later ones: one walk.
  StepState::Walk walk;
  for (size_t i = 0; i < order.size(); ++i) {
    StepState::Run& r = runs[order[i]];
    if (r.preempted || r.seq->stalled) continue;
    const int need = next_token_blocks(r.seq->num_computed, r.num_blocks, config_.block_size);
    if (r.held + need > st.in.total_blocks) {
      out.never_fit.push_back(r.seq->id);  // its next token needs more than the whole pool
      continue;
    }
    while (need > st.free && !r.preempted) {
      // The sequence served last among those not yet grown this step (possibly r itself).
      // A stalled run yields whatever its service order (it will not decode).
      const int v = st.pick_victim(walk, [&](const StepState::Run& c) {
        return c.seq->stalled || !serves_before(key_of(*c.seq), key_of(*r.seq)) || &c == &r;
      });
      if (v < 0) break;  // only handoffs admitted this step are left: r waits a step
      st.preempt(runs[v], PreemptReason::kDecodeGrowth, r.seq->id, r.seq->priority, out);
    }
    if (r.preempted || need > st.free) continue;
    st.free -= need;
    r.num_blocks += need;
    r.held += need;
    out.decode.push_back({r.seq->id, need});
  }
}

bool Scheduler::make_room_by_slice(StepState& st, const SchedSeq& w, int need,
                                   SchedulerOutput& out) const {
  // A stalled run (its reader far behind) yields to any waiting work: it will not decode.
  auto eligible = [&](const StepState::Run& r) {
    return r.seq->stalled || (r.seq->slice_expired && r.seq->priority < w.priority);
  };
  int available = st.free;
  for (const StepState::Run& r : st.runs)
    if (!r.preempted && !r.admitted_now && eligible(r)) available += r.held;
  if (available < need) return false;
  const size_t first = out.preempted.size();
  StepState::Walk walk;
  while (st.free < need) {
    const int v = st.pick_victim(walk, eligible);
    KVSPLIT_CHECK(v >= 0);
    st.preempt(st.runs[v], PreemptReason::kTimeSlice, w.id, w.priority, out);
  }
  // They were grown for this step's decode: those rows go (their blocks were counted in `held`).
  std::vector<int> paused;
  for (size_t i = first; i < out.preempted.size(); ++i) paused.push_back(out.preempted[i].id);
  std::sort(paused.begin(), paused.end());
  std::erase_if(out.decode, [&](const DecodeRow& d) {
    return std::binary_search(paused.begin(), paused.end(), d.id);
  });
  return true;
}

int Scheduler::next_token_room(int positions, int blocks, int total_blocks) const {
  const int extra = next_token_blocks(positions, blocks, config_.block_size);
  return blocks + extra <= total_blocks ? extra : 0;
}

int Scheduler::growth_ahead(StepState& st, const SchedSeq& w) const {
  if (!st.sums) {  // built at the first call of a plan (a plan planned again builds it again)
    std::vector<PriorityKey> keys;
    keys.reserve(st.runs.size());
    for (const StepState::Run& r : st.runs) keys.push_back(key_of(*r.seq));
    st.sums.emplace(std::move(keys));
    for (StepState::Run& r : st.runs) {
      r.counted = 0;
      if (r.preempted || r.seq->stalled || r.seq->final_positions <= 0) continue;
      const int last = blocks_for(r.seq->final_positions, config_.block_size);
      st.count(r, std::clamp(last - r.num_blocks, 0, std::max(0, st.in.total_blocks - r.held)));
    }
  }
  return st.sums->before(key_of(w));
}

// 3. Prefill and recompute chunks under the token budget.
void Scheduler::plan_prefill(StepState& st, SchedulerOutput& out) const {
  const SchedulerInput& in = st.in;
  if (in.waiting.empty()) return;
  int budget = config_.max_batch_tokens;
  if (config_.decode_in_budget) {
    budget = std::max(config_.max_batch_tokens - static_cast<int>(out.decode.size()),
                      config_.min_chunk_tokens);
  }
  std::vector<const SchedSeq*> by_service;
  for (const SchedSeq& w : in.waiting) by_service.push_back(&w);
  std::stable_sort(by_service.begin(), by_service.end(), [](const SchedSeq* a, const SchedSeq* b) {
    return serves_before(key_of(*a), key_of(*b));
  });
  struct Cand {
    const SchedSeq* seq;
    int new_blocks;
    bool sliced;  // running sequences were paused for it (make_room_by_slice)
  };
  // Waiting prompts that get no chunk this step even with room: pausing a running sequence for
  // one would free its blocks for nothing, so it does not fit (and stops the rest) instead.
  std::vector<int> no_slice;
  auto slice_for = [&](const SchedSeq& w, int room) {
    return std::find(no_slice.begin(), no_slice.end(), w.id) == no_slice.end() &&
           make_room_by_slice(st, w, room, out);
  };
  // Reservation in service order, then the fair prefill rule (policy.h): progress for every
  // prompt, then the least remaining first within a priority, each under max_chunk_tokens. Chunks
  // are listed in that order.
  // Steps advance only while some running sequence decodes: none may be running, or every one
  // may be stalled behind its reader (no decode row).
  const bool steps_advance = std::any_of(in.running.begin(), in.running.end(),
                                         [](const SchedSeq& r) { return !r.stalled; });
  auto select = [&](std::vector<Cand>& cands) {
    cands.clear();
    bool reserving = true;  // the first that does not fit stops later ones from starting
    // Blocks left free for the next tokens of the resumptions (swap-ins, restarts) admitted
    // earlier in this plan: a later resumption fits only beside them, or it took the block an
    // earlier one decodes into and was preempted by that one's first decode. (The growth of the
    // running sequences ahead is not summed here: growth_ahead counts it afresh for each
    // candidate, and a later candidate's covers an earlier one's.)
    int promised = 0;
    for (const SchedSeq* w : by_service) {
      // A resident paused sequence has nothing to prefill: a swap-in of no pages.
      if (w->swapped_pages > 0 || w->resident_paused()) {
        // Paused until its resume step, unless steps would not advance.
        if (w->swapped_pages > 0 && in.step < w->resume_step && steps_advance) continue;
        // It resumes only with room for its next token too, which needs a block only beyond its
        // whole table, and which the pool can hold beside the full-pool blocks the table will
        // hold: a table a KV cut changed swaps in fewer pages than it has (quantized pages stay
        // in their arenas, evicted ones hold none).
        const int extra = next_token_blocks(w->num_computed, w->num_blocks, config_.block_size);
        const int held = (w->held_blocks >= 0 ? w->held_blocks : w->num_blocks - w->swapped_pages) +
                         w->swapped_pages;
        const int own = w->swapped_pages + (held + extra <= in.total_blocks ? extra : 0);
        // As a restart does: room too for the sequences served before it to reach their last
        // position, or their growth pauses it again at once (it is served after them), before it
        // decodes a token, for two copies each round.
        // (Not reserving, `room` is not read.)
        const int room = own + (reserving ? growth_ahead(st, *w) : 0) + promised;
        if (reserving && room > st.free) make_room_by_slice(st, *w, room, out);
        if (!reserving || room > st.free) {
          reserving = false;
          continue;
        }
        st.free -= w->swapped_pages;  // the next token's block stays free (taken at its decode)
        promised += own - w->swapped_pages;
        out.swap_in.push_back({w->id, w->swapped_pages});
        continue;
      }
      if (w->num_computed >= w->target) continue;
      // Blocks its table must have for this step's chunk: the whole target's, or with a window
      // as far as the chunk can reach (the pages behind the window went after earlier steps).
      const int reach_blocks =
          blocks_for(config_.prefill_reach(w->num_computed, w->target), config_.block_size);
      int need = std::max(0, reach_blocks - w->num_blocks);
      if (config_.kv_window > 0) {
        // Whatever of it the pool can hold beside the pages it keeps; its chunk is cut to that
        // below. None at all: its window and a page do not fit.
        const int room_left =
            in.total_blocks - (w->held_blocks >= 0 ? w->held_blocks : w->num_blocks);
        if (need > 0 && room_left <= 0) {
          out.never_fit.push_back(w->id);
          continue;
        }
        need = std::min(need, room_left);
      } else if (reach_blocks > in.total_blocks) {
        out.never_fit.push_back(w->id);
        continue;
      }
      // The block a restart's next token needs once its recompute ends (with a window, counted
      // once the chunk reaches the target). It stays promised while the recompute runs, over
      // several steps maybe, so it is counted for a restart that reserved its pages before too.
      const bool last = blocks_for(w->target, config_.block_size) == reach_blocks;
      const int next =
          w->restart && last ? next_token_room(w->target, reach_blocks, in.total_blocks) : 0;
      bool sliced = false;
      if (need > 0) {
        // A restart also leaves room for the sequences served before it to reach their last
        // position (their growth would otherwise preempt it again and its recompute be lost),
        // for its own next token, and for the next tokens of the resumptions before it.
        const int room =
            need + (w->restart ? (reserving ? growth_ahead(st, *w) : 0) + promised + next : 0);
        if (reserving && room > st.free) sliced = slice_for(*w, room);
        if (!reserving || room > st.free) {
          // With a window, a prompt whose pages (and, while reserving, the free blocks) still
          // hold positions past what it computed takes a smaller chunk there: prompts that held
          // every block between them and each waited for a full chunk's pages hung the worker for
          // good (the pages behind the window go only as the chunks advance). A later prompt
          // takes no free block, so the first that did not fit keeps its claim, and nor does a
          // restart while sequences decode (their growth is what its reservation protects).
          const bool may_take_free = reserving && (!w->restart || !steps_advance);
          const int kept = w->restart ? promised : 0;
          const int part = may_take_free ? std::clamp(st.free - kept, 0, need) : 0;
          reserving = false;
          if (config_.kv_window > 0 &&
              (w->num_blocks + part) * config_.block_size > w->num_computed) {
            st.free -= part;
            cands.push_back({w, part, false});
          }
          continue;
        }
        st.free -= need;
      }
      promised += next;
      cands.push_back({w, need, sliced});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
      if (a.seq->priority != b.seq->priority) return a.seq->priority > b.seq->priority;
      const int ra = a.seq->target - a.seq->num_computed, rb = b.seq->target - b.seq->num_computed;
      if (ra != rb) return ra < rb;
      return a.seq->last_prefill_step < b.seq->last_prefill_step;
    });
    std::vector<PrefillDemand> demands(cands.size());
    for (size_t i = 0; i < cands.size(); ++i) {
      const SchedSeq& s = *cands[i].seq;
      demands[i] = {s.target - s.num_computed, s.priority, s.last_prefill_step, s.waiting_since};
    }
    // The cap holds even for a prompt alone on its worker: a request arriving during the step
    // waits for it, and a whole-budget step of a long prompt late in its prefill (its chunk
    // attends to every token before it) was what made short requests' TTFT p99 3-5x
    // (docs/kv-cuts.md).
    return plan_fair_prefill(demands, budget, config_.min_chunk_tokens, config_.max_chunk_tokens,
                             in.step);
  };
  // A prompt that running sequences were paused for but that the budget then gives no chunk is
  // planned again without that pause. Each round adds at least one prompt to no_slice, and
  // leaving a prompt out only frees budget for the others, so the rounds end.
  // Without an expired slice nothing can be paused: one round, and no state kept to go back to.
  struct Saved {
    int free;
    std::vector<StepState::Run> runs;
    std::optional<int32_t> top_victim;
    std::optional<ServiceSums> sums;
    SchedulerOutput out;
  };
  std::optional<Saved> saved;
  if (std::any_of(st.runs.begin(), st.runs.end(),
                  [](const StepState::Run& r) { return r.seq->slice_expired; })) {
    saved = Saved{st.free, st.runs, st.top_victim, st.sums, out};
  }
  std::vector<Cand> cands;
  std::vector<int> chunks;
  for (;;) {
    chunks = select(cands);
    if (!saved) break;
    const size_t wasted = no_slice.size();
    for (size_t i = 0; i < cands.size(); ++i)
      if (cands[i].sliced && chunks[i] == 0) no_slice.push_back(cands[i].seq->id);
    if (no_slice.size() == wasted) break;
    st.free = saved->free;
    st.runs = saved->runs;
    st.top_victim = saved->top_victim;
    st.sums = saved->sums;
    out = saved->out;
  }
  for (size_t i = 0; i < cands.size(); ++i) {
    const SchedSeq& s = *cands[i].seq;
    int new_blocks = cands[i].new_blocks;
    if (config_.kv_window > 0 && chunks[i] > 0) {
      // Reserved for the largest chunk its table could take: the chunk stays within it, and the
      // blocks the chunk it got does not reach stay free.
      chunks[i] =
          std::min(chunks[i], (s.num_blocks + new_blocks) * config_.block_size - s.num_computed);
      const int used = std::max(
          0,
          blocks_for(config_.chunk_reach(s.num_computed, chunks[i], s.target), config_.block_size) -
              s.num_blocks);
      st.free += new_blocks - used;
      new_blocks = used;
    }
    if (chunks[i] <= 0) {
      st.free += new_blocks;  // not started this step: its reservation is not made
      continue;
    }
    out.prefill.push_back(
        {s.id, s.num_computed, chunks[i], new_blocks, s.num_computed + chunks[i] == s.target});
  }
}

}  // namespace kvsplit::sched
