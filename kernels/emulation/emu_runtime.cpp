// Fiber scheduler of the CUDA emulation harness (see emu_runtime.h). One scheduler per OS thread;
// fibers and their stacks are created on first use and reused by every later launch.
#include "kernels/emulation/emu_runtime.h"

#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KVSPLIT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVSPLIT_EMU_ASAN 1
#endif
#endif
// The fibers switch with a few instructions of our own on x86-64 (callee-saved registers, the
// stack pointer, MXCSR and the x87 control word), like boost.context's fcontext: glibc's
// swapcontext also saves the signal mask, a system call per switch that was ~85% of the emulated
// tests' time. Elsewhere, and under ThreadSanitizer (which must see fiber switches), ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define KVSPLIT_EMU_OWN_SWITCH 1
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#undef KVSPLIT_EMU_OWN_SWITCH
#endif
#endif
#endif
#if defined(KVSPLIT_EMU_ASAN) && !defined(KVSPLIT_EMU_OWN_SWITCH)
#include <dlfcn.h>
#endif
#if defined(KVSPLIT_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(KVSPLIT_EMU_OWN_SWITCH)
// kvsplit_emu_switch(from, to): pushes the callee-saved state on the current stack, stores the
// stack pointer in *from, loads `to` and pops the state saved there. A new fiber's stack is laid
// out by init_fiber() so that the first switch "returns" into its entry function.
extern "C" void kvsplit_emu_switch(void** from, void* to);
asm(R"(
  .pushsection .text
  .p2align 4
  .globl kvsplit_emu_switch
  .hidden kvsplit_emu_switch
  .type kvsplit_emu_switch, @function
kvsplit_emu_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size kvsplit_emu_switch, .-kvsplit_emu_switch
  .popsection
)");
#endif

namespace kvsplit::emu {
namespace {

#if defined(KVSPLIT_EMU_ASAN)
constexpr size_t kStackBytes = 512 * 1024;  // ASan frames are several times larger
#else
constexpr size_t kStackBytes = 64 * 1024;
#endif

enum class FiberState { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct AsyncCopy {
  void* dst;
  const void* src;
  size_t bytes;
};

// A suspended execution context: a saved stack pointer with our own switch, else a ucontext.
struct Context {
#if defined(KVSPLIT_EMU_OWN_SWITCH)
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
};

struct Fiber {
  ThreadState ts{};
  Context context;
  unsigned char* map = nullptr;  // guard page + stack
  size_t map_bytes = 0;
  FiberState state = FiberState::kRunnable;
  bool needs_init = true;  // (re)start at the entry point on the next launch
  int index = 0;
  unsigned warp_mask = 0;
  uint64_t published = 0;
  uint64_t received[kWarpSize] = {};
  // Asynchronous copies (cp.async) this thread issued: the open group, then committed groups
  // oldest first. Each copy happens only when a wait retires its group, so a kernel that reads
  // the destination before waiting sees the 0xFF fill, not the data.
  std::vector<AsyncCopy> open_group;
  std::deque<std::vector<AsyncCopy>> committed;

  ~Fiber() {
    if (!map) return;
#if defined(KVSPLIT_EMU_ASAN)
    // The stack's shadow still marks the redzones of the frames suspended on it (a fiber parks in
    // fiber_entry between launches): cleared before the pages go back, or a later mapping at the
    // same address (a model file) reads as a stack overflow.
    __asan_unpoison_memory_region(map, map_bytes);
#endif
    munmap(map, map_bytes);
  }
};

struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  int num_threads = 0;
  Context main_context;
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
  Fiber* cur = nullptr;
  KernelThunk thunk = nullptr;
  const void* ctx = nullptr;
  std::vector<unsigned char> smem;
  bool faulted = false;
  std::string message;
  cudaError_t last_error = cudaSuccess;
};

thread_local size_t t_max_smem = kMaxDynamicSmemBytes;
thread_local AsyncCopyMode t_copy_mode = AsyncCopyMode::kDeferred;

// The schedule KVSPLIT_EMU_SCHEDULE asks for (read once): the order and the random seed.
struct ScheduleSpec {
  ScheduleOrder order = ScheduleOrder::kInOrder;
  uint64_t seed = 1;
};
ScheduleSpec schedule_from_env() {
  ScheduleSpec spec;
  const char* e = std::getenv("KVSPLIT_EMU_SCHEDULE");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "inorder") == 0) return spec;
  if (std::strcmp(e, "reverse") == 0) {
    spec.order = ScheduleOrder::kReverse;
  } else if (std::strncmp(e, "random", 6) == 0 && (e[6] == '\0' || e[6] == ':')) {
    spec.order = ScheduleOrder::kRandom;
    if (e[6] == ':') spec.seed = std::strtoull(e + 7, nullptr, 10);
  } else {
    std::fprintf(stderr,
                 "kvsplit emulation: KVSPLIT_EMU_SCHEDULE=%s is not inorder, reverse, random or "
                 "random:SEED\n",
                 e);
    std::abort();
  }
  return spec;
}
thread_local ScheduleSpec t_schedule = [] {
  static const ScheduleSpec from_env = schedule_from_env();
  return from_env;
}();
// xorshift64 state of the random order (never 0).
uint64_t schedule_rng_start(uint64_t seed) {
  const uint64_t x = 0x9E3779B97F4A7C15ull ^ (seed * 0xBF58476D1CE4E5B9ull);
  return x == 0 ? 1 : x;
}
thread_local uint64_t t_schedule_rng = schedule_rng_start(t_schedule.seed);
// The scheduler is owned by t_sched_owner (fibers are reused by every later launch) and read
// through a plain pointer: a thread_local with a destructor is reached through a TLS init call on
// every access, which took ~15% of the emulated tests' time under ASan.
thread_local std::unique_ptr<Scheduler> t_sched_owner;
thread_local Scheduler* t_sched = nullptr;
thread_local std::string t_last_message;

Scheduler& sched() {
  if (!t_sched) {
    t_sched_owner = std::make_unique<Scheduler>();
    t_sched = t_sched_owner.get();
#if defined(KVSPLIT_EMU_ASAN)
    pthread_attr_t attr;
    pthread_getattr_np(pthread_self(), &attr);
    void* addr = nullptr;
    size_t size = 0;
    pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    t_sched->main_stack_bottom = addr;
    t_sched->main_stack_size = size;
#endif
  }
  return *t_sched;
}

#if defined(KVSPLIT_EMU_ASAN) && !defined(KVSPLIT_EMU_OWN_SWITCH)
// ASan's swapcontext interceptor clears the shadow of the target context's whole stack on every
// switch: an mmap and a madvise of the fiber stack's shadow per switch, ~90% of the emulated
// tests' time under ASan, and it forgets the redzones of the frames suspended on that stack. The
// switches below are announced with __sanitizer_start/finish_switch_fiber instead, and a stack's
// shadow is cleared only when its fiber restarts from the entry point (init_fiber), so they call
// libc's swapcontext itself.
using SwapContextFn = int (*)(ucontext_t*, const ucontext_t*);
SwapContextFn libc_swapcontext() {
  static const SwapContextFn fn = [] {
    void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void* sym = libc ? dlsym(libc, "swapcontext") : nullptr;
    return sym ? reinterpret_cast<SwapContextFn>(sym) : &swapcontext;
  }();
  return fn;
}
#endif

// Switches from context `from` to fiber `to` (nullptr: back to the scheduler's main context).
void switch_to(Context* from, Fiber* to) {
  Scheduler& s = sched();
#if defined(KVSPLIT_EMU_ASAN)
  void* fake = nullptr;
  if (to) {
    __sanitizer_start_switch_fiber(&fake, to->map + getpagesize(), to->map_bytes - getpagesize());
  } else {
    __sanitizer_start_switch_fiber(&fake, s.main_stack_bottom, s.main_stack_size);
  }
#endif
  s.cur = to;
  Context* target = to ? &to->context : &s.main_context;
#if defined(KVSPLIT_EMU_OWN_SWITCH)
  kvsplit_emu_switch(&from->sp, target->sp);
#elif defined(KVSPLIT_EMU_ASAN)
  libc_swapcontext()(&from->uc, &target->uc);
#else
  swapcontext(&from->uc, &target->uc);
#endif
#if defined(KVSPLIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

uint64_t schedule_random() {
  uint64_t x = t_schedule_rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return t_schedule_rng = x;
}

// The runnable fiber to run after `f` (nullptr: none, or in order none after it: back to the
// scheduler's loop, which resolves barriers and starts the next round).
Fiber* pick_next(Scheduler& s, const Fiber* f) {
  const int n = s.num_threads;
  switch (t_schedule.order) {
    case ScheduleOrder::kInOrder:
      for (int i = (f ? f->index + 1 : 0); i < n; ++i)
        if (s.fibers[i]->state == FiberState::kRunnable) return s.fibers[i].get();
      return nullptr;
    case ScheduleOrder::kReverse:
      for (int i = n - 1; i >= 0; --i)
        if (s.fibers[i]->state == FiberState::kRunnable) return s.fibers[i].get();
      return nullptr;
    case ScheduleOrder::kRandom:
      break;
  }
  // Seven times in eight a thread of the same warp (so a warp runs ahead of the others, through
  // its warp operations), else any.
  const int base = f ? f->index & ~(kWarpSize - 1) : 0;
  const bool same_warp = (schedule_random() & 7) != 0;
  const int lo = same_warp ? base : 0, hi = same_warp ? std::min(n, base + kWarpSize) : n;
  for (int pass = 0; pass < 2; ++pass) {
    const int from = pass == 0 ? lo : 0, to = pass == 0 ? hi : n;
    // A few random probes first: most fibers are runnable most of the time, and a scan of the
    // block on every switch made this order ~4x slower than in order.
    for (int probe = 0; probe < 4; ++probe) {
      Fiber* g =
          s.fibers[from + static_cast<int>(schedule_random() % static_cast<uint64_t>(to - from))]
              .get();
      if (g->state == FiberState::kRunnable) return g;
    }
    int count = 0;
    for (int i = from; i < to; ++i) count += s.fibers[i]->state == FiberState::kRunnable;
    if (count == 0) continue;
    int k = static_cast<int>(schedule_random() % static_cast<uint64_t>(count));
    for (int i = from; i < to; ++i)
      if (s.fibers[i]->state == FiberState::kRunnable && k-- == 0) return s.fibers[i].get();
  }
  return nullptr;
}

// Releases f's warp operation when every lane of its mask waits at one with the same mask: each
// lane gets the snapshot of all published values and runs again. False when a lane is missing.
bool release_warp_group(Scheduler& s, const Fiber& f) {
  const int base = f.index & ~(kWarpSize - 1);
  for (int l = 0; l < kWarpSize; ++l) {
    if (!((f.warp_mask >> l) & 1u)) continue;
    const int j = base + l;
    if (j >= s.num_threads || s.fibers[j]->state != FiberState::kWarpBarrier ||
        s.fibers[j]->warp_mask != f.warp_mask)
      return false;
  }
  uint64_t vals[kWarpSize] = {};
  for (int l = 0; l < kWarpSize; ++l)
    if ((f.warp_mask >> l) & 1u) vals[l] = s.fibers[base + l]->published;
  for (int l = 0; l < kWarpSize; ++l) {
    if (!((f.warp_mask >> l) & 1u)) continue;
    Fiber& g = *s.fibers[base + l];
    std::memcpy(g.received, vals, sizeof(vals));
    g.state = FiberState::kRunnable;
  }
  return true;
}

// Out of order: releases f's warp operation as soon as its lanes have all arrived (in order, the
// scheduler's loop releases it when the whole block has stopped).
void release_warp_if_complete(Scheduler& s, const Fiber& f) {
  if (t_schedule.order != ScheduleOrder::kInOrder) (void)release_warp_group(s, f);
}

void fiber_entry() {
  Scheduler& s = sched();
#if defined(KVSPLIT_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  for (;;) {
    Fiber* f = s.cur;
    s.thunk(s.ctx);
    f->state = FiberState::kDone;
    // Hand over to the next runnable fiber of this round, or back to the scheduler.
    switch_to(&f->context, pick_next(s, f));
  }
}

// The calling fiber blocks in `state`; runs the next runnable fiber of the round.
void block_current(FiberState state) {
  Scheduler& s = sched();
  Fiber* f = s.cur;
  if (!f) {
    std::fprintf(stderr, "kvsplit emulation: a device function was called outside a launch\n");
    std::abort();
  }
  f->state = state;
  if (state == FiberState::kWarpBarrier) release_warp_if_complete(s, *f);
  Fiber* next = pick_next(s, f);
  if (next == f) return;  // its own warp operation was released: it runs on
  switch_to(&f->context, next);
}

void init_fiber(Fiber& f) {
  if (!f.map) {
    const size_t page = static_cast<size_t>(getpagesize());
    f.map_bytes = kStackBytes + page;
    void* p =
        mmap(nullptr, f.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "kvsplit emulation: cannot map a fiber stack\n");
      std::abort();
    }
    f.map = static_cast<unsigned char*>(p);
    mprotect(f.map, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  } else {
#if defined(KVSPLIT_EMU_ASAN)
    // A restart after an abandoned launch: the frames left on the stack may have poisoned
    // redzones that the new frames must not inherit.
    __asan_unpoison_memory_region(f.map + getpagesize(), f.map_bytes - getpagesize());
#endif
  }
  unsigned char* stack = f.map + getpagesize();
  const size_t stack_bytes = f.map_bytes - getpagesize();
#if defined(KVSPLIT_EMU_OWN_SWITCH)
  // What kvsplit_emu_switch pops, from the top of a 16-byte aligned stack down: the entry
  // function's own return address (0: it never returns), the address the switch returns to (the
  // entry, reached with rsp = 8 mod 16 as after a call), rbp, rbx, r12-r15 (zero), then MXCSR and
  // the x87 control word of the launching thread.
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + stack_bytes) &
                                          ~uintptr_t{15});
  top[-1] = 0;
  top[-2] = reinterpret_cast<uint64_t>(&fiber_entry);
  for (int i = 3; i <= 8; ++i) top[-i] = 0;
  uint32_t mxcsr = 0;
  uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  top[-9] = uint64_t{mxcsr} | (uint64_t{fpcw} << 32);
  f.context.sp = &top[-9];
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = stack;
  f.context.uc.uc_stack.ss_size = stack_bytes;
  f.context.uc.uc_link = nullptr;
  makecontext(&f.context.uc, fiber_entry, 0);
#endif
  f.needs_init = false;
}

std::string describe(const Fiber& f) {
  return "thread (" + std::to_string(f.ts.thread_idx.x) + "," + std::to_string(f.ts.thread_idx.y) +
         "," + std::to_string(f.ts.thread_idx.z) + ") of block (" +
         std::to_string(f.ts.block_idx.x) + "," + std::to_string(f.ts.block_idx.y) + "," +
         std::to_string(f.ts.block_idx.z) + ")";
}

// After a round (no fiber runnable): releases complete warp groups, else a complete block barrier.
// Returns false when the block has finished; sets s.faulted on a deadlock or partial barrier.
bool resolve(Scheduler& s) {
  const int n = s.num_threads;
  bool progress = false;
  for (int i = 0; i < n; ++i) {
    Fiber& f = *s.fibers[i];
    if (f.state == FiberState::kWarpBarrier && release_warp_group(s, f)) progress = true;
  }
  if (progress) return true;
  int at_block = 0, done = 0;
  const Fiber* waiting_warp = nullptr;
  for (int i = 0; i < n; ++i) {
    const FiberState st = s.fibers[i]->state;
    if (st == FiberState::kBlockBarrier) ++at_block;
    if (st == FiberState::kDone) ++done;
    if (st == FiberState::kWarpBarrier && !waiting_warp) waiting_warp = s.fibers[i].get();
  }
  if (waiting_warp) {
    char mask[16];
    std::snprintf(mask, sizeof(mask), "0x%08x", waiting_warp->warp_mask);
    s.faulted = true;
    s.message = "warp operation deadlock: " + describe(*waiting_warp) + " waits with mask " + mask +
                " but not every lane of the mask reaches the same operation";
    return false;
  }
  if (done == n) return false;
  if (done > 0) {
    s.faulted = true;
    s.message = "__syncthreads() reached by only " + std::to_string(at_block) + " of " +
                std::to_string(n) + " threads of block (" +
                std::to_string(s.fibers[0]->ts.block_idx.x) + "," +
                std::to_string(s.fibers[0]->ts.block_idx.y) + "," +
                std::to_string(s.fibers[0]->ts.block_idx.z) + ")";
    return false;
  }
  for (int i = 0; i < n; ++i) s.fibers[i]->state = FiberState::kRunnable;
  return true;
}

cudaError_t fail(Scheduler& s, cudaError_t code, std::string message) {
  s.last_error = code;
  t_last_message = std::move(message);
  return code;
}

}  // namespace

ThreadState* current() {
  Scheduler* s = t_sched;
  return (s && s->cur) ? &s->cur->ts : nullptr;
}

int lane_id() {
  Scheduler& s = sched();
  if (!s.cur) {
    record_fault("lane_id() outside a launch");
    abandon();
  }
  return s.cur->index & (kWarpSize - 1);
}

void syncthreads() { block_current(FiberState::kBlockBarrier); }

const uint64_t* warp_exchange(unsigned mask, uint64_t value) {
  Scheduler& s = sched();
  Fiber* f = s.cur;
  if (!f) {
    record_fault("warp operation outside a launch");
    abandon();
  }
  const int lane = f->index & (kWarpSize - 1);
  if (!((mask >> lane) & 1u)) {
    char m[16];
    std::snprintf(m, sizeof(m), "0x%08x", mask);
    record_fault("warp operation with mask " + std::string(m) + " called by lane " +
                 std::to_string(lane) + " which the mask excludes");
    abandon();
  }
  f->warp_mask = mask;
  f->published = value;
  block_current(FiberState::kWarpBarrier);
  return f->received;
}

void syncwarp(unsigned mask) { (void)warp_exchange(mask, 0); }

namespace {
Fiber& running_fiber(const char* what) {
  Scheduler& s = sched();
  if (!s.cur) {
    std::fprintf(stderr, "kvsplit emulation: %s outside a launch\n", what);
    std::abort();
  }
  return *s.cur;
}
}  // namespace

void async_copy(void* dst, const void* src, size_t bytes) {
  Fiber& f = running_fiber("cp.async");
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), g = reinterpret_cast<uintptr_t>(src);
  if ((bytes != 4 && bytes != 8 && bytes != 16) || d % bytes != 0 || g % bytes != 0) {
    record_fault("cp.async of " + std::to_string(bytes) + " bytes needs 4/8/16 bytes aligned to " +
                 "their size (dst " + std::to_string(d % 16) + ", src " + std::to_string(g % 16) +
                 " mod 16)");
    abandon();
  }
  const Scheduler& s = sched();
  const unsigned char* lo = s.smem.data();
  const auto* dp = static_cast<const unsigned char*>(dst);
  if (dp < lo || dp + bytes > lo + s.smem.size()) {
    record_fault("cp.async destination is not in the block's dynamic shared memory");
    abandon();
  }
  if (t_copy_mode == AsyncCopyMode::kEager) {
    std::memcpy(dst, src, bytes);
    return;
  }
  f.open_group.push_back(AsyncCopy{dst, src, bytes});
}

size_t max_dynamic_smem_bytes() { return t_max_smem; }
void set_max_dynamic_smem_bytes(size_t bytes) { t_max_smem = bytes; }
void set_async_copy_mode(AsyncCopyMode mode) { t_copy_mode = mode; }
void set_schedule_order(ScheduleOrder order, uint64_t seed) {
  t_schedule = ScheduleSpec{order, seed};
  t_schedule_rng = schedule_rng_start(seed);
}
ScheduleOrder schedule_order() { return t_schedule.order; }

void async_commit() {
  Fiber& f = running_fiber("cp.async.commit_group");
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void async_wait_prior(int newest_pending) {
  Fiber& f = running_fiber("cp.async.wait_group");
  while (static_cast<int>(f.committed.size()) > newest_pending) {
    for (const AsyncCopy& c : f.committed.front()) std::memcpy(c.dst, c.src, c.bytes);
    f.committed.pop_front();
  }
}

void record_fault(const std::string& message) {
  Scheduler& s = sched();
  if (!s.cur) {
    std::fprintf(stderr, "kvsplit emulation fault outside a launch: %s\n", message.c_str());
    std::abort();
  }
  s.message = message + " (" + describe(*s.cur) + ")";
}

void abandon() {
  Scheduler& s = sched();
  if (!s.cur) std::abort();
  s.faulted = true;
  Fiber* f = s.cur;
  f->needs_init = true;
  switch_to(&f->context, nullptr);
  std::abort();  // never resumed
}

cudaError_t run_grid(KernelThunk thunk, const void* ctx, dim3 grid, dim3 block, size_t smem_bytes) {
  Scheduler& s = sched();
  if (s.cur) {
    std::fprintf(stderr, "kvsplit emulation: nested launch from device code is not supported\n");
    std::abort();
  }
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > kMaxThreadsPerBlock || block.x > 1024 || block.y > 1024 ||
      block.z > 64) {
    return fail(s, cudaErrorInvalidConfiguration,
                "invalid block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                    std::to_string(block.z) + ")");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    return fail(s, cudaErrorInvalidConfiguration,
                "invalid grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
                    std::to_string(grid.z) + ")");
  }
  if (smem_bytes > t_max_smem) {
    return fail(s, cudaErrorInvalidValue,
                "dynamic shared memory " + std::to_string(smem_bytes) + " B exceeds the " +
                    std::to_string(t_max_smem) + " B a block may use");
  }
  const int n = static_cast<int>(threads);
  while (static_cast<int>(s.fibers.size()) < n) {
    s.fibers.push_back(std::make_unique<Fiber>());
    s.fibers.back()->index = static_cast<int>(s.fibers.size()) - 1;
  }
  s.num_threads = n;
  s.thunk = thunk;
  s.ctx = ctx;
  s.faulted = false;
  s.smem.assign(smem_bytes + 16, 0xFF);
  unsigned char* smem = s.smem.data();
  for (int i = 0; i < n; ++i) {
    Fiber& f = *s.fibers[i];
    f.ts.thread_idx =
        uint3{static_cast<unsigned>(i) % block.x, static_cast<unsigned>(i) / block.x % block.y,
              static_cast<unsigned>(i) / (block.x * block.y)};
    f.ts.block_dim = block;
    f.ts.grid_dim = grid;
    f.ts.dynamic_smem = smem;
  }
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        if (smem_bytes) std::memset(smem, 0xFF, smem_bytes);
        for (int i = 0; i < n; ++i) {
          Fiber& f = *s.fibers[i];
          f.ts.block_idx = uint3{bx, by, bz};
          f.state = FiberState::kRunnable;
          f.open_group.clear();  // copies a previous block never waited for are dropped
          f.committed.clear();
          if (f.needs_init) init_fiber(f);
        }
        for (;;) {
          Fiber* first = pick_next(s, nullptr);
          if (first) switch_to(&s.main_context, first);
          if (s.faulted) break;
          if (!resolve(s)) break;
        }
        if (s.faulted) {
          // Abandoned fibers restart from their entry point on the next launch.
          for (int i = 0; i < n; ++i)
            if (s.fibers[i]->state != FiberState::kDone) s.fibers[i]->needs_init = true;
          s.cur = nullptr;
          return fail(s, cudaErrorLaunchFailure, s.message);
        }
      }
    }
  }
  s.cur = nullptr;
  s.last_error = cudaSuccess;
  t_last_message.clear();
  return cudaSuccess;
}

const std::string& last_error_message() { return t_last_message; }

}  // namespace kvsplit::emu

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
  }
  return "unknown error";
}

cudaError_t cudaGetLastError() {
  kvsplit::emu::Scheduler& s = kvsplit::emu::sched();
  const cudaError_t e = s.last_error;
  s.last_error = cudaSuccess;
  return e;
}
