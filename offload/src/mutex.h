// A std::mutex and condition variable the compiler can check (clang -Wthread-safety; the
// attributes compile to nothing under g++), in the style of LevelDB's port::Mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define OFFLOAD_TSA(x) __attribute__((x))
#else
#define OFFLOAD_TSA(x)
#endif
#define GUARDED_BY(x) OFFLOAD_TSA(guarded_by(x))
#define EXCLUSIVE_LOCKS_REQUIRED(...) OFFLOAD_TSA(exclusive_locks_required(__VA_ARGS__))
#define LOCKS_EXCLUDED(...) OFFLOAD_TSA(locks_excluded(__VA_ARGS__))

namespace traind::offload {

class OFFLOAD_TSA(capability("mutex")) Mutex {
 public:
  void Lock() OFFLOAD_TSA(acquire_capability()) { mu_.lock(); }
  void Unlock() OFFLOAD_TSA(release_capability()) { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class OFFLOAD_TSA(scoped_lockable) MutexLock {
 public:
  explicit MutexLock(Mutex* mu) OFFLOAD_TSA(acquire_capability(mu)) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() OFFLOAD_TSA(release_capability()) { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Wait() must be called with `mu` held; it is held again when Wait returns.
class CondVar {
 public:
  explicit CondVar(Mutex* mu) : mu_(mu) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  Mutex* const mu_;
  std::condition_variable cv_;
};

}  // namespace traind::offload
