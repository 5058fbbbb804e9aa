// Fiber context switch for the simt scheduler (see fiber_context.h).
#include "backend/simt/fiber_context.h"

#include <cstdint>

#if defined(__x86_64__)
// void simt_switch_stack(void** save_sp, void* new_sp)
asm(R"(
.text
.globl simt_switch_stack
.type simt_switch_stack,@function
simt_switch_stack:
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
.size simt_switch_stack,.-simt_switch_stack
.section .note.GNU-stack,"",@progbits
.text
)");
extern "C" void simt_switch_stack(void** save_sp, void* new_sp);
#endif

namespace simt::detail {

#if defined(__x86_64__)

void MakeFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                  // fake return address of `entry` (never used)
  *--sp = reinterpret_cast<uint64_t>(entry);  // popped by `ret`: entry starts with rsp % 16 == 8
  for (int i = 0; i < 6; ++i) *--sp = 0;      // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = uint64_t{mxcsr} | (uint64_t{fpucw} << 32);
  ctx->sp = sp;
}

void SwitchFiber(FiberContext* from, FiberContext* to) { simt_switch_stack(&from->sp, to->sp); }

#else

void MakeFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&ctx->uc);
  ctx->uc.uc_stack.ss_sp = stack;
  ctx->uc.uc_stack.ss_size = bytes;
  ctx->uc.uc_link = nullptr;
  makecontext(&ctx->uc, entry, 0);
}

void SwitchFiber(FiberContext* from, FiberContext* to) { swapcontext(&from->uc, &to->uc); }

#endif

}  // namespace simt::detail
