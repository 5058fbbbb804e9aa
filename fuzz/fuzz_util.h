// Helpers shared by the fuzz targets: a per-process scratch folder for readers that take a path,
// and FUZZ_CHECK, an invariant check that aborts (so libFuzzer and the replay tests see a crash)
// in every build type, NDEBUG included.
#pragma once

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#define FUZZ_CHECK(cond, msg)                                                          \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
              std::string(msg).c_str());                                               \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

namespace traind::fuzz {

// One folder per process under $TMPDIR (or /tmp), created on first use, removed at exit. Inputs
// are written into it under fixed names, so every run of a target reuses the same files.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/traind-fuzz-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      perror("mkdtemp");
      abort();
    }
    auto* d = new std::string(tmpl);
    atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return d;
  }();
  return *dir;
}

// Writes `size` bytes to ScratchDir()/name (replacing it) and returns its path.
inline std::string WriteScratch(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  FUZZ_CHECK(out.good(), "cannot write " + path);
  return path;
}

}  // namespace traind::fuzz
