// simt runtime: runs a grid of blocks on worker threads, each block's CUDA threads as fibers
// (fiber_context.h) on the worker's stack pool. Barriers and warp exchanges switch back to a
// per-block scheduler, which resumes the waiting threads in a seeded random order once a barrier is
// complete.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/simt/fiber_context.h"
#include "backend/simt/simt.h"
#include "core/environment.h"
#include "traind/engine/mutex.h"

namespace simt {
namespace {

using traind::CondVar;
using traind::Mutex;
using traind::MutexLock;

// TRAIND_SIMT_SEED, TRAIND_SIMT_WORKERS, TRAIND_SIMT_STACK_KB (core/environment.h), read at start.
const traind::engine::EngineEnvironment kEnv = traind::engine::ReadEngineEnvironment();

std::atomic<uint64_t> g_seed{kEnv.simt_seed.value_or(1)};
std::atomic<int> g_workers{static_cast<int>(
    kEnv.simt_workers.value_or(std::max(1u, std::thread::hardware_concurrency())))};
std::atomic<uint64_t> g_launches{0};
const size_t kStackBytes = kEnv.simt_stack_kb.value_or(64) * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kMaxSharedBytes = 48 * 1024;  // the default per-block limit of sm_80/sm_90

enum class FState : uint8_t { kReady, kBlockBarrier, kWarpBarrier, kDone };

struct Fiber {
  detail::FiberContext ctx;
  FState state = FState::kReady;
  unsigned warp_mask = 0;
  uint3 tid;
  uint64_t result[32];  // the warp's published values at the release of the last exchange
};

// Fiber stacks of one OS thread, reused across blocks and launches. Each has a PROT_NONE guard
// page below it, so a kernel that overflows its stack faults instead of corrupting a neighbour.
struct StackPool {
  std::vector<char*> stacks;  // mmap'ed regions: guard page, then kStackBytes of stack
  ~StackPool() {
    for (char* s : stacks) munmap(s, kStackBytes + kGuardBytes);
  }
  char* Get(size_t i) {
    while (stacks.size() <= i) {
      void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        std::fprintf(stderr, "simt: cannot map a %zu-byte fiber stack\n", kStackBytes);
        std::abort();
      }
      mprotect(p, kGuardBytes, PROT_NONE);
      stacks.push_back(static_cast<char*>(p));
    }
    return stacks[i] + kGuardBytes;
  }
};
thread_local StackPool tl_stacks;

struct Worker {
  const char* name = "";
  const std::function<void()>* body = nullptr;
  dim3 block;
  int nthreads = 0;
  int nwarps = 0;
  std::vector<Fiber> fibers;
  std::vector<uint64_t> published;  // nwarps * 32: each lane's value of its current exchange
  std::vector<unsigned char> dyn;
  detail::FiberContext sched;
  int current = 0;
  std::mt19937_64 rng;
};
thread_local Worker* tl_worker = nullptr;

[[noreturn]] void Fatal(const Worker& w, const std::string& what) {
  std::fprintf(stderr, "simt: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n", w.name,
               detail::tl_block_idx.x, detail::tl_block_idx.y, detail::tl_block_idx.z,
               detail::tl_thread_idx.x, detail::tl_thread_idx.y, detail::tl_thread_idx.z,
               what.c_str());
  std::abort();
}

void FiberEntry() {
  Worker& w = *tl_worker;
  (*w.body)();
  Fiber& f = w.fibers[w.current];
  f.state = FState::kDone;
  // Poison what this lane published, so a shuffle reading an exited lane gets garbage.
  w.published[w.current] = 0x7fc00000deadbeefULL;
  detail::SwitchFiber(&f.ctx, &w.sched);  // never resumed
}

void InitFiber(Worker& w, int i) {
  Fiber& f = w.fibers[i];
  detail::MakeFiber(&f.ctx, tl_stacks.Get(static_cast<size_t>(i)), kStackBytes, FiberEntry);
  f.state = FState::kReady;
}

void Resume(Worker& w, int i) {
  w.current = i;
  detail::tl_thread_idx = w.fibers[i].tid;
  detail::SwitchFiber(&w.sched, &w.fibers[i].ctx);
}

void Yield(Worker& w) { detail::SwitchFiber(&w.fibers[w.current].ctx, &w.sched); }

// Releases every complete barrier; false when none is (a deadlock).
bool ReleaseBarriers(Worker& w) {
  bool released = false;
  // Warp exchanges: complete when every live lane of the mask waits at one.
  for (int warp = 0; warp < w.nwarps; ++warp) {
    const int base = warp * 32;
    const int lanes = std::min(32, w.nthreads - base);
    for (int l = 0; l < lanes; ++l) {
      Fiber& f = w.fibers[base + l];
      if (f.state != FState::kWarpBarrier) continue;
      const unsigned mask = f.warp_mask;
      bool complete = true;
      for (int m = 0; m < lanes && complete; ++m) {
        if (((mask >> m) & 1u) == 0) continue;
        const FState s = w.fibers[base + m].state;
        complete = s == FState::kWarpBarrier || s == FState::kDone;
      }
      if (!complete) continue;
      for (int m = 0; m < lanes; ++m) {
        Fiber& g = w.fibers[base + m];
        if (((mask >> m) & 1u) == 0 || g.state != FState::kWarpBarrier) continue;
        std::copy(w.published.begin() + base, w.published.begin() + base + 32, g.result);
        g.state = FState::kReady;
      }
      released = true;
    }
  }
  if (released) return true;
  // Block barrier: complete when every live thread waits at it.
  int waiting = 0, live = 0;
  for (const Fiber& f : w.fibers) {
    if (f.state == FState::kDone) continue;
    ++live;
    if (f.state == FState::kBlockBarrier) ++waiting;
  }
  if (live > 0 && waiting == live) {
    for (Fiber& f : w.fibers)
      if (f.state == FState::kBlockBarrier) f.state = FState::kReady;
    return true;
  }
  return false;
}

void RunBlockFibers(Worker& w) {
  std::vector<int> ready(w.nthreads);
  for (int i = 0; i < w.nthreads; ++i) {
    InitFiber(w, i);
    ready[i] = i;
  }
  std::shuffle(ready.begin(), ready.end(), w.rng);
  while (true) {
    for (int i : ready) Resume(w, i);
    ready.clear();
    for (int i = 0; i < w.nthreads; ++i)
      if (w.fibers[i].state == FState::kReady) ready.push_back(i);
    if (!ready.empty()) {
      std::shuffle(ready.begin(), ready.end(), w.rng);
      continue;
    }
    bool all_done = true;
    for (const Fiber& f : w.fibers) all_done = all_done && f.state == FState::kDone;
    if (all_done) return;
    if (!ReleaseBarriers(w)) {
      int at_block = 0, at_warp = 0, done = 0;
      for (const Fiber& f : w.fibers) {
        at_block += f.state == FState::kBlockBarrier;
        at_warp += f.state == FState::kWarpBarrier;
        done += f.state == FState::kDone;
      }
      Fatal(w, "deadlock: " + std::to_string(at_block) + " threads wait at __syncthreads, " +
                   std::to_string(at_warp) +
                   " at a warp shuffle/vote whose lanes never all arrive, " + std::to_string(done) +
                   " exited");
    }
    for (int i = 0; i < w.nthreads; ++i)
      if (w.fibers[i].state == FState::kReady) ready.push_back(i);
    std::shuffle(ready.begin(), ready.end(), w.rng);
  }
}

void RunBlock(Worker& w, int64_t linear_block) {
  const dim3 g = detail::tl_grid_dim;
  detail::tl_block_idx = uint3{
      static_cast<unsigned>(linear_block % g.x), static_cast<unsigned>((linear_block / g.x) % g.y),
      static_cast<unsigned>(linear_block / (static_cast<int64_t>(g.x) * g.y))};
  w.rng.seed(g_seed.load() * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(linear_block));
  std::fill(w.dyn.begin(), w.dyn.end(), 0xFF);  // uninitialised shared memory reads as NaN
  RunBlockFibers(w);
}

void RunWorker(const char* name, const std::function<void()>* body, dim3 grid, dim3 block,
               size_t shmem, std::atomic<int64_t>* next, int64_t nblocks) {
  Worker w;
  w.name = name;
  w.body = body;
  w.block = block;
  w.nthreads = static_cast<int>(block.x * block.y * block.z);
  w.nwarps = (w.nthreads + 31) / 32;
  w.fibers.resize(w.nthreads);
  for (int i = 0; i < w.nthreads; ++i) {
    const unsigned u = static_cast<unsigned>(i);
    w.fibers[i].tid = uint3{u % block.x, (u / block.x) % block.y, u / (block.x * block.y)};
  }
  w.published.assign(static_cast<size_t>(w.nwarps) * 32, 0);
  w.dyn.assign(shmem, 0);
  detail::tl_grid_dim = grid;
  detail::tl_block_dim = block;
  Worker* saved = tl_worker;
  tl_worker = &w;
  for (int64_t b = next->fetch_add(1); b < nblocks; b = next->fetch_add(1)) RunBlock(w, b);
  tl_worker = saved;
}

// Persistent worker threads (their stack pools survive across launches). Run() executes
// body(i) for i in [0, n): i = 0 on the calling thread, the others on pool threads; it returns
// when all are done. One launch at a time (launches from several host threads are serialized).
class WorkerPool {
 public:
  static WorkerPool& Get() {
    static WorkerPool* pool = new WorkerPool();  // never destroyed: threads may outlive main
    return *pool;
  }

  void Run(int n, const std::function<void(int)>& body) TRAIND_EXCLUDES(mu_) {
    MutexLock launch(&launch_mu_);
    {
      MutexLock lock(&mu_);
      while (static_cast<int>(threads_.size()) < n - 1) {
        const int index = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, index] { Loop(index); });
        threads_.back().detach();
      }
      job_ = &body;
      wanted_ = n;
      finished_ = 0;
      ++generation_;
    }
    work_cv_.NotifyAll();
    body(0);
    MutexLock lock(&mu_);
    while (finished_ != wanted_ - 1) done_cv_.Wait(&mu_);
    job_ = nullptr;
  }

 private:
  void Loop(int index) TRAIND_EXCLUDES(mu_) {
    uint64_t seen = 0;
    mu_.Lock();
    while (true) {
      while (generation_ == seen) work_cv_.Wait(&mu_);
      seen = generation_;
      if (index >= wanted_) continue;
      const std::function<void(int)>* job = job_;
      mu_.Unlock();
      (*job)(index);
      mu_.Lock();
      if (++finished_ == wanted_ - 1) done_cv_.NotifyOne();
    }
  }

  Mutex launch_mu_;  // one launch at a time
  Mutex mu_;
  CondVar work_cv_, done_cv_;
  std::vector<std::thread> threads_ TRAIND_GUARDED_BY(mu_);
  const std::function<void(int)>* job_ TRAIND_GUARDED_BY(mu_) = nullptr;
  int wanted_ TRAIND_GUARDED_BY(mu_) = 0;
  int finished_ TRAIND_GUARDED_BY(mu_) = 0;
  uint64_t generation_ TRAIND_GUARDED_BY(mu_) = 0;
};

}  // namespace

void SetSeed(uint64_t seed) { g_seed.store(seed); }
uint64_t Seed() { return g_seed.load(); }
void SetWorkers(int workers) { g_workers.store(std::max(1, workers)); }
uint64_t LaunchCount() { return g_launches.load(); }

namespace detail {

thread_local uint3 tl_thread_idx;
thread_local uint3 tl_block_idx;
thread_local dim3 tl_block_dim;
thread_local dim3 tl_grid_dim;

void BlockBarrier() {
  Worker& w = *tl_worker;
  w.fibers[w.current].state = FState::kBlockBarrier;
  Yield(w);
}

const uint64_t* WarpExchangeImpl(unsigned mask, uint64_t value) {
  Worker& w = *tl_worker;
  const int lane = w.current % 32;
  if (((mask >> lane) & 1u) == 0) Fatal(w, "warp op with a mask that excludes the calling lane");
  Fiber& f = w.fibers[w.current];
  w.published[w.current] = value;
  f.state = FState::kWarpBarrier;
  f.warp_mask = mask;
  Yield(w);
  return f.result;
}

int LaneId() { return tl_worker->current % 32; }

unsigned char* DynamicShared() { return tl_worker->dyn.data(); }

StreamState* StateOf(cudaStream_t stream) { return reinterpret_cast<StreamState*>(stream); }

cudaError_t ValidateLaunch(dim3 grid, dim3 block, size_t shmem) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64) return cudaErrorInvalidConfiguration;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
    return cudaErrorInvalidConfiguration;
  if (shmem > kMaxSharedBytes) return cudaErrorInvalidValue;
  return cudaSuccess;
}

cudaError_t RunGrid(const char* name, dim3 grid, dim3 block, size_t shmem,
                    const std::function<void()>& body) {
  g_launches.fetch_add(1);
  const int64_t nblocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  const int workers = static_cast<int>(std::min<int64_t>(g_workers.load(), nblocks));
  std::atomic<int64_t> next{0};
  WorkerPool::Get().Run(workers,
                        [&](int) { RunWorker(name, &body, grid, block, shmem, &next, nblocks); });
  return cudaSuccess;
}

}  // namespace detail
}  // namespace simt
