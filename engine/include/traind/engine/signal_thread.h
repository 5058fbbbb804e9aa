// Asynchronous stop signals (SIGTERM, SIGINT, the job runner's SIGUSR1) kept off the compute threads.
//
// A signal is delivered on the stack of whichever thread the kernel picks; when that thread is in
// the middle of a JIT-generated GEMM kernel (oneDNN's), the signal frame written below its stack
// pointer has been seen to corrupt the kernel's state and then the heap ("corrupted size vs.
// prev_size", SIGSEGV) in about one preemption in eight on a loaded 2-core machine. So the
// handlers run on a thread of their own instead.
#pragma once

#include <initializer_list>

namespace traind::engine {

// Blocks `signals` in the calling thread (every thread it creates afterwards, OpenMP's, oneDNN's
// and the data loader's included, inherits the mask) and starts a detached thread that keeps them
// unblocked and sleeps: the handlers installed with sigaction run there. Call it from the main
// thread before the first compute thread exists, after installing the handlers. Threads created
// before the call (OpenBLAS starts its pool when it is loaded; it sleeps unless an OpenBLAS call
// runs) keep their masks.
void RouteSignalsToOwnThread(std::initializer_list<int> signals);

}  // namespace traind::engine
