// RouteSignalsToOwnThread (signal_thread.h).
#include "traind/engine/signal_thread.h"

#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <thread>

namespace traind::engine {

void RouteSignalsToOwnThread(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    for (;;) ::pause();  // returns after each handler has run
  }).detach();
}

}  // namespace traind::engine
