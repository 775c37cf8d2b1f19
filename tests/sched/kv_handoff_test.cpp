#include "sched/kv_handoff.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "backend/backend.h"
#include "forwarding_backend.h"

namespace kvsplit::sched {
namespace {

struct Pools {
  std::unique_ptr<backend::Backend> be, be_b;  // be_b: the destination's backend when separate
  std::unique_ptr<kv::KvPool> a, b;
};

// Pool a on a CPU backend of virtual device 0; pool b on the same backend, or on a second one of
// device `device_b` (with direct reads refused when `no_peer`, as GPUs without peer access).
Pools make_pools(int blocks_a, int blocks_b, int head_dim_b = 8, int device_b = -1,
                 bool no_peer = false) {
  Pools p;
  auto be = backend::create_backend("cpu", 1);
  EXPECT_TRUE(be.ok());
  p.be = std::move(be).value();
  backend::Backend* dst = p.be.get();
  if (device_b >= 0) {
    backend::BackendOptions o;
    o.threads = 1;
    o.device = device_b;
    o.emulate_no_peer_access = no_peer;
    p.be_b = std::move(backend::create_backend("cpu", o).value());
    dst = p.be_b.get();
  }
  kv::KvPoolConfig ca{blocks_a, 4};
  kv::KvPoolConfig cb{blocks_b, 4};
  p.a = std::move(kv::KvPool::create(*p.be, ca, kv::KvShape{3, 2, 8}).value());
  p.b = std::move(kv::KvPool::create(*dst, cb, kv::KvShape{3, 2, head_dim_b}).value());
  return p;
}

TEST(KvHandoff, CopyRoutePlan) {
  EXPECT_EQ(plan_kv_copy(0, 0, false), KvCopyRoute::kSameDevice);
  EXPECT_EQ(plan_kv_copy(1, 1, true), KvCopyRoute::kSameDevice);
  EXPECT_EQ(plan_kv_copy(0, 1, true), KvCopyRoute::kPeer);
  EXPECT_EQ(plan_kv_copy(2, 0, false), KvCopyRoute::kStaged);
  EXPECT_STREQ(kv_copy_route_name(KvCopyRoute::kStaged), "staged through host");
}

// Every route copies every layer of the listed pages (runs of consecutive ids and scattered
// ones) and nothing else; the route taken is the planned one.
TEST(KvHandoff, CopiesEveryLayerOfTheListedPagesByEachRoute) {
  struct Case {
    int device_b;
    bool no_peer;
    KvCopyRoute want;
  };
  for (const Case& c : {Case{-1, false, KvCopyRoute::kSameDevice},
                        Case{1, false, KvCopyRoute::kPeer}, Case{1, true, KvCopyRoute::kStaged}}) {
    Pools p = make_pools(16, 16, 8, c.device_b, c.no_peer);
    const size_t block_bytes = p.a->bytes_per_block() / 3;
    std::mt19937 rng(7);
    for (int l = 0; l < 3; ++l) {
      auto* d = static_cast<float*>(p.a->layer(l).data);
      for (size_t i = 0; i < 16 * block_bytes / sizeof(float); ++i)
        d[i] = static_cast<float>(rng());
    }
    const std::vector<int32_t> src = {3, 4, 5, 9, 0};
    const std::vector<int32_t> dst = {10, 11, 2, 7, 15};
    auto route = copy_kv_blocks(*p.a, src, *p.b, dst);
    ASSERT_TRUE(route.ok()) << route.status().to_string();
    EXPECT_EQ(*route, c.want) << kv_copy_route_name(c.want);
    for (int l = 0; l < 3; ++l) {
      const auto* s = static_cast<const char*>(p.a->layer(l).data);
      const auto* d = static_cast<const char*>(p.b->layer(l).data);
      for (size_t i = 0; i < src.size(); ++i) {
        EXPECT_EQ(std::memcmp(s + src[i] * block_bytes, d + dst[i] * block_bytes, block_bytes), 0)
            << kv_copy_route_name(c.want) << " layer " << l << " block " << src[i];
      }
      // Pages not listed stay zero.
      std::vector<char> zero(block_bytes, 0);
      EXPECT_EQ(std::memcmp(d + 1 * block_bytes, zero.data(), block_bytes), 0);
    }
  }
}

// The staged route runs on the destination's thread: it reads the source (another worker's
// backend) through read_for_peer, never through the source's own copy_d2h / synchronize (which
// read and reset the CUDA backend's error flag, state of the source's thread).
TEST(KvHandoff, StagedCopiesReadTheSourceThroughReadForPeer) {
  struct Counting : testing::ForwardingBackend {
    using ForwardingBackend::ForwardingBackend;
    Status read_for_peer(void* d, const void* s, size_t n) override {
      ++peer_reads;
      return ForwardingBackend::read_for_peer(d, s, n);
    }
    Status copy_d2h(void* d, const void* s, size_t n) override {
      ++own_calls;
      return ForwardingBackend::copy_d2h(d, s, n);
    }
    Status synchronize() override {
      ++own_calls;
      return ForwardingBackend::synchronize();
    }
    int peer_reads = 0, own_calls = 0;
  };
  auto cpu = backend::create_backend("cpu", 1);
  ASSERT_TRUE(cpu.ok());
  Counting src_be(std::move(cpu).value());
  backend::BackendOptions o;
  o.threads = 1;
  o.device = 1;
  o.emulate_no_peer_access = true;
  auto dst_be = backend::create_backend("cpu", o);
  ASSERT_TRUE(dst_be.ok());
  auto a = kv::KvPool::create(src_be, kv::KvPoolConfig{8, 4}, kv::KvShape{2, 2, 8});
  auto b = kv::KvPool::create(**dst_be, kv::KvPoolConfig{8, 4}, kv::KvShape{2, 2, 8});
  ASSERT_TRUE(a.ok() && b.ok());
  auto* d0 = static_cast<float*>((*a)->layer(0).data);
  d0[0] = 42.f;
  src_be.peer_reads = src_be.own_calls = 0;
  const std::vector<int32_t> blocks = {0, 1};
  auto route = copy_kv_blocks(**a, blocks, **b, blocks);
  ASSERT_TRUE(route.ok()) << route.status().to_string();
  EXPECT_EQ(*route, KvCopyRoute::kStaged);
  EXPECT_EQ(src_be.peer_reads, 2);  // one run of two blocks per layer
  EXPECT_EQ(src_be.own_calls, 0);
  EXPECT_EQ(static_cast<const float*>((*b)->layer(0).data)[0], 42.f);
}

TEST(KvHandoff, MismatchesAreErrors) {
  Pools p = make_pools(8, 8, /*head_dim_b=*/16);
  const std::vector<int32_t> one = {1};
  EXPECT_EQ(copy_kv_blocks(*p.a, one, *p.b, one).status().code(), StatusCode::kInvalidArgument);
  Pools q = make_pools(8, 8);
  const std::vector<int32_t> two = {1, 2};
  EXPECT_EQ(copy_kv_blocks(*q.a, one, *q.b, two).status().code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad = {8};
  EXPECT_EQ(copy_kv_blocks(*q.a, bad, *q.b, one).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(copy_kv_blocks(*q.a, {}, *q.b, {}).ok());
}

// Exactly one side wins a ticket: the destination receiving it or the source taking it back,
// however the two race; the winner (only) sees the Sequence the source put in.
// Pages are demoted only where sequences decode: a table with a quantized or evicted page must
// never be handed off as if its block ids named full-precision pages.
TEST(KvHandoff, OnlyFullPrecisionTablesAreHandedOff) {
  kv::BlockTable table;
  table.blocks = {3, 4, 5};
  EXPECT_TRUE(check_handoff_table(table).ok());  // no page entries: all full
  table.pages.resize(3);
  EXPECT_TRUE(check_handoff_table(table).ok());  // entries, all full and resident
  table.pages[1].precision = kernels::KvPrecision::kInt8;
  Status st = check_handoff_table(table);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("page 1 of 3"), std::string::npos) << st.message();
  table.pages[1] = kv::PageEntry{};
  table.pages[2].location = kv::PageLocation::kEvicted;
  table.pages[2].precision = kernels::KvPrecision::kEvicted;
  EXPECT_EQ(check_handoff_table(table).code(), StatusCode::kInternal);
  table.pages.resize(2);  // entries that do not match the blocks
  EXPECT_EQ(check_handoff_table(table).code(), StatusCode::kInternal);
}

// A sliding window: the pages dropped behind it (block -1, entry evicted) are not handed off, so
// they are neither checked nor copied; the pages after them are copied to the destination table
// that marks the same prefix dropped.
TEST(KvHandoff, PagesDroppedBehindTheWindowOrCachedAreNotCopied) {
  kv::BlockTable src;
  src.blocks = {-1, -1, 6, 2};
  src.pages.resize(4);
  for (int i = 0; i < 2; ++i) {
    src.pages[i].location = kv::PageLocation::kEvicted;
    src.pages[i].precision = kernels::KvPrecision::kEvicted;
  }
  EXPECT_EQ(check_handoff_table(src).code(), StatusCode::kInternal);  // not marked dropped
  src.window_dropped = 2;
  EXPECT_TRUE(check_handoff_table(src).ok());
  src.window_dropped = 1;  // an evicted page after the dropped prefix is still refused
  EXPECT_EQ(check_handoff_table(src).code(), StatusCode::kInternal);
  src.window_dropped = 2;

  Pools p = make_pools(8, 8);
  const size_t block_bytes = p.a->bytes_per_block() / 3;
  for (int l = 0; l < 3; ++l) {
    auto* d = static_cast<unsigned char*>(p.a->layer(l).data);
    for (size_t i = 0; i < 8 * block_bytes; ++i) d[i] = static_cast<unsigned char>(i * 7 + l + 1);
  }
  kv::BlockTable dst = src;
  dst.blocks = {-1, -1, 0, 5};
  auto route = copy_kv_pages(*p.a, src.blocks, {}, *p.b, dst);
  ASSERT_TRUE(route.ok()) << route.status().to_string();
  const std::vector<char> zero(block_bytes, 0);
  for (int l = 0; l < 3; ++l) {
    const auto* s = static_cast<const char*>(p.a->layer(l).data);
    const auto* d = static_cast<const char*>(p.b->layer(l).data);
    EXPECT_EQ(std::memcmp(s + 6 * block_bytes, d + 0 * block_bytes, block_bytes), 0) << l;
    EXPECT_EQ(std::memcmp(s + 2 * block_bytes, d + 5 * block_bytes, block_bytes), 0) << l;
    for (int b : {1, 2, 3, 4, 6, 7})
      EXPECT_EQ(std::memcmp(d + b * block_bytes, zero.data(), block_bytes), 0) << l << " " << b;
  }
  // Without the dropped prefix marked on the destination, block -1 is refused, not copied.
  dst.window_dropped = 0;
  EXPECT_EQ(copy_kv_pages(*p.a, src.blocks, {}, *p.b, dst).status().code(),
            StatusCode::kInvalidArgument);
  // Pages the destination's prefix cache served (first_page) are not copied either: pages 0-2
  // (blocks 3, 4 and 0) keep what they hold, page 3 is copied.
  Pools q = make_pools(8, 8);
  for (int l = 0; l < 3; ++l) {
    auto* d = static_cast<unsigned char*>(q.a->layer(l).data);
    for (size_t i = 0; i < 8 * block_bytes; ++i) d[i] = static_cast<unsigned char>(i * 5 + l + 2);
  }
  dst.blocks = {3, 4, 0, 5};
  const std::vector<int32_t> from = {7, 1, 6, 2};
  ASSERT_TRUE(copy_kv_pages(*q.a, from, {}, *q.b, dst, /*first_page=*/3).ok());
  for (int l = 0; l < 3; ++l) {
    const auto* s = static_cast<const char*>(q.a->layer(l).data);
    const auto* d = static_cast<const char*>(q.b->layer(l).data);
    EXPECT_EQ(std::memcmp(s + 2 * block_bytes, d + 5 * block_bytes, block_bytes), 0) << l;
    for (int b : {0, 1, 2, 3, 4, 6, 7})
      EXPECT_EQ(std::memcmp(d + b * block_bytes, zero.data(), block_bytes), 0) << l << " " << b;
  }
  EXPECT_EQ(copy_kv_pages(*q.a, from, {}, *q.b, dst, 5).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(KvHandoff, TicketHasExactlyOneOwner) {
  constexpr int kTickets = 2000;
  std::vector<std::shared_ptr<HandoffTicket>> tickets(kTickets);
  for (int i = 0; i < kTickets; ++i) {
    tickets[i] = std::make_shared<HandoffTicket>();
    tickets[i]->seq = std::make_unique<Sequence>();
    tickets[i]->seq->arrival = i;
  }
  std::vector<int> received(kTickets, 0), reclaimed(kTickets, 0);
  std::atomic<bool> go{false};
  auto racer = [&](bool receive, std::vector<int>& won) {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < kTickets; ++i) {
      HandoffTicket& t = *tickets[receive ? i : kTickets - 1 - i];
      if (receive ? t.receive() : t.reclaim()) {
        std::unique_ptr<Sequence> seq = std::move(t.seq);
        won[seq->arrival] = 1;
      }
    }
  };
  std::thread dst(racer, true, std::ref(received));
  std::thread src(racer, false, std::ref(reclaimed));
  go.store(true);
  dst.join();
  src.join();
  // (How the tickets split between the two depends on scheduling; each has exactly one owner.)
  for (int i = 0; i < kTickets; ++i) {
    EXPECT_EQ(received[i] + reclaimed[i], 1) << i;
    EXPECT_EQ(tickets[i]->state.load(),
              received[i] ? HandoffTicket::kReceived : HandoffTicket::kReclaimed);
  }
  // A settled ticket cannot be claimed again by either side.
  EXPECT_FALSE(tickets[0]->receive());
  EXPECT_FALSE(tickets[0]->reclaim());
}

}  // namespace
}  // namespace kvsplit::sched
