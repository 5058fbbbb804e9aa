// Mutex, MutexLock, CondVar (and SharedMutex): std::mutex, std::condition_variable (and
// std::shared_mutex) with clang's thread-safety
// annotations, the one mutex of traind's own code (engine/, offload/, worker/, server/). A member
// declared `TRAIND_GUARDED_BY(mu_)` touched without mu_ held, a `TRAIND_REQUIRES(mu_)` function
// called without it, or a lock not released is a compile error under clang -Wthread-safety: the
// `thread_safety` test (scripts/check_thread_safety.py) compiles those folders' translation units
// with it, and fails on a plain std::mutex there too. Under GCC, which builds the project, the
// annotations are empty and these are the std types with no cost.
// The macros carry a TRAIND_ prefix: abseil (through gRPC) defines the bare names.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define TRAIND_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TRAIND_THREAD_ANNOTATION(x)
#endif

#define TRAIND_CAPABILITY(x) TRAIND_THREAD_ANNOTATION(capability(x))
#define TRAIND_SCOPED_CAPABILITY TRAIND_THREAD_ANNOTATION(scoped_lockable)
#define TRAIND_GUARDED_BY(x) TRAIND_THREAD_ANNOTATION(guarded_by(x))
#define TRAIND_PT_GUARDED_BY(x) TRAIND_THREAD_ANNOTATION(pt_guarded_by(x))
#define TRAIND_REQUIRES(...) TRAIND_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define TRAIND_ACQUIRE(...) TRAIND_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define TRAIND_ACQUIRE_SHARED(...) TRAIND_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define TRAIND_RELEASE_SHARED(...) TRAIND_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define TRAIND_RELEASE(...) TRAIND_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define TRAIND_EXCLUDES(...) TRAIND_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define TRAIND_NO_THREAD_SAFETY_ANALYSIS TRAIND_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace traind {

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

// A reader-writer mutex: readers share it (ReaderMutexLock), a writer holds it alone
// (WriterMutexLock). Members TRAIND_GUARDED_BY it are read under either and written under the second.
class TRAIND_CAPABILITY("mutex") SharedMutex {
 public:
  void Lock() TRAIND_ACQUIRE() { mu_.lock(); }
  void Unlock() TRAIND_RELEASE() { mu_.unlock(); }
  void ReaderLock() TRAIND_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() TRAIND_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class TRAIND_SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) TRAIND_ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() TRAIND_RELEASE() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

class TRAIND_SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) TRAIND_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() TRAIND_RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
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

}  // namespace traind
