// DiskTier: round trips, checksums, capacity, faults and their causes, errors for bad paths.
// Every test runs with both I/O backends (io_uring skips where it cannot run), buffered and with
// O_DIRECT (kv.disk.direct_io).
#include "kv/disk_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kv/disk_format.h"
#include "test_util.h"

namespace kvsplit::kv {
namespace {

using Bytes = std::vector<std::byte>;

Bytes random_bytes(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto& x : b) x = static_cast<std::byte>(rng());
  return b;
}

std::vector<std::span<const std::byte>> cspans(const std::vector<Bytes>& v) {
  return {v.begin(), v.end()};
}
std::vector<std::span<std::byte>> spans(std::vector<Bytes>& v) { return {v.begin(), v.end()}; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Overwrites one byte of `path` at `offset` (behind the tier's back).
void flip_byte(const std::string& path, size_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

class DiskTierTest : public ::testing::TestWithParam<std::tuple<IoBackend, bool>> {
 protected:
  void SetUp() override {
    if (backend() == IoBackend::kUring && !BlockIo::create(IoOptions{IoBackend::kUring}).ok())
      GTEST_SKIP() << "io_uring unavailable here";
    if (direct()) {
      // The fixture's directory must take O_DIRECT, or the direct runs would test nothing new.
      auto probe = DiskTier::open(config(1));
      ASSERT_TRUE(probe.ok()) << probe.status().to_string();
      if (!probe.value()->stats().direct_io)
        GTEST_SKIP() << "the file system under " << dir_.path() << " refuses O_DIRECT";
    }
  }
  IoBackend backend() const { return std::get<0>(GetParam()); }
  bool direct() const { return std::get<1>(GetParam()); }
  DiskTierConfig config(int64_t extents, int64_t extent_bytes = 64 << 10) const {
    DiskTierConfig c;
    c.path = (dir_.path() / "tier").string();
    c.capacity_bytes = extents * extent_bytes;
    c.extent_bytes = extent_bytes;
    c.io.backend = backend();
    c.direct_io = direct();
    return c;
  }
  std::unique_ptr<DiskTier> open_tier(int64_t extents, int64_t extent_bytes = 64 << 10) {
    StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::open(config(extents, extent_bytes));
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  testing::TempDir dir_;
};

// The latency average fades over idle time: after seconds without an operation the next one
// starts it afresh (a slow disk's old 50 ms came back with the first 1 ms read: 40.2 ms).
TEST(DiskLatency, TheOldAverageFadesOverIdleTime) {
  EXPECT_DOUBLE_EQ(next_latency_ewma(0, 7, 0, /*first=*/true), 7);
  EXPECT_NEAR(next_latency_ewma(50, 1, 0, false), 40.2, 1e-9);    // back to back: weight 0.8
  EXPECT_NEAR(next_latency_ewma(50, 1, 0.01, false), 39.8, 0.1);  // under load: about the same
  EXPECT_LT(next_latency_ewma(50, 1, 5, false), 1.3);             // after 5 s idle: the new op
  EXPECT_DOUBLE_EQ(next_latency_ewma(50, 1, -1, false), 40.2);    // a clock step back: no gain
}

TEST_P(DiskTierTest, MultiPageRecordsRoundTrip) {
  auto tier = open_tier(64);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->io_backend(), backend());
  EXPECT_EQ(tier->stats().direct_io, direct());
  // Record A: 5 pages of 37 KiB from separate buffers (a page is every layer of one block).
  std::vector<Bytes> pages;
  for (int i = 0; i < 5; ++i) pages.push_back(random_bytes(37 << 10, 100 + i));
  const RecordKey ka{7, 1001};
  StatusOr<RecordId> a = tier->write_sync(cspans(pages), ka);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  // Record B: one 300 KiB page, written while A is stored.
  std::vector<Bytes> big{random_bytes(300 << 10, 9)};
  StatusOr<RecordId> b = tier->write_sync(cspans(big), RecordKey{7, 1002});
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a.value(), b.value());
  EXPECT_EQ(tier->payload_bytes(a.value()).value(), 5 * (37 << 10));

  // Read A back into differently cut buffers: the layout is the caller's, not the tier's.
  std::vector<Bytes> back{Bytes(1000), Bytes(5 * (37 << 10) - 1000)};
  ASSERT_TRUE(tier->read_sync(a.value(), spans(back), ka).ok());
  Bytes joined;
  for (auto& p : pages) joined.insert(joined.end(), p.begin(), p.end());
  Bytes got = back[0];
  got.insert(got.end(), back[1].begin(), back[1].end());
  EXPECT_EQ(got, joined);
  std::vector<Bytes> back_b{Bytes(300 << 10)};
  ASSERT_TRUE(tier->read_sync(b.value(), spans(back_b), RecordKey{7, 1002}).ok());
  EXPECT_EQ(back_b[0], big[0]);

  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.writes, 2);
  EXPECT_EQ(s.reads, 2);
  EXPECT_EQ(s.bytes_written, 5 * (37 << 10) + (300 << 10));
  EXPECT_EQ(s.records, 2);
  EXPECT_EQ(s.extents_used, 3 + 5);  // ceil(189440 / 64 KiB), ceil(300 KiB / 64 KiB)
  ASSERT_TRUE(tier->free(a.value()).ok());
  ASSERT_TRUE(tier->free(b.value()).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
  EXPECT_EQ(tier->stats().records, 0);
}

TEST_P(DiskTierTest, LargeRecordOverFragmentedExtentsRoundTrips) {
  auto tier = open_tier(30, 1 << 20);
  ASSERT_TRUE(tier);
  // Fill, then free every other small record so the 15 free extents are scattered.
  std::vector<RecordId> small;
  Bytes one(100 << 10, std::byte{1});
  const std::span<const std::byte> one_span(one);
  for (int i = 0; i < 30; ++i) small.push_back(tier->write_sync({&one_span, 1}, {}).value());
  for (int i = 0; i < 30; i += 2) ASSERT_TRUE(tier->free(small[i]).ok());
  // 20 MiB does not fit in 15 extents.
  std::vector<Bytes> rec{random_bytes((20 << 20) - 4096, 42)};
  ASSERT_EQ(tier->write_sync(cspans(rec), {1, 2}).status().code(), StatusCode::kResourceExhausted);
  rec[0].resize((9 << 20) - 4096);  // 9 scattered extents, 9 requests
  StatusOr<RecordId> id = tier->write_sync(cspans(rec), {1, 2});
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  std::vector<Bytes> back{Bytes(rec[0].size())};
  ASSERT_TRUE(tier->read_sync(id.value(), spans(back), {1, 2}).ok());
  EXPECT_EQ(back[0], rec[0]);
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kCapacity), 1);
}

TEST_P(DiskTierTest, ChecksumMismatchAfterAByteFlipsOnDisk) {
  auto tier = open_tier(16);
  ASSERT_TRUE(tier);
  std::string marker = "page-payload-marker-0123456789";
  Bytes payload(50000, std::byte{0});
  std::memcpy(payload.data() + 20000, marker.data(), marker.size());
  const std::span<const std::byte> src(payload);
  RecordId id = tier->write_sync({&src, 1}, {3, 4}).value();
  const std::string disk = read_file(tier->records_path());
  const size_t at = disk.find(marker);
  ASSERT_NE(at, std::string::npos);
  flip_byte(tier->records_path(), at + 3);

  Bytes back(payload.size());
  const std::span<std::byte> dst(back);
  const Status s = tier->read_sync(id, {&dst, 1}, {3, 4});
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.message();
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kChecksum), 1);
  EXPECT_EQ(tier->stats().reads, 0);
  ASSERT_TRUE(tier->free(id).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
}

// Whether preadv2(RWF_NOWAIT) works on the file at `path` (EOPNOTSUPP: a file system without it).
bool nowait_reads_work(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  char c;
  iovec v{&c, 1};
  const bool ok = ::preadv2(fd, &v, 1, 0, RWF_NOWAIT) >= 0 || errno != EOPNOTSUPP;
  ::close(fd);
  return ok;
}

TEST_P(DiskTierTest, SmallCachedReadsAreServedInlineAndStillChecked) {
  auto tier = open_tier(16);
  ASSERT_TRUE(tier);
  const bool inline_reads = !direct() && nowait_reads_work(tier->records_path());
  // A small record (below kInlineReadBytes) and a large one, both in the page cache when
  // buffered (just written).
  std::vector<Bytes> small{random_bytes(20000, 1), random_bytes(30000, 2)};
  std::vector<Bytes> large{random_bytes(DiskTier::kInlineReadBytes + 4096, 3)};
  const RecordId s_id = tier->write_sync(cspans(small), {5, 1}).value();
  const RecordId l_id = tier->write_sync(cspans(large), {5, 2}).value();
  std::vector<Bytes> back{Bytes(50000)};
  ASSERT_TRUE(tier->read_sync(s_id, spans(back), {5, 1}).ok());
  Bytes joined = small[0];
  joined.insert(joined.end(), small[1].begin(), small[1].end());
  EXPECT_EQ(back[0], joined);
  EXPECT_EQ(tier->stats().read_requests_inline, inline_reads ? 1 : 0);
  std::vector<Bytes> back_l{Bytes(large[0].size())};
  ASSERT_TRUE(tier->read_sync(l_id, spans(back_l), {5, 2}).ok());
  EXPECT_EQ(back_l[0], large[0]);
  EXPECT_EQ(tier->stats().read_requests_inline, inline_reads ? 1 : 0);  // large: asynchronous

  // A byte flipped behind the tier's back: the inline read is checked like any other.
  const std::string disk = read_file(tier->records_path());
  const std::string tail(reinterpret_cast<const char*>(small[1].data()) + 100, 64);
  const size_t at = disk.find(tail);
  ASSERT_NE(at, std::string::npos);
  flip_byte(tier->records_path(), at + 7);
  const Status bad = tier->read_sync(s_id, spans(back), {5, 1});
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss) << bad.to_string();
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kChecksum), 1);
  EXPECT_EQ(tier->stats().read_requests_inline, inline_reads ? 2 : 0);
  EXPECT_EQ(tier->stats().reads, 2);
  ASSERT_TRUE(tier->free(s_id).ok());
  ASSERT_TRUE(tier->free(l_id).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
}

// The fast path of small reads (DiskTier::read_cached) holds the record like any read until the
// op is finished, and a read the page cache cannot serve (dropped: on a file system that can drop
// it) takes the asynchronous way with the same bytes and checks.
TEST_P(DiskTierTest, SmallReadsHoldTheRecordAndMissTheCacheSafely) {
  auto tier = open_tier(16);
  ASSERT_TRUE(tier);
  const Bytes page = random_bytes(6000, 11);
  const std::span<const std::byte> src(page);
  const RecordId id = tier->write_sync({&src, 1}, {8, 1}).value();
  Bytes back(page.size());
  const std::span<std::byte> dst(back);
  DiskOp op = tier->read(id, {&dst, 1}, {8, 1}).value();
  EXPECT_EQ(tier->free(id).code(), StatusCode::kFailedPrecondition);  // held until finished
  ASSERT_TRUE(tier->poll(op).value_or(ok_status()).ok());
  if (!op.finished()) {
    ASSERT_TRUE(tier->wait(op).ok());
  }
  EXPECT_EQ(back, page);
  EXPECT_EQ(tier->stats().reads, 1);
  EXPECT_EQ(tier->stats().bytes_read, 6000);
  EXPECT_GT(tier->stats().latency_ms_ewma, 0.0);
  tier->drop_cache();
  std::fill(back.begin(), back.end(), std::byte{0});
  ASSERT_TRUE(tier->read_sync(id, {&dst, 1}, {8, 1}).ok());
  EXPECT_EQ(back, page);
  EXPECT_EQ(tier->stats().reads, 2);
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kChecksum), 0);
  ASSERT_TRUE(tier->free(id).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
}

// Records carry no header on disk (format 2): their checksum's seed (key, record id, this open's
// nonce, length) binds their bytes to the record. Another record's bytes at its place fail the
// check, though they are a valid record's; a read with another key is refused before any I/O.
TEST_P(DiskTierTest, AnotherRecordsBytesAtItsPlaceFailTheCheck) {
  auto tier = open_tier(16);
  ASSERT_TRUE(tier);
  const Bytes a = random_bytes(10000, 5), b = random_bytes(10000, 6);
  const std::span<const std::byte> sa(a), sb(b);
  const RecordId ia = tier->write_sync({&sa, 1}, {3, 4}).value();
  const RecordId ib = tier->write_sync({&sb, 1}, {3, 5}).value();
  const std::string disk = read_file(tier->records_path());
  const size_t at = disk.find(std::string(reinterpret_cast<const char*>(a.data()), a.size()));
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(at % 4096, 0u);  // the payload starts its extent
  {
    const int fd = ::open(tier->records_path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, b.data(), b.size(), static_cast<off_t>(at)),
              static_cast<ssize_t>(b.size()));
    ::close(fd);
  }
  Bytes back(a.size());
  const std::span<std::byte> dst(back);
  DiskOp op = tier->read(ia, {&dst, 1}, {3, 4}).value();
  const Status s = tier->wait(op);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.to_string();
  EXPECT_EQ(op.fault(), DiskFault::kChecksum);
  EXPECT_EQ(tier->read_sync(ia, {&dst, 1}, {3, 5}).code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(tier->read_sync(ib, {&dst, 1}, {3, 5}).ok());  // b's bytes verify as b only
  EXPECT_EQ(back, b);
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kChecksum), 1);
}

// A record's pieces (one per run of extents) are hashed by the thread that reads them, as they
// land, and only where that is not possible (a piece split over several requests past IOV_MAX
// buffers, an injected corruption) by the reader; either way a changed byte is caught.
TEST_P(DiskTierTest, ReadsAreCheckedAsTheyLandOrByTheReader) {
  auto tier = open_tier(6);  // extents of 64 KiB
  ASSERT_TRUE(tier);
  // Two pieces: extents 0-1 and 3-4 are the free ones, between records that stay, so the
  // 4-extent record below lands on the runs {0, 1} and {3, 4}.
  const Bytes filler(60000, std::byte{9});
  const std::span<const std::byte> sf(filler);
  std::vector<RecordId> fill;
  for (int i = 0; i < 6; ++i) fill.push_back(tier->write_sync({&sf, 1}, {}).value());
  ASSERT_TRUE(tier->free(fill[0]).ok());
  ASSERT_TRUE(tier->free(fill[1]).ok());
  ASSERT_TRUE(tier->free(fill[3]).ok());
  ASSERT_TRUE(tier->free(fill[4]).ok());
  const Bytes rec = random_bytes(200000, 11);
  // Written from 2000 segments: the first piece's 131072 bytes take more than IOV_MAX of them,
  // so its write is two requests (the checksum does not depend on how the bytes are cut).
  std::vector<std::span<const std::byte>> in;
  for (size_t off = 0; off < rec.size(); off += 100) in.emplace_back(rec.data() + off, 100);
  ASSERT_GT(131072 / 100, IOV_MAX);
  const RecordId id = tier->write_sync(in, {8, 8}).value();
  EXPECT_EQ(tier->stats().extents_used, 2 + 4);

  Bytes back(rec.size());
  const std::span<std::byte> whole(back);
  DiskTierStats before = tier->stats();
  ASSERT_TRUE(tier->read_sync(id, {&whole, 1}, {8, 8}).ok());
  EXPECT_EQ(back, rec);
  EXPECT_EQ(tier->stats().read_pieces_digested - before.read_pieces_digested, 2);
  EXPECT_EQ(tier->stats().read_pieces_hashed - before.read_pieces_hashed, 0);

  // Read into 2000 buffers of 100 bytes: the first piece is two requests, hashed by the reader
  // (with O_DIRECT every piece lands in the one bounce buffer, one request each).
  std::vector<std::span<std::byte>> many;
  for (size_t off = 0; off < back.size(); off += 100) many.emplace_back(back.data() + off, 100);
  std::fill(back.begin(), back.end(), std::byte{0});
  before = tier->stats();
  ASSERT_TRUE(tier->read_sync(id, many, {8, 8}).ok());
  EXPECT_EQ(back, rec);
  EXPECT_EQ(tier->stats().read_pieces_hashed - before.read_pieces_hashed, direct() ? 0 : 1);
  EXPECT_EQ(tier->stats().read_pieces_digested - before.read_pieces_digested, direct() ? 2 : 1);

  // A byte flipped in the second piece: caught from the backend's digest and by the reader.
  const std::string disk = read_file(tier->records_path());
  const std::string tail(reinterpret_cast<const char*>(rec.data()) + 150000, 64);
  const size_t at = disk.find(tail);
  ASSERT_NE(at, std::string::npos);
  flip_byte(tier->records_path(), at + 5);
  before = tier->stats();
  EXPECT_EQ(tier->read_sync(id, {&whole, 1}, {8, 8}).code(), StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().read_pieces_digested - before.read_pieces_digested, 2);
  EXPECT_EQ(tier->read_sync(id, many, {8, 8}).code(), StatusCode::kDataLoss);
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kChecksum), 2);
  EXPECT_EQ(tier->stats().reads, 2);
  ASSERT_TRUE(tier->free(id).ok());
  for (int i : {2, 5}) ASSERT_TRUE(tier->free(fill[i]).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
}

TEST_P(DiskTierTest, CapacityIsBoundedAndFreedSpaceIsReused) {
  auto tier = open_tier(8);  // 8 extents of 64 KiB
  ASSERT_TRUE(tier);
  Bytes page(100 << 10, std::byte{7});  // 2 extents
  const std::span<const std::byte> src(page);
  std::vector<RecordId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(tier->write_sync({&src, 1}, {}).value());
  EXPECT_EQ(tier->stats().extents_used, 8);
  StatusOr<DiskOp> full = tier->write({&src, 1}, {});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->stats().fault_count(DiskFault::kCapacity), 1);
  EXPECT_EQ(tier->stats().records, 4);
  ASSERT_TRUE(tier->free(ids[1]).ok());
  StatusOr<RecordId> again = tier->write_sync({&src, 1}, {});
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again.value(), ids[1]);  // same slot, new generation: the old id stays dead
  Bytes back(page.size());
  const std::span<std::byte> dst(back);
  EXPECT_EQ(tier->read_sync(ids[1], {&dst, 1}, {}).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->free(ids[1]).code(), StatusCode::kNotFound);
  ids[1] = again.value();
  for (RecordId id : ids) ASSERT_TRUE(tier->free(id).ok());
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.extents_used, 0);
  EXPECT_EQ(s.records, 0);
  EXPECT_EQ(s.frees, 5);
}

TEST_P(DiskTierTest, CallerErrorsAreRefused) {
  auto tier = open_tier(8);
  ASSERT_TRUE(tier);
  Bytes page(1000, std::byte{1});
  const std::span<const std::byte> src(page);
  EXPECT_EQ(tier->write({}, {}).status().code(), StatusCode::kInvalidArgument);
  RecordId id = tier->write_sync({&src, 1}, {1, 2}).value();
  Bytes back(999);
  std::span<std::byte> dst(back);
  EXPECT_EQ(tier->read_sync(id, {&dst, 1}, {1, 2}).code(), StatusCode::kInvalidArgument);
  back.resize(1000);
  dst = std::span<std::byte>(back);
  // Another owner's or tag's record is never read (tenants, prefixes).
  EXPECT_EQ(tier->read_sync(id, {&dst, 1}, {9, 2}).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(tier->read_sync(id, {&dst, 1}, {1, 3}).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(tier->read_sync(id + 1, {&dst, 1}, {1, 2}).code(), StatusCode::kNotFound);
  // A record is not readable, nor freeable, while it is written; nor freeable while read.
  DiskOp w = tier->write({&src, 1}, {5, 5}).value();
  EXPECT_EQ(tier->read_sync(w.record(), {&dst, 1}, {5, 5}).code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->free(w.record()).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tier->wait(w).ok());
  EXPECT_EQ(tier->wait(w).code(), StatusCode::kFailedPrecondition);  // finished already
  DiskOp r = tier->read(w.record(), {&dst, 1}, {5, 5}).value();
  EXPECT_EQ(tier->free(w.record()).code(), StatusCode::kFailedPrecondition);
  std::optional<Status> done;
  while (!(done = tier->poll(r))) std::this_thread::yield();
  EXPECT_TRUE(done->ok());
  EXPECT_TRUE(tier->free(w.record()).ok());
  EXPECT_TRUE(tier->free(id).ok());
  EXPECT_EQ(tier->stats().extents_used, 0);
}

TEST_P(DiskTierTest, ADroppedOpIsFinishedByItsDestructor) {
  auto tier = open_tier(8);
  ASSERT_TRUE(tier);
  Bytes page(1000, std::byte{1});
  const std::span<const std::byte> src(page);
  RecordId id;
  {
    DiskOp w = tier->write({&src, 1}, {}).value();
    id = w.record();
  }
  EXPECT_EQ(tier->payload_bytes(id).value(), 1000);
  EXPECT_TRUE(tier->free(id).ok());
}

struct FaultCase {
  IoOp op;
  InjectedFault inject;
  DiskFault fault;
  StatusCode code;
};

TEST_P(DiskTierTest, EveryInjectedFaultHasItsCauseAndLeavesNoSpace) {
  std::vector<FaultCase> cases = {
      {IoOp::kWrite, InjectedFault::kNoSpace, DiskFault::kNoSpace, StatusCode::kResourceExhausted},
      {IoOp::kWrite, InjectedFault::kIoError, DiskFault::kIoError, StatusCode::kUnavailable},
      {IoOp::kWrite, InjectedFault::kShortIo, DiskFault::kShortIo, StatusCode::kDataLoss},
      {IoOp::kRead, InjectedFault::kIoError, DiskFault::kIoError, StatusCode::kUnavailable},
      {IoOp::kRead, InjectedFault::kShortIo, DiskFault::kShortIo, StatusCode::kDataLoss},
      {IoOp::kRead, InjectedFault::kCorrupt, DiskFault::kChecksum, StatusCode::kDataLoss},
  };
  if (direct()) {  // no aligned buffer (memory pressure): a failed op, never an abort
    cases.push_back(
        {IoOp::kWrite, InjectedFault::kNoBuffer, DiskFault::kIoError, StatusCode::kUnavailable});
    cases.push_back(
        {IoOp::kRead, InjectedFault::kNoBuffer, DiskFault::kIoError, StatusCode::kUnavailable});
  }
  // Capture the log: each cause is logged once however often it happens.
  std::ostringstream log;
  auto logger = std::make_shared<spdlog::logger>(
      "disk_tier_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  // Put back however the test leaves (an ASSERT returns early): later tests must not log into
  // this stack frame's stream.
  struct RestoreLogger {
    std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
    ~RestoreLogger() { spdlog::set_default_logger(saved); }
  } restore;
  spdlog::set_default_logger(logger);

  auto tier = open_tier(32);
  ASSERT_TRUE(tier);
  std::vector<Bytes> pages{random_bytes(70000, 1), random_bytes(90000, 2)};  // 3 extents
  for (const FaultCase& c : cases) {
    SCOPED_TRACE(std::string(disk_fault_name(c.fault)));
    const DiskTierStats before = tier->stats();
    RecordId existing = 0;
    if (c.op == IoOp::kRead) existing = tier->write_sync(cspans(pages), {1, 1}).value();
    tier->set_fault_hook(inject_next(c.op, c.inject, 2));
    for (int i = 0; i < 3; ++i) {  // two faults, then the hook is spent
      std::vector<Bytes> back{Bytes(70000), Bytes(90000)};
      DiskOp op = c.op == IoOp::kWrite ? tier->write(cspans(pages), {1, 1}).value()
                                       : tier->read(existing, spans(back), {1, 1}).value();
      const Status s = tier->wait(op);
      if (i < 2) {
        EXPECT_EQ(s.code(), c.code) << s.to_string();
        EXPECT_EQ(op.fault(), c.fault);
        EXPECT_NE(s.message().find(tier->data_file()), std::string::npos);
        if (c.op == IoOp::kWrite) {  // a failed store is never visible and holds no space
          EXPECT_EQ(tier->payload_bytes(op.record()).status().code(), StatusCode::kNotFound);
          EXPECT_EQ(tier->stats().extents_used, before.extents_used);
        }
      } else {
        ASSERT_TRUE(s.ok()) << s.to_string();
        EXPECT_EQ(op.fault(), DiskFault::kNone);
        if (c.op == IoOp::kWrite) {
          ASSERT_TRUE(tier->free(op.record()).ok());
        } else {
          EXPECT_EQ(back[1], pages[1]);
        }
      }
    }
    if (c.op == IoOp::kRead) {
      ASSERT_TRUE(tier->free(existing).ok());
    }
    EXPECT_EQ(tier->stats().fault_count(c.fault), before.fault_count(c.fault) + 2);
    EXPECT_EQ(tier->stats().extents_used, 0);
    EXPECT_EQ(tier->stats().records, 0);
  }
  tier->set_fault_hook(nullptr);
  // A write that stores a wrong checksum is caught by the read.
  tier->set_fault_hook(inject_next(IoOp::kWrite, InjectedFault::kCorrupt, 1));
  RecordId bad = tier->write_sync(cspans(pages), {1, 1}).value();
  std::vector<Bytes> back{Bytes(70000), Bytes(90000)};
  EXPECT_EQ(tier->read_sync(bad, spans(back), {1, 1}).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(tier->free(bad).ok());
  const DiskTierStats s = tier->stats();
  EXPECT_EQ(s.fault_count(DiskFault::kChecksum), 3);
  EXPECT_EQ(s.fault_count(DiskFault::kIoError), direct() ? 8 : 4);  // + the no-buffer cases
  EXPECT_EQ(s.extents_used, 0);

  spdlog::set_default_logger(restore.saved);
  const std::string text = log.str();
  for (const char* cause : {"no_space: ", "io_error: ", "short_io: ", "checksum: "}) {
    size_t n = 0;
    for (size_t at = text.find(cause); at != std::string::npos; at = text.find(cause, at + 1)) ++n;
    EXPECT_EQ(n, 1u) << cause << " in:\n" << text;
  }
}

TEST_P(DiskTierTest, ReopeningNeverServesAPreviousOpensRecords) {
  Bytes page = random_bytes(5000, 3);
  const std::span<const std::byte> src(page);
  RecordId id;
  std::string file;
  {
    auto tier = open_tier(8);
    ASSERT_TRUE(tier);
    id = tier->write_sync({&src, 1}, {1, 1}).value();
    file = tier->data_file();
    // Even while it is open, no file with a name holds a record: the named one is the header
    // and the lock, and the records' file has no name, so a crash (kill -9) leaves no tenant's KV
    // in kv.disk.path (the records were in the named file until the next open wiped them).
    EXPECT_EQ(std::filesystem::file_size(file), static_cast<uintmax_t>(disk_format::kDataOffset));
    int entries = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(config(8).path))
      ++entries;
    EXPECT_EQ(entries, 1);
    EXPECT_NE(read_file(tier->records_path())
                  .find(std::string(reinterpret_cast<const char*>(page.data()), 64)),
              std::string::npos);
    // A second tier on the same directory is refused while this one holds it.
    auto second = DiskTier::open(config(8));
    EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(second.status().message().find("kvsplit-kv-tier.data"), std::string::npos);
  }
  // Closed, the tier leaves its header only: no KV of its records (tenants' prompts) stays at
  // rest, and the space goes back to the file system.
  EXPECT_EQ(std::filesystem::file_size(file), static_cast<uintmax_t>(disk_format::kDataOffset));
  auto tier = open_tier(8);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->payload_bytes(id).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(tier->stats().extents_used, 0);
  // The data file was truncated: no byte of the previous open's record is left to be served.
  const std::string disk = read_file(tier->data_file());
  EXPECT_EQ(disk.find(std::string(reinterpret_cast<const char*>(page.data()), 64)),
            std::string::npos);
}

TEST_P(DiskTierTest, BadPathsGiveClearErrors) {
  // A regular file where the directory should be.
  const std::string file = dir_.file("plain");
  std::ofstream(file) << "x";
  DiskTierConfig c = config(8);
  c.path = file;
  StatusOr<std::unique_ptr<DiskTier>> t = DiskTier::open(c);
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(file), std::string::npos) << t.status().message();

  // A data file that is not ours is refused and left as it was.
  c.path = dir_.file("theirs");
  std::filesystem::create_directories(c.path);
  const std::string data = c.path + "/kvsplit-kv-tier.data";
  std::ofstream(data) << "somebody else's file";
  t = DiskTier::open(c);
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("not a kvsplit disk tier file"), std::string::npos);
  EXPECT_EQ(read_file(data), "somebody else's file");
  // A header page of zeros is a setup that never reached the disk (a power loss): set up again
  // (every later open refused it, so the server could not start).
  std::ofstream(data, std::ios::trunc | std::ios::binary) << std::string(4096, '\0');
  t = DiskTier::open(c);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  t = StatusOr<std::unique_ptr<DiskTier>>(unavailable("closed"));  // releases the lock
  std::ofstream(data, std::ios::trunc | std::ios::binary) << std::string(8192, '\0');
  EXPECT_EQ(DiskTier::open(c).status().code(), StatusCode::kFailedPrecondition);  // not a header

  // No permission: a read-only directory (root ignores modes; /sys refuses even root).
  if (::geteuid() != 0) {
    c.path = dir_.file("ro");
    std::filesystem::create_directories(c.path);
    ::chmod(c.path.c_str(), 0500);
    c.path += "/sub";
  } else {
    c.path = "/sys/kvsplit-disk-tier-test";
  }
  t = DiskTier::open(c);
  EXPECT_EQ(t.status().code(), StatusCode::kPermissionDenied) << t.status().to_string();
  EXPECT_NE(t.status().message().find(c.path), std::string::npos);
  if (::geteuid() != 0) ::chmod(dir_.file("ro").c_str(), 0700);
  // A directory that holds a tier file but refuses the unnamed data file (root ignores modes):
  // kPermissionDenied, the named file as it was.
  if (::geteuid() != 0) {
    c.path = dir_.file("ro-data");
    std::filesystem::create_directories(c.path);
    {
      auto first = DiskTier::open(c);
      ASSERT_TRUE(first.ok()) << first.status().to_string();
    }
    const std::string named = c.path + "/kvsplit-kv-tier.data";
    const std::string before = read_file(named);
    ::chmod(c.path.c_str(), 0500);
    t = DiskTier::open(c);
    EXPECT_EQ(t.status().code(), StatusCode::kPermissionDenied) << t.status().to_string();
    EXPECT_NE(t.status().message().find("cannot create its data file"), std::string::npos)
        << t.status().to_string();
    EXPECT_EQ(read_file(named), before);
    ::chmod(c.path.c_str(), 0700);
  }

  // Bad configs.
  c = config(8);
  c.extent_bytes = 1000;
  EXPECT_EQ(DiskTier::open(c).status().code(), StatusCode::kInvalidArgument);
  c = config(8);
  c.capacity_bytes = 100;
  EXPECT_EQ(DiskTier::open(c).status().code(), StatusCode::kInvalidArgument);
  c.path.clear();
  EXPECT_EQ(DiskTier::open(c).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(DiskTierTest, CreatesAMissingDirectory) {
  DiskTierConfig c = config(4);
  c.path = dir_.file("a/b/c");
  auto t = DiskTier::open(c);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_TRUE(std::filesystem::is_regular_file(c.path + "/kvsplit-kv-tier.data"));
}

// What the probe costs is measured by bench_tiers, not here.
TEST_P(DiskTierTest, BandwidthProbeLeavesNothing) {
  auto tier = open_tier(64, 1 << 20);
  ASSERT_TRUE(tier);
  StatusOr<DiskBandwidth> bw = measure_disk_bandwidth(*tier, 4 << 20, 32 << 20);
  ASSERT_TRUE(bw.ok()) << bw.status().to_string();
  EXPECT_GT(bw->write_bytes_per_s, 0);
  EXPECT_GT(bw->read_bytes_per_s, 0);
  const DiskTierStats st = tier->stats();
  EXPECT_EQ(st.writes, 8);
  EXPECT_EQ(st.reads, 8);
  EXPECT_EQ(st.extents_used, 0);
}

// O_DIRECT keeps records out of the page cache (buffered I/O leaves them there): mincore over a
// mapping of the data file counts the resident pages of a 4 MiB record after it is written and
// read back. Payload segments of odd sizes go through the aligned bounce buffer.
TEST_P(DiskTierTest, DirectIoBypassesThePageCache) {
  auto tier = open_tier(8, 1 << 20);
  ASSERT_TRUE(tier);
  tier->drop_cache();
  std::vector<Bytes> pages{random_bytes(3 << 20, 7), random_bytes(1000001, 8)};
  const RecordId id = tier->write_sync(cspans(pages), {4, 2}).value();
  std::vector<Bytes> back{Bytes(3 << 20), Bytes(1000001)};
  ASSERT_TRUE(tier->read_sync(id, spans(back), {4, 2}).ok());
  EXPECT_EQ(back, pages);
  const int fd = ::open(tier->records_path().c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  const size_t len = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident((len + page - 1) / page);
  ASSERT_EQ(::mincore(map, len, resident.data()), 0);
  size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  ::munmap(map, len);
  ::close(fd);
  const size_t record_pages = (4 << 20) / page;
  if (direct())
    EXPECT_LE(n, 1u) << "O_DIRECT left record pages in the page cache";  // the file header
  else
    EXPECT_GE(n, record_pages / 2) << "buffered I/O should leave the record in the page cache";
  EXPECT_TRUE(tier->free(id).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, DiskTierTest,
                         ::testing::Combine(::testing::Values(IoBackend::kThreads,
                                                              IoBackend::kUring),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(io_backend_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_direct" : "_buffered");
                         });

// IoBackend::kAuto resolves per tier: a buffered tier runs on the helper threads (they measured at
// or above io_uring against the page cache), an O_DIRECT tier on io_uring when it runs here, else
// on the threads; a forced backend is kept either way.
TEST(DiskTierAutoBackend, BufferedTakesThreadsDirectTakesUringWhereItRuns) {
  testing::TempDir dir;
  const bool ring_runs = BlockIo::create(IoOptions{IoBackend::kUring}).ok();
  for (const bool direct : {false, true}) {
    for (const IoBackend asked : {IoBackend::kAuto, IoBackend::kThreads, IoBackend::kUring}) {
      if (asked == IoBackend::kUring && !ring_runs) continue;
      SCOPED_TRACE(std::string(io_backend_name(asked)) + (direct ? " direct" : " buffered"));
      DiskTierConfig c;
      c.path = (dir.path() / "tier").string();
      c.capacity_bytes = 4 << 20;
      c.io.backend = asked;
      c.direct_io = direct;
      auto tier = DiskTier::open(c);
      ASSERT_TRUE(tier.ok()) << tier.status().to_string();
      const bool is_direct = tier.value()->stats().direct_io;
      IoBackend want = asked;
      if (asked == IoBackend::kAuto)
        want = is_direct && ring_runs ? IoBackend::kUring : IoBackend::kThreads;
      EXPECT_EQ(tier.value()->io_backend(), want);
      // Either way the tier works: a record round-trips.
      const Bytes page = random_bytes(12345, 9);
      const std::vector<std::span<const std::byte>> src{page};
      auto id = tier.value()->write_sync(src, RecordKey{1, 2});
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      Bytes back(page.size());
      std::vector<std::span<std::byte>> dst{back};
      EXPECT_TRUE(tier.value()->read_sync(*id, dst, RecordKey{1, 2}).ok());
      EXPECT_EQ(back, page);
      EXPECT_TRUE(tier.value()->free(*id).ok());
    }
  }
}

}  // namespace
}  // namespace kvsplit::kv
