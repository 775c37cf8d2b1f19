#include "sched/router.h"

#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <thread>

#include "model/tokenizer.h"
#include "sched/admission.h"
#include "test_util.h"

namespace kvsplit::sched {
namespace {

// Router::class_queues as plain vectors, in class order.
std::vector<int> queued_per_class(const Router& r) {
  std::vector<int> out;
  for (const Router::ClassQueue& q : r.class_queues(Clock::now())) out.push_back(q.queued);
  return out;
}
std::vector<double> oldest_wait_ms_per_class(const Router& r, Clock::time_point now) {
  std::vector<double> out;
  for (const Router::ClassQueue& q : r.class_queues(now)) out.push_back(q.oldest_wait_ms);
  return out;
}

std::unique_ptr<Sequence> make_seq(const std::string& id, int64_t arrival, int priority,
                                   const SlaClass& cls, int class_index,
                                   Clock::time_point deadline) {
  auto s = std::make_unique<Sequence>();
  s->ctl = std::make_shared<RequestControl>(id);
  s->arrival = arrival;
  s->priority = priority;
  s->sla = cls;
  s->class_index = class_index;
  s->queue_deadline = deadline;
  s->num_prompt = 10 + static_cast<int>(arrival);
  return s;
}

// A push counts its request against its class by name in the list of now: a reload between the
// caller's look-up of the class index and the push (here: classes reordered, the index stale)
// must not count it against another class's max_queue, and the class's max_queue of now holds.
TEST(Router, PushCountsTheClassByNameAfterAReload) {
  SlaClass a, b;
  a.name = "a";
  a.max_queue = 1;
  b.name = "b";
  b.max_queue = 100;
  const auto far = Clock::now() + std::chrono::hours(1);
  Router r({a, b}, nullptr);
  r.set_classes({b, a});  // reordered: "a" is index 1 now
  auto bs = make_seq("x", 0, 0, b, /*index of b now=*/0, far);
  ASSERT_TRUE(r.push(bs).ok());
  // "a" requests whose index was looked up before the reload (0: b's now). The first was refused
  // as if b's queued request were a's.
  auto first = make_seq("y", 1, 0, a, 0, far);
  EXPECT_TRUE(r.push(first).ok());
  auto second = make_seq("z", 2, 0, a, 0, far);
  EXPECT_EQ(r.push(second).code(), StatusCode::kResourceExhausted);  // a's max_queue 1
  EXPECT_EQ(r.num_queued(), 2);
  while (r.pop_if([](const Sequence&) { return true; })) {
  }
  auto again = make_seq("w", 3, 0, a, 0, far);
  EXPECT_TRUE(r.push(again).ok());  // a's count went back to 0
}

// A class's cut settings changed (the KV cache manager's class-scoped swap, temporal_step_size or
// semantic settings) reach its queued requests, and a request taken before the change takes them
// where it is admitted (refresh_cut_settings); other classes and other fields are left alone.
TEST(Router, ClassCutSettingsReachQueuedRequests) {
  SlaClass batch, voice;
  batch.name = "batch";
  batch.swap = SwapMode::kAlways;
  batch.max_ttft_ms = 5000;
  voice.name = "voice";
  const auto far = Clock::now() + std::chrono::hours(1);
  Router r({batch, voice}, nullptr);
  auto queued = make_seq("q", 0, 0, batch, 0, far);
  Sequence* q = queued.get();
  ASSERT_TRUE(r.push(queued).ok());
  auto other = make_seq("o", 1, 0, voice, 1, far);
  Sequence* o = other.get();
  ASSERT_TRUE(r.push(other).ok());
  SlaClass in_flight = batch;  // a request already on its way to a decode worker
  SlaClass changed = batch;
  changed.swap = SwapMode::kNever;
  changed.temporal_step_size = 7;
  changed.semantic = SemanticCutConfig{};
  changed.semantic->semantic_threshold = 0.3f;
  changed.max_ttft_ms = 1;  // not a cut setting: the queued request keeps its own
  r.set_classes({changed, voice});
  EXPECT_EQ(q->sla.swap, SwapMode::kNever);
  EXPECT_EQ(q->sla.temporal_step_size, 7);
  ASSERT_TRUE(q->sla.semantic.has_value());
  EXPECT_FLOAT_EQ(q->sla.semantic->semantic_threshold, 0.3f);
  EXPECT_EQ(q->sla.max_ttft_ms, 5000);
  EXPECT_FALSE(o->sla.swap.has_value());
  EXPECT_TRUE(r.refresh_cut_settings(&in_flight));
  EXPECT_EQ(in_flight.swap, SwapMode::kNever);
  EXPECT_EQ(in_flight.temporal_step_size, 7);
  SlaClass gone;
  gone.name = "gone";
  gone.swap = SwapMode::kAlways;
  EXPECT_FALSE(r.refresh_cut_settings(&gone));
  EXPECT_EQ(gone.swap, SwapMode::kAlways);
  // A request made from the class list of before the change and pushed after it (a submit racing
  // the KV cache manager) takes the class's settings of now at the push.
  auto late = make_seq("l", 2, 0, batch, 2, far);
  Sequence* l = late.get();
  ASSERT_TRUE(r.push(late).ok());
  EXPECT_EQ(l->sla.swap, SwapMode::kNever);
  EXPECT_EQ(l->sla.temporal_step_size, 7);
  EXPECT_EQ(l->sla.max_ttft_ms, 5000);
}

TEST(Router, PriorityThenArrival) {
  SlaClass c;
  const auto far = Clock::now() + std::chrono::hours(1);
  Router r({c}, nullptr);
  for (auto [id, arrival, prio] : std::vector<std::tuple<const char*, int, int>>{
           {"a", 0, 0}, {"b", 1, 5}, {"c", 2, 0}, {"d", 3, 5}}) {
    auto s = make_seq(id, arrival, prio, c, 0, far);
    ASSERT_TRUE(r.push(s).ok());
  }
  EXPECT_EQ(r.num_queued(), 4);
  auto any = [](const Sequence&) { return true; };
  std::string order;
  while (auto s = r.pop_if(any)) order += s->id();
  EXPECT_EQ(order, "bdac");
}

// A cancel that looked its request up before it finished must not remove a later request that
// reuses the id (remove with the control it found); without one, remove takes whatever holds
// the key.
TEST(Router, RemoveOfAFinishedRequestLeavesALaterOneWithItsId) {
  SlaClass c;
  Router r({c}, nullptr);
  const auto far = Clock::now() + std::chrono::hours(1);
  auto a = make_seq("x", 0, 0, c, 0, far);
  const std::shared_ptr<RequestControl> a_ctl = a->ctl;
  ASSERT_TRUE(r.push(a).ok());
  auto popped = r.pop_if([](const Sequence&) { return true; });
  ASSERT_NE(popped, nullptr);
  auto later = make_seq("x", 1, 0, c, 0, far);
  const RequestControl* later_ctl = later->ctl.get();
  ASSERT_TRUE(r.push(later).ok());
  EXPECT_EQ(r.remove(a_ctl->key(), a_ctl.get()), nullptr);
  EXPECT_EQ(r.num_queued(), 1);
  auto removed = r.remove(a_ctl->key(), later_ctl);
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->ctl.get(), later_ctl);
  EXPECT_EQ(r.num_queued(), 0);
}

// notify false leaves the wake-up to the caller's notify_pushed().
TEST(Router, PushWithoutNotifyWakesOnlyOnNotifyPushed) {
  SlaClass c;
  int wakes = 0;
  Router r({c}, [&] { ++wakes; });
  auto s = make_seq("q", 0, 0, c, 0, Clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(r.push(s, /*notify=*/false).ok());
  EXPECT_EQ(wakes, 0);
  r.notify_pushed();
  EXPECT_EQ(wakes, 1);
  auto t = make_seq("t", 1, 0, c, 0, Clock::now() + std::chrono::hours(1));
  ASSERT_TRUE(r.push(t).ok());
  EXPECT_EQ(wakes, 2);
}

TEST(Router, PopIfDoesNotSkipTheBest) {
  SlaClass c;
  Router r({c}, nullptr);
  const auto far = Clock::now() + std::chrono::hours(1);
  auto big = make_seq("big", 0, 0, c, 0, far);
  auto small = make_seq("small", 1, 0, c, 0, far);
  ASSERT_TRUE(r.push(big).ok());
  ASSERT_TRUE(r.push(small).ok());
  // "big" (first in order) does not fit; "small" would, but must not overtake it.
  EXPECT_EQ(r.pop_if([](const Sequence& s) { return s.id() == "small"; }), nullptr);
  EXPECT_EQ(r.num_queued(), 2);
}

// Completions held for their first completion's prompt (RequestControl::prompt_ready) are not
// candidates: the best one that may start is, and a held one goes once released. Completion 0
// itself is never held.
TEST(Router, PopIfPassesOverCompletionsHeldForThePrompt) {
  SlaClass c;
  Router r({c}, nullptr);
  const auto far = Clock::now() + std::chrono::hours(1);
  auto ready = std::make_shared<std::atomic<int64_t>>(0);
  auto stream = std::make_shared<RequestStream>("g", 2);
  auto held = make_seq("g", 0, 5, c, 0, far);  // the best by priority
  held->ctl = std::make_shared<RequestControl>("g", "", 1, stream);
  held->ctl->prompt_ready = ready;
  auto other = make_seq("o", 1, 0, c, 0, far);
  auto first = make_seq("g", 2, 0, c, 0, far);
  first->ctl = std::make_shared<RequestControl>("g", "", 0, stream);
  first->ctl->prompt_ready = ready;
  ASSERT_TRUE(r.push(held).ok());
  ASSERT_TRUE(r.push(other).ok());
  ASSERT_TRUE(r.push(first).ok());
  std::vector<std::string> seen;
  auto got = r.pop_if([&](const Sequence& s) {
    seen.push_back(s.id());
    return true;
  });
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->id(), "o");
  EXPECT_EQ(seen, std::vector<std::string>{"o"}) << "fits() saw a held completion";
  got = r.pop_if([](const Sequence&) { return true; });
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->ctl->index, 0);
  EXPECT_EQ(r.pop_if([](const Sequence&) { return true; }), nullptr);
  EXPECT_EQ(r.num_queued(), 1);
  got->release_siblings();  // completion 0's first token
  got = r.pop_if([](const Sequence&) { return true; });
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->ctl->index, 1);
}

// A completion held for its first completion's prompt does not time out in the queue; once let
// go, its queue wait counts from then (its deadline moves by the time it was held).
TEST(Router, HeldCompletionsTimeOutOnlyAfterTheirRelease) {
  SlaClass c;
  Router r({c}, nullptr);
  const Clock::time_point t0 = Clock::now();
  const auto ms = [](int v) { return std::chrono::milliseconds(v); };
  auto ready = std::make_shared<std::atomic<int64_t>>(0);
  auto stream = std::make_shared<RequestStream>("g", 2);
  auto first = make_seq("g", 0, 0, c, 0, t0 + ms(100));
  first->ctl = std::make_shared<RequestControl>("g", "", 0, stream);
  first->ctl->prompt_ready = ready;
  first->submit_time = t0;
  auto second = make_seq("g", 1, 0, c, 0, t0 + ms(100));
  second->ctl = std::make_shared<RequestControl>("g", "", 1, stream);
  second->ctl->prompt_ready = ready;
  second->submit_time = t0;
  ASSERT_TRUE(r.push(first).ok());
  ASSERT_TRUE(r.push(second).ok());
  // Completion 0 was pulled; the held one is past its deadline but stays.
  ASSERT_NE(r.pop_if([](const Sequence&) { return true; }), nullptr);
  EXPECT_TRUE(r.take_expired(t0 + ms(150)).empty());
  // Let go at t0 + 300 ms: due at t0 + 400 ms (100 ms of queue wait from its release).
  ready->store((t0 + ms(300)).time_since_epoch().count());
  EXPECT_TRUE(r.take_expired(t0 + ms(350)).empty());
  const auto due = r.take_expired(t0 + ms(401));
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->ctl->index, 1);
}

// A stream of n completions marks the final event of the last one to end `last`, and only it.
TEST(RequestStream, TheLastCompletionsFinalEventIsTheLast) {
  RequestStream stream("r", 3);
  for (int i : {2, 0, 1}) {
    TokenEvent tok;
    tok.index = i;
    stream.push(tok);
    TokenEvent fin;
    fin.index = i;
    fin.final = true;
    stream.push(fin);
  }
  EXPECT_TRUE(stream.last_pushed());
  std::vector<std::pair<int, bool>> finals;
  TokenEvent ev;
  while (stream.try_next(&ev)) {
    EXPECT_FALSE(ev.last && !ev.final);
    if (ev.final) finals.emplace_back(ev.index, ev.last);
  }
  EXPECT_EQ(finals, (std::vector<std::pair<int, bool>>{{2, false}, {0, false}, {1, true}}));
  RequestStream one("s");
  TokenEvent fin;
  fin.final = true;
  one.push(fin);
  ASSERT_TRUE(one.try_next(&ev));
  EXPECT_TRUE(ev.last);
}

TEST(Router, BoundedPerClassExpiryAndRemove) {
  SlaClass a, b;
  a.name = "a";
  a.max_queue = 2;
  b.name = "b";
  b.max_queue = 1;
  std::atomic<int> pushes{0};
  Router r({a, b}, [&] { pushes.fetch_add(1); });
  const auto now = Clock::now();
  auto s0 = make_seq("0", 0, 0, a, 0, now + std::chrono::milliseconds(5));
  auto s1 = make_seq("1", 1, 0, a, 0, now + std::chrono::hours(1));
  auto s2 = make_seq("2", 2, 0, a, 0, now);
  auto s3 = make_seq("3", 3, 0, b, 1, now + std::chrono::hours(1));
  ASSERT_TRUE(r.push(s0).ok());
  ASSERT_TRUE(r.push(s1).ok());
  Status full = r.push(s2);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("'a' queue is full (2 queued, max_queue 2)"), std::string::npos);
  ASSERT_NE(s2, nullptr);  // left untouched
  ASSERT_TRUE(r.push(s3).ok());
  EXPECT_EQ(pushes.load(), 3);
  EXPECT_EQ(queued_per_class(r), (std::vector<int>{2, 1}));

  auto expired = r.take_expired(now + std::chrono::milliseconds(10));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]->id(), "0");
  EXPECT_EQ(r.remove({"", "nope"}), nullptr);
  auto removed = r.remove({"", "3"});
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(queued_per_class(r), (std::vector<int>{1, 0}));
  EXPECT_EQ(r.take_all().size(), 1u);
  EXPECT_EQ(r.num_queued(), 0);
}

// The KVM's queue_wait_ms: per class, the wait of its oldest queued sequence since submit.
TEST(Router, OldestWaitPerClass) {
  SlaClass a, b;
  a.name = "a";
  b.name = "b";
  Router r({a, b}, nullptr);
  const auto now = Clock::now();
  const auto far = now + std::chrono::hours(1);
  EXPECT_EQ(oldest_wait_ms_per_class(r, now), (std::vector<double>{0, 0}));
  auto s0 = make_seq("0", 0, 0, a, 0, far);
  s0->submit_time = now - std::chrono::milliseconds(300);
  auto s1 = make_seq("1", 1, 0, a, 0, far);
  s1->submit_time = now - std::chrono::milliseconds(100);
  auto s2 = make_seq("2", 2, 0, b, 1, far);
  s2->submit_time = now - std::chrono::milliseconds(50);
  ASSERT_TRUE(r.push(s0).ok());
  ASSERT_TRUE(r.push(s1).ok());
  ASSERT_TRUE(r.push(s2).ok());
  std::vector<double> w = oldest_wait_ms_per_class(r, now);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_DOUBLE_EQ(w[0], 300);
  EXPECT_DOUBLE_EQ(w[1], 50);
  // The oldest leaves: the next one's wait; a later `now` adds to it.
  auto any = [](const Sequence&) { return true; };
  ASSERT_NE(r.pop_if(any), nullptr);  // "0": first by arrival
  w = oldest_wait_ms_per_class(r, now + std::chrono::milliseconds(20));
  EXPECT_DOUBLE_EQ(w[0], 120);
  EXPECT_DOUBLE_EQ(w[1], 70);
  // Named, and read in one go: after a reload that reorders the classes, each figure stays with
  // its class (the engine pairs them with its class stats by name; it paired them by position
  // from two reads, which a reload between them could give another class's figures).
  r.set_classes({b, a});
  const std::vector<Router::ClassQueue> q = r.class_queues(now + std::chrono::milliseconds(20));
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].name, "b");
  EXPECT_EQ(q[0].queued, 1);
  EXPECT_DOUBLE_EQ(q[0].oldest_wait_ms, 70);
  EXPECT_EQ(q[1].name, "a");
  EXPECT_EQ(q[1].queued, 1);
  EXPECT_DOUBLE_EQ(q[1].oldest_wait_ms, 120);
}

TEST(Router, RemoveSeesOnlyTheTenantsOwnRequest) {
  SlaClass c;
  Router r({c}, nullptr);
  const auto far = Clock::now() + std::chrono::hours(1);
  auto a = make_seq("same", 0, 0, c, 0, far);
  a->ctl = std::make_shared<RequestControl>("same", "tenant-a");
  auto b = make_seq("same", 1, 0, c, 0, far);
  b->ctl = std::make_shared<RequestControl>("same", "tenant-b");
  ASSERT_TRUE(r.push(a).ok());
  ASSERT_TRUE(r.push(b).ok());
  EXPECT_EQ(r.remove({"", "same"}), nullptr);
  EXPECT_EQ(r.remove({"tenant-c", "same"}), nullptr);
  auto removed = r.remove({"tenant-b", "same"});
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->ctl->tenant, "tenant-b");
  EXPECT_EQ(r.remove({"tenant-b", "same"}), nullptr);
  EXPECT_EQ(r.num_queued(), 1);
  removed = r.remove({"tenant-a", "same"});
  ASSERT_NE(removed, nullptr);
  EXPECT_EQ(removed->arrival, 0);
}

TEST(Router, ConcurrentPushPopRemove) {
  SlaClass c;
  c.max_queue = 100000;
  Router r({c}, nullptr);
  const auto far = Clock::now() + std::chrono::hours(1);
  constexpr int kN = 4000;
  std::atomic<int> popped{0}, removed{0};
  std::thread pusher([&] {
    for (int i = 0; i < kN; ++i) {
      auto s = make_seq("r" + std::to_string(i), i, i % 3, c, 0, far);
      ASSERT_TRUE(r.push(s).ok());
    }
  });
  std::thread popper([&] {
    for (int i = 0; i < kN; ++i) {
      if (r.pop_if([](const Sequence&) { return true; })) popped.fetch_add(1);
    }
  });
  std::thread remover([&] {
    for (int i = 0; i < kN; i += 2) {
      if (r.remove({"", "r" + std::to_string(i)})) removed.fetch_add(1);
    }
  });
  pusher.join();
  popper.join();
  remover.join();
  EXPECT_EQ(popped.load() + removed.load() + static_cast<int>(r.take_all().size()), kN);
}

TEST(Admission, FindsSlaClasses) {
  std::vector<SlaClass> classes(2);
  classes[1].name = "x";
  EXPECT_EQ(find_sla_class(classes, ""), 0);
  EXPECT_EQ(find_sla_class(classes, "x"), 1);
  EXPECT_EQ(find_sla_class(classes, "y"), -1);
}

// A 100-token vocabulary, a context of 256 tokens, blocks of 16.
AdmissionLimits limits(int kv_blocks_per_worker) {
  AdmissionLimits lim;
  lim.vocab_size = 100;
  lim.max_context = 256;
  lim.block_size = 16;
  lim.kv_blocks_per_worker = kv_blocks_per_worker;
  return lim;
}

// The engine's own checks, for in-process callers (the gRPC server checks the same first):
// sampling fields against the vocabulary, and a priority bounded so that the class's plus the
// request's cannot overflow.
TEST(Admission, FieldsAreCheckedAgainstTheVocabularyAndPriorityBounds) {
  const AdmissionLimits lim = limits(/*kv_blocks_per_worker=*/64);
  Request r;
  r.sampling.max_tokens = 10;
  EXPECT_TRUE(check_admission(r, 5, lim).ok());
  Request top_k = r;
  top_k.sampling.top_k = 101;
  Status st = check_admission(top_k, 5, lim);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("top_k"), std::string::npos) << st.message();
  top_k.sampling.top_k = 100;
  EXPECT_TRUE(check_admission(top_k, 5, lim).ok());
  Request stop = r;
  stop.sampling.stop_token_ids = {100};
  EXPECT_EQ(check_admission(stop, 5, lim).code(), StatusCode::kInvalidArgument);
  for (const int32_t p : {1001, -1001, std::numeric_limits<int32_t>::max()}) {
    Request high = r;
    high.priority = p;
    st = check_admission(high, 5, lim);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << p;
    EXPECT_NE(st.message().find("priority: must be in [-1000, 1000]"), std::string::npos)
        << st.message();
  }
  Request edge = r;
  edge.priority = -1000;
  EXPECT_TRUE(check_admission(edge, 5, lim).ok());
}

// With a sliding window a sequence holds the window's pages and a chunk's at most: a request
// longer than the pool fits where those do, in either mode (prefill workers drop the pages behind
// the window too, and hand off only the others).
TEST(Admission, ASlidingWindowCountsThePagesHeldAtOnce) {
  AdmissionLimits lim = limits(/*kv_blocks_per_worker=*/8);
  Request r;
  r.sampling.max_tokens = 150;
  EXPECT_EQ(check_admission(r, 100, lim).code(), StatusCode::kResourceExhausted);  // 16 blocks
  lim.kv_window = 48;
  lim.chunk_tokens = 64;
  // Held at once: blocks_for(47 + 64) + 1 = 8.
  EXPECT_TRUE(check_admission(r, 100, lim).ok());
  lim.chunk_tokens = 66;  // blocks_for(47 + 66) + 1 = 9
  Status st = check_admission(r, 100, lim);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("need 9 KV blocks of 16 tokens at once (a sliding window of 48 keys "
                              "and a chunk of 66 tokens)"),
            std::string::npos)
      << st.message();
  lim.chunk_tokens = 64;
  r.sampling.max_tokens = 100;
  EXPECT_TRUE(check_admission(r, 150, lim).ok());  // 249 positions, 16 blocks: 8 at once
  // A short request needs what it needs, window or not.
  r.sampling.max_tokens = 10;
  lim.kv_blocks_per_worker = 2;
  EXPECT_TRUE(check_admission(r, 20, lim).ok());  // 29 positions: 2 blocks
}

TEST(Admission, FitCheckCarriesTheNumbers) {
  AdmissionLimits lim = limits(/*kv_blocks_per_worker=*/4);
  Request r;
  r.sampling.max_tokens = 10;
  // 10 generated tokens: the last is never fed, so prompt + 9 KV positions.
  EXPECT_TRUE(check_admission(r, 55, lim).ok());  // 64 positions = 4 blocks
  Status st = check_admission(r, 56, lim);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("= 65 positions need 5 KV blocks of 16 tokens"), std::string::npos)
      << st.message();
  lim.kv_blocks_per_worker = 1 << 20;
  EXPECT_TRUE(check_admission(r, 247, lim).ok());  // 256 positions: exactly the context
  st = check_admission(r, 248, lim);
  EXPECT_NE(st.message().find("- 1 = 257 positions exceeds the model context of 256"),
            std::string::npos)
      << st.message();
}

// A max_tokens the client did not set (the engine fits the default to the room the prompt leaves,
// at least 1) is not quoted as the client's: a prompt longer than the context is refused for its
// length ("max_tokens (1)" before), and the KV fit names the default as such.
TEST(Admission, ADefaultMaxTokensIsNotQuotedAsTheClients) {
  AdmissionLimits lim = limits(/*kv_blocks_per_worker=*/1 << 20);
  Request r;
  r.max_tokens_is_default = true;
  r.sampling.max_tokens = 1;
  EXPECT_TRUE(check_admission(r, 256, lim).ok());  // the whole context, one token generated
  Status st = check_admission(r, 300, lim);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "prompt (300 tokens) is longer than the model context of 256 tokens: no room to "
            "generate a token");
  lim.kv_blocks_per_worker = 4;
  r.sampling.max_tokens = 10;
  st = check_admission(r, 56, lim);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("prompt (56 tokens) + the default max_tokens (10; the request set "
                              "none) - 1 = 65 positions need 5 KV blocks"),
            std::string::npos)
      << st.message();
}

// llama2.c's tokenizer ends text at a NUL byte (run.c): a prompt holding one is refused rather
// than cut silently; a tokenizer that encodes NUL takes it.
TEST(Admission, APromptWithANulIsRefusedWhereTheTokenizerWouldCutIt) {
  KVSPLIT_REQUIRE_MODELS();
  auto bin = model::load_tokenizer(testing::model_path("tok512.bin"));
  ASSERT_TRUE(bin.ok());
  Request r;
  r.prompt = std::string("Once\0 upon", 10);
  auto ids = prompt_token_ids(r, **bin, 512);
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("prompt: a NUL byte at offset 4"), std::string::npos)
      << ids.status().message();
  auto hf = model::load_tokenizer(testing::model_path("stories260K-hf/tokenizer.json"));
  ASSERT_TRUE(hf.ok());
  EXPECT_TRUE(prompt_token_ids(r, **hf, 512).ok());
}

}  // namespace
}  // namespace kvsplit::sched
