// Minimal fiber contexts for the simt scheduler. On x86-64 (System V) a switch saves the
// callee-saved registers, MXCSR and the x87 control word on the old stack and swaps stack
// pointers: about 10 ns and no system call (ucontext's swapcontext makes a sigprocmask syscall on
// every switch, ~0.5 us). Other targets fall back to ucontext.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace simt::detail {

struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// Prepares `ctx` to run `entry` on [stack, stack + bytes) at the first switch to it. `entry` must
// never return (it switches away for the last time instead).
void MakeFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)());
// Saves the current context in `from` and resumes `to`.
void SwitchFiber(FiberContext* from, FiberContext* to);

}  // namespace simt::detail
