// The standalone driver of the gcc build: replays every file of the folders (or files) named on
// the command line through the target's LLVMFuzzerTestOneInput, in name order, and exits 0 when
// none crashed. Registered as the ctest tests fuzz_replay_<target> (corpus/ and regressions/);
// the clang build links libFuzzer's own main() instead.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        // Dotfiles (.gitkeep) are not inputs.
        if (e.is_regular_file() && e.path().filename().string()[0] != '.')
          files.push_back(e.path());
      }
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      fprintf(stderr, "replay: %s: no such file or folder (skipped)\n", argv[i]);
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                  std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 1;
    }
    // A crash here names the input: this line is the last one printed before it.
    fprintf(stderr, "replay: %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  printf("replayed %zu inputs, no crash\n", files.size());
  return files.empty() ? 1 : 0;
}
