// Tenants and request ids: ids are scoped per tenant (cancel and the duplicate check see only the
// caller's requests), engine-assigned ids are random; user strings echoed in errors are escaped;
// end_drain() cuts a shutdown's drain short. Requests are kept in flight by holding the worker
// (no forward pass), so nothing here depends on how fast the machine runs.
#include <gtest/gtest.h>

#include <bitset>
#include <chrono>
#include <future>
#include <set>

#include "engine/engine_impl.h"
#include "engine/engine_test_util.h"

namespace kvsplit {
namespace {

using testing::collect;
using testing::Collected;

Request long_request(const std::string& tenant, const std::string& id, int max_tokens = 12) {
  Request r;
  r.tenant = tenant;
  r.request_id = id;
  r.prompt = "Once upon a time";
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

std::unique_ptr<EngineImpl> held_engine() {
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  auto engine = EngineImpl::create(cfg);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  if (!engine.ok()) return nullptr;
  (*engine)->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  return std::move(engine).value();
}

TEST(EngineIsolation, RequestIdsAreScopedPerTenant) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  const std::vector<int> initial = testing::free_blocks(*e);
  auto a = e->submit(long_request("tenant-a", "shared-id"));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  // The same id in another tenant is a different request, not a duplicate.
  auto b = e->submit(long_request("tenant-b", "shared-id"));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  // Within one tenant it is still a duplicate.
  auto dup = e->submit(long_request("tenant-a", "shared-id"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);

  // Neither a third tenant nor the default (empty) one can reach them.
  EXPECT_FALSE(e->cancel("tenant-c", "shared-id"));
  EXPECT_FALSE(e->cancel("", "shared-id"));
  // Tenant b cancels its own request only.
  EXPECT_TRUE(e->cancel("tenant-b", "shared-id"));
  Collected cb = collect(*b, std::chrono::seconds(30));
  ASSERT_FALSE(cb.timed_out);
  EXPECT_EQ(cb.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_FALSE(e->cancel("tenant-b", "shared-id"));  // gone now

  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected ca = collect(*a, std::chrono::seconds(60));
  ASSERT_FALSE(ca.timed_out);
  EXPECT_EQ(ca.final_event.finish_reason, FinishReason::kLength);
  EXPECT_EQ(ca.tokens.size(), 12u);
  EXPECT_TRUE(testing::pools_back_to(*e, initial));
  const EngineStats s = e->stats();
  EXPECT_EQ(s.requests_cancelled, 1);
  EXPECT_EQ(s.requests_finished, 1);
}

// A cancel by handle reaches only the request that handle was returned for: once it has ended,
// a new request of the same tenant may reuse its id, and a late cancel from the first stream's
// consumer (the gRPC reactor's, when its client goes away after the final event was queued)
// leaves the new one alone.
TEST(EngineIsolation, CancelByHandleNeverReachesALaterRequestWithItsId) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  const std::vector<int> initial = testing::free_blocks(*e);
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  auto first = e->submit(long_request("a", "x", 2));
  ASSERT_TRUE(first.ok());
  RequestHandle first_handle = *first;
  Collected c1 = collect(*first, std::chrono::seconds(60));
  ASSERT_FALSE(c1.timed_out);
  EXPECT_EQ(c1.final_event.finish_reason, FinishReason::kLength);
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto second = e->submit(long_request("a", "x"));  // the id is free again
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_FALSE(e->cancel("a", first_handle));  // the first request's handle: not this one
  EXPECT_FALSE(e->cancel("b", *second));       // another tenant, even with the handle
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected c2 = collect(*second, std::chrono::seconds(60));
  ASSERT_FALSE(c2.timed_out);
  EXPECT_EQ(c2.final_event.finish_reason, FinishReason::kLength);
  EXPECT_EQ(c2.tokens.size(), 12u);
  // Its own handle cancels a request in flight.
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto third = e->submit(long_request("a", "x"));
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(e->cancel("a", *third));
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected c3 = collect(*third, std::chrono::seconds(60));
  ASSERT_FALSE(c3.timed_out);
  EXPECT_EQ(c3.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(testing::pools_back_to(*e, initial));
}

// A retry may take the id of a cancelled request still ending on its worker. That one's final
// event, when it comes, leaves the retry's entry alone: the retry is still in flight under the id
// (a duplicate is refused) and can be cancelled.
TEST(EngineIsolation, ACancelledRequestEndingLateLeavesItsRetryAlone) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  auto first = e->submit(long_request("a", "x"));
  ASSERT_TRUE(first.ok());
  // On the worker (out of the router), which then does nothing at all until the retry is in.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (e->send_command(0, sched::SnapshotState{}).get().state.sequences.empty() &&
         std::chrono::steady_clock::now() < deadline) {
  }
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kAll);
  EXPECT_TRUE(e->cancel("a", "x"));
  auto retry = e->submit(long_request("a", "x"));
  ASSERT_TRUE(retry.ok()) << retry.status().to_string();
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);  // the cancel ends it
  Collected c1 = collect(*first, std::chrono::seconds(60));
  ASSERT_FALSE(c1.timed_out);
  EXPECT_EQ(c1.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(e->submit(long_request("a", "x")).status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(e->cancel("a", "x"));
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  Collected c2 = collect(*retry, std::chrono::seconds(60));
  ASSERT_FALSE(c2.timed_out);
  EXPECT_EQ(c2.final_event.finish_reason, FinishReason::kCancelled);
}

TEST(EngineIsolation, QueuedRequestOfAnotherTenantIsNotRemoved) {
  KVSPLIT_REQUIRE_MODELS();
  EngineConfig cfg = testing::stories_config(ServingMode::kColocated);
  cfg.max_num_seqs = 1;  // the second request waits in the router queue
  auto engine = EngineImpl::create(cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  EngineImpl& e = **engine;
  const std::vector<int> initial = testing::free_blocks(e);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kForward);
  auto first = e.submit(long_request("a", "first"));
  ASSERT_TRUE(first.ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (e.stats().pools[0].running + e.stats().pools[0].waiting < 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto queued = e.submit(long_request("a", "queued"));
  ASSERT_TRUE(queued.ok());
  EXPECT_FALSE(e.cancel("b", "queued"));
  EXPECT_EQ(e.stats().classes[0].queued, 1);  // still in the router queue
  // The KVM's queue_wait_ms: the queued request's wait grows while it stays queued.
  const double wait0 = e.stats().classes[0].oldest_queued_ms;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double wait1 = e.stats().classes[0].oldest_queued_ms;
  EXPECT_GT(wait0, 0);
  EXPECT_GE(wait1, wait0 + 19);
  e.set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  for (auto* h : {&first, &queued}) {
    Collected c = collect(**h, std::chrono::seconds(60));
    ASSERT_FALSE(c.timed_out);
    EXPECT_EQ(c.final_event.finish_reason, FinishReason::kLength);
    EXPECT_EQ(c.tokens.size(), 12u);
  }
  EXPECT_TRUE(testing::pools_back_to(e, initial));
}

TEST(EngineIsolation, AssignedIdsAreRandom) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  const std::vector<int> initial = testing::free_blocks(*e);
  std::vector<RequestHandle> handles;
  std::set<std::string> ids;
  std::bitset<128> seen_one, seen_zero;
  for (int i = 0; i < 64; ++i) {
    auto h = e->submit(long_request("t", "", 1));
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    const std::string& id = h->request_id();
    ASSERT_EQ(id.size(), 4u + 32u) << id;
    ASSERT_EQ(id.rfind("req-", 0), 0u) << id;
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
    EXPECT_TRUE(ids.insert(id).second) << "duplicate " << id;
    for (int k = 0; k < 32; ++k) {
      const int nibble = std::stoi(id.substr(4 + k, 1), nullptr, 16);
      for (int bit = 0; bit < 4; ++bit) {
        ((nibble >> bit) & 1 ? seen_one : seen_zero).set(4 * k + bit);
      }
    }
    handles.push_back(*h);
  }
  // A counter (or any low-entropy scheme) leaves most bits constant over 64 ids; 128 random bits
  // leave one constant with probability 128 * 2^-63.
  EXPECT_TRUE(seen_one.all() && seen_zero.all())
      << "bits never 1: " << (~seen_one).count() << ", never 0: " << (~seen_zero).count();
  e->set_test_hold(sched::WorkerRole::kColocated, sched::TestHold::kNone);
  for (RequestHandle& h : handles) EXPECT_EQ(collect(h).finals, 1);
  EXPECT_TRUE(testing::pools_back_to(*e, initial));
}

TEST(EngineIsolation, UserStringsInErrorsAreEscaped) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  Request r = long_request("t", "id-1");
  r.sla_class = std::string("gold\0\x1b[31mred\xff", 14);
  auto h = e->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = h.status().message();
  EXPECT_NE(m.find("unknown class 'gold\\x00\\x1b[31mred\\xff'"), std::string::npos) << m;
  EXPECT_EQ(m.find('\x1b'), std::string::npos);
  EXPECT_EQ(m.find('\0'), std::string::npos);

  r.sla_class = std::string(1000, 'g');
  h = e->submit(r);
  ASSERT_FALSE(h.ok());
  EXPECT_LT(h.status().message().size(), 200u) << h.status().message();
  EXPECT_NE(h.status().message().find("(1000 bytes)"), std::string::npos);

  Request odd = long_request("t", std::string("id\x1b]0;x\a", 8));
  auto first = e->submit(odd);
  ASSERT_TRUE(first.ok());
  auto again = e->submit(odd);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("'id\\x1b]0;x\\x07'"), std::string::npos)
      << again.status().message();
  EXPECT_TRUE(e->cancel("t", odd.request_id));
  EXPECT_EQ(collect(*first).final_event.finish_reason, FinishReason::kCancelled);
}

TEST(EngineIsolation, EndDrainCutsShutdownShort) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  auto h = e->submit(long_request("t", "never-finishes"));
  ASSERT_TRUE(h.ok());
  const auto start = std::chrono::steady_clock::now();
  auto done = std::async(std::launch::async, [&] { e->shutdown(std::chrono::minutes(10)); });
  // The drain waits: the held request cannot finish.
  EXPECT_EQ(done.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  e->end_drain();
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  Collected c = collect(*h, std::chrono::seconds(10));
  ASSERT_FALSE(c.timed_out);
  EXPECT_EQ(c.final_event.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(c.final_event.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(e->stats().requests_cancelled, 1);
}

TEST(EngineIsolation, EndDrainBeforeShutdownSkipsTheWait) {
  KVSPLIT_REQUIRE_MODELS();
  std::unique_ptr<EngineImpl> e = held_engine();
  ASSERT_NE(e, nullptr);
  auto h = e->submit(long_request("t", "x"));
  ASSERT_TRUE(h.ok());
  e->end_drain();
  const auto start = std::chrono::steady_clock::now();
  e->shutdown(std::chrono::minutes(10));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(collect(*h, std::chrono::seconds(10)).final_event.status.code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvsplit
