// RouteSignalsToOwnThread: a process-directed signal runs its handler on the signal thread, never
// on the thread that routed it nor on a thread created afterwards (the compute threads: a signal
// frame on a thread inside a JIT GEMM kernel corrupted the heap in one preemption in eight).
#include "traind/engine/signal_thread.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

namespace traind::engine {
namespace {

std::atomic<int> g_hits{0};
std::atomic<pthread_t> g_handler_thread{};

void OnUsr2(int) {
  g_handler_thread.store(pthread_self());
  g_hits.fetch_add(1);
}

TEST(SignalThreadTest, HandlersRunOffTheCallerAndItsLaterThreads) {
  struct sigaction sa {};
  sa.sa_handler = OnUsr2;
  ASSERT_EQ(sigaction(SIGUSR2, &sa, nullptr), 0);
  RouteSignalsToOwnThread({SIGUSR2});
  const pthread_t caller = pthread_self();

  // Busy threads created after the call, as OpenMP's would be: they inherit the blocked mask.
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  pthread_t busy[2];
  std::thread workers[2];
  for (int i = 0; i < 2; ++i) {
    workers[i] = std::thread([&, i] {
      busy[i] = pthread_self();
      started.fetch_add(1);
      volatile double x = 1.0;
      while (!stop.load()) x = x * 1.0000001 + 1e-9;
    });
  }
  while (started.load() < 2) std::this_thread::yield();
  for (int round = 0; round < 50; ++round) {
    const int before = g_hits.load();
    ASSERT_EQ(::kill(::getpid(), SIGUSR2), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (g_hits.load() == before && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    ASSERT_GT(g_hits.load(), before) << "the handler never ran (round " << round << ")";
    const pthread_t on = g_handler_thread.load();
    EXPECT_FALSE(pthread_equal(on, caller)) << "round " << round;
    EXPECT_FALSE(pthread_equal(on, busy[0])) << "round " << round;
    EXPECT_FALSE(pthread_equal(on, busy[1])) << "round " << round;
  }
  stop.store(true);
  for (auto& w : workers) w.join();
}

}  // namespace
}  // namespace traind::engine
