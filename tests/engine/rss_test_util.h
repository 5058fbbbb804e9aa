// Host memory measures of the tests that bound what a save or a load adds to the process's RSS:
// VmRSS / VmHWM from /proc/self/status and a reset of the peak (clear_refs 5, Linux >= 4.0).
#pragma once

#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace traind::engine::testing {

// VmRSS / VmHWM (any "<field>: N kB" line) of this process in bytes; 0 when absent.
inline int64_t ProcStatusBytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::atoll(line.c_str() + n + 1) * 1024;
    }
  }
  return 0;
}

// Returns free heap memory to the kernel, then resets VmHWM to the current RSS (clear_refs 5), so
// VmHWM afterwards minus VmRSS now is the peak growth of what runs in between.
inline int64_t StartPeakRss() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  return ProcStatusBytes("VmRSS");
}

}  // namespace traind::engine::testing
