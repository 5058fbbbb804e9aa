// Mutex, MutexLock and CondVar for server/ and worker/: std::mutex and std::condition_variable
// with clang's thread-safety annotations, so that `TRAIND_GUARDED_BY(mu_)` members and
// `TRAIND_REQUIRES(mu_)` functions are checked at compile time by -Wthread-safety (the
// `thread_safety` test, scripts/check_thread_safety.py, compiles server/ and worker/ with clang
// and that warning as an error). Under GCC the annotations are empty and these are the std types.
// The macros carry a TRAIND_ prefix: abseil (through gRPC) defines the bare names.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define TRAIND_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TRAIND_THREAD_ANNOTATION(x)
#endif

#define TRAIND_CAPABILITY(x) TRAIND_THREAD_ANNOTATION(capability(x))
#define TRAIND_SCOPED_CAPABILITY TRAIND_THREAD_ANNOTATION(scoped_lockable)
#define TRAIND_GUARDED_BY(x) TRAIND_THREAD_ANNOTATION(guarded_by(x))
#define TRAIND_REQUIRES(...) TRAIND_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TRAIND_ACQUIRE(...) TRAIND_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TRAIND_RELEASE(...) TRAIND_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRAIND_EXCLUDES(...) TRAIND_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

namespace traind::worker {

class TRAIND_CAPABILITY("mutex") Mutex {
 public:
  void Lock() TRAIND_ACQUIRE() { mu_.lock(); }
  void Unlock() TRAIND_RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class TRAIND_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) TRAIND_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() TRAIND_RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Waits release `mu` while blocked and hold it again when they return (wake-ups may be spurious:
// callers loop on their condition, which the analysis then checks under the lock).
class CondVar {
 public:
  void Wait(Mutex* mu) TRAIND_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  template <class Rep, class Period>
  void WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) TRAIND_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait_for(lock, timeout);
    lock.release();
  }
  void NotifyAll() { cv_.notify_all(); }
  void NotifyOne() { cv_.notify_one(); }

 private:
  std::condition_variable cv_;
};

}  // namespace traind::worker
