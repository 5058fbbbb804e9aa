// Device selection through the real entry point: traind-run (which calls RegisterGpuBackends) on
// a tiny spec. Without a GPU, --device cuda:0 exits non-zero with "device cuda:0: no CUDA ..." and
// --device auto trains on the CPU after exactly one note saying no GPU was found. On a machine
// with a GPU the cuda:0 case must instead train (exit 0).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "../engine/trainer_test_util.h"
#include "traind/engine/devices.h"

namespace traind::engine {
namespace {

struct Exit {
  int code = -1;
  std::string output;  // stdout and stderr
};

Exit RunTool(const std::string& args) {
  Exit e;
  const std::string cmd = std::string(TRAIND_RUN_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return e;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) e.output.append(buf, n);
  const int status = ::pclose(p);
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return e;
}

std::string WriteSpec(const std::string& dir) {
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 1200, 64, 5);
  // Absolute paths: traind-run resolves relative ones against its working directory.
  testing::WriteFile(dir + "/job.yaml", R"(name: device-test
model:
  arch: gpt2
  config:
    vocab_size: 64
    n_positions: 16
    n_embd: 16
    n_layer: 1
    n_head: 2
data:
  train_file: )" + dir + R"(/tokens.bin
  format: tokens
  token_dtype: uint16
  seq_len: 8
training:
  max_steps: 2
  per_device_train_batch_size: 2
  logging_steps: 1
  overwrite_output_dir: true  # the test runs the spec several times
output_dir: )" + dir + R"(/out
)");
  return dir + "/job.yaml";
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(TraindRunDevice, CudaWithoutGpuFailsCleanlyAndAutoFallsBack) {
  RegisterGpuBackends();  // as traind-run does, to learn whether this machine has a GPU
  const bool have_gpu = QueryDevice("cuda:0").ok();
  const std::string spec = WriteSpec(testing::MakeTempDir("device"));

  const Exit cuda = RunTool(spec + " --threads 1 --device cuda:0");
  if (have_gpu) {
    EXPECT_EQ(cuda.code, 0) << cuda.output;
  } else {
    EXPECT_NE(cuda.code, 0) << cuda.output;
    EXPECT_NE(cuda.output.find("FAILED_PRECONDITION: device cuda:0: no CUDA"), std::string::npos)
        << cuda.output;
    EXPECT_EQ(cuda.output.find("step 1/"), std::string::npos) << "trained anyway: " << cuda.output;
  }

  const Exit autodev = RunTool(spec + " --threads 1 --device auto");
  EXPECT_EQ(autodev.code, 0) << autodev.output;
  EXPECT_NE(autodev.output.find("done: 2 steps"), std::string::npos) << autodev.output;
  EXPECT_EQ(Count(autodev.output, "no GPU found"), have_gpu ? 0u : 1u) << autodev.output;
  if (!have_gpu) {
    EXPECT_NE(autodev.output.find("note: device auto: no GPU found ("), std::string::npos);
    EXPECT_NE(autodev.output.find("using the CPU backend"), std::string::npos);
  }

  const Exit bad = RunTool(spec + " --device tpu");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("INVALID_ARGUMENT"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace traind::engine
