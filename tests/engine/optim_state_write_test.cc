// The in-memory optimizers' streamed WriteState (state_io::WriteDeviceTensors): the same bytes as
// WriteSafetensors(path, SaveState()) for each optimizer that keeps state (adamw, adamw_8bit, sgd
// with momentum, adafactor factored and not, with and without a first moment), whatever the piece
// size; and the host memory a save of a large state adds stays near its one buffer.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "core/safetensors.h"
#include "optim/optimizer.h"
#include "optim/state_io.h"
#include "optim_test_util.h"
#include "rss_test_util.h"
#include "traind/engine/job_spec.h"

namespace traind::engine::testing {
namespace {

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Case {
  std::string what;
  TrainingSpec training;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  TrainingSpec t;
  t.weight_decay = 0.01;
  t.optim = "adamw";
  out.push_back({"adamw", t});
  t.optim = "adamw_8bit";
  out.push_back({"adamw_8bit", t});
  t.optim = "sgd";
  t.optim_args.momentum = 0.9;
  out.push_back({"sgd momentum", t});
  t.optim = "adafactor";
  out.push_back({"adafactor", t});
  t.optim_args.beta1 = 0.9;
  out.push_back({"adafactor beta1", t});
  return out;
}

// A 2-D tensor large enough for 8-bit moments (with a partial last block), a 3-D one (Adafactor
// factors the last two dimensions), vectors, an empty tensor.
std::vector<ParamInfo> Params(int64_t* num_params) {
  return MakeParams({{96, 70}, {64}, {3, 8, 5}, {0}, {4100}, {7}}, num_params);
}

// `steps` steps with seeded gradients, so the state is not zeros.
void Train(Optimizer* opt, Backend* backend, DeviceArena* arena, int64_t n, int steps) {
  std::vector<float> host = RandomVector(n, 1, 0.5f);
  auto params = arena->Allocate(MemoryCategory::kWeights, static_cast<size_t>(n) * 4, "params");
  auto grads = arena->Allocate(MemoryCategory::kGradients, static_cast<size_t>(n) * 4, "grads");
  ASSERT_TRUE(params.ok() && grads.ok());
  backend->CopyHostToDevice(*params, host.data(), host.size() * 4);
  for (int s = 0; s < steps; ++s) {
    const std::vector<float> g = RandomVector(n, 100 + s, 0.1f);
    backend->CopyHostToDevice(*grads, g.data(), g.size() * 4);
    opt->Step(static_cast<float*>(*params), static_cast<const float*>(*grads), 1e-3, 0.7f);
  }
  arena->Release(*params);
  arena->Release(*grads);
}

TEST(OptimizerWriteState, StreamedFileEqualsSaveStateWritten) {
  for (const Case& c : Cases()) {
    for (int steps : {0, 3}) {
      SCOPED_TRACE(c.what + " after " + std::to_string(steps) + " steps");
      std::unique_ptr<Backend> backend = MakeCpuBackend(1);
      DeviceArena arena(backend.get(), 0);
      int64_t n = 0;
      const std::vector<ParamInfo> params = Params(&n);
      auto opt = MakeOptimizer(c.training, params, n, &arena);
      ASSERT_TRUE(opt.ok()) << opt.status().ToString();
      Train(opt->get(), backend.get(), &arena, n, steps);

      const std::string dir = MakeTempDir("optim_write_state");
      const std::string whole = dir + "/whole.safetensors";
      const std::string streamed = dir + "/streamed.safetensors";
      const SafetensorsFile state = (*opt)->SaveState();
      ASSERT_TRUE(WriteSafetensors(whole, state).ok());
      const Status s = (*opt)->WriteState(streamed);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const std::string want = FileBytes(whole);
      ASSERT_GT(want.size(), 8u);
      EXPECT_TRUE(FileBytes(streamed) == want) << "the streamed file differs";
      if (steps > 0) {
        EXPECT_GE(state.tensors.size(), params.size()) << "no state: the comparison proves little";
      }
      // And it reads back as the same state.
      auto back = ReadSafetensors(streamed);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(back->metadata, state.metadata);
      ASSERT_EQ(back->tensors.size(), state.tensors.size());
      for (const auto& [name, t] : state.tensors) {
        EXPECT_TRUE(back->tensors.at(name).data == t.data) << name;
      }
    }
  }
}

// Pieces smaller than a tensor, not dividing it, of one byte: the same file.
TEST(OptimizerWriteState, AnyPieceSizeWritesTheSameBytes) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  const std::vector<float> a = RandomVector(1000, 3, 1.0f);
  const std::vector<uint8_t> b = {1, 2, 3, 4, 5, 6, 7};
  auto da = arena.Allocate(MemoryCategory::kOptimizer, a.size() * 4, "a");
  auto db = arena.Allocate(MemoryCategory::kOptimizer, b.size(), "b");
  ASSERT_TRUE(da.ok() && db.ok());
  backend->CopyHostToDevice(*da, a.data(), a.size() * 4);
  backend->CopyHostToDevice(*db, b.data(), b.size());
  const std::map<std::string, std::string> metadata = {{"format", "x"}, {"step", "2"}};
  // Out of name order, and a name given twice (the last one is kept, as SaveState's map does).
  const std::vector<state_io::DeviceTensor> tensors = {
      {"z.codes", "U8", {7}, *db, b.size()},
      {"a.exp_avg", "F32", {10, 100}, *da, a.size() * 4},
      {"z.codes", "U8", {1, 7}, *db, b.size()}};
  SafetensorsFile file;
  file.metadata = metadata;
  file.tensors["a.exp_avg"] = HostTensor::FromF32(a.data(), {10, 100});
  file.tensors["z.codes"].dtype = "U8";
  file.tensors["z.codes"].shape = {1, 7};
  file.tensors["z.codes"].data = b;
  const std::string dir = MakeTempDir("optim_write_pieces");
  ASSERT_TRUE(WriteSafetensors(dir + "/whole", file).ok());
  const std::string want = FileBytes(dir + "/whole");
  for (size_t piece : {size_t{1}, size_t{3}, size_t{4096}, size_t{4000}, size_t{1} << 20}) {
    const std::string path = dir + "/piece" + std::to_string(piece);
    const Status s = state_io::WriteDeviceTensors(path, metadata, tensors, backend.get(), piece);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(FileBytes(path) == want) << "piece " << piece;
  }
  // A byte count that disagrees with the shape: an error, no file.
  const Status bad = state_io::WriteDeviceTensors(
      dir + "/bad", metadata, {{"a", "F32", {10, 100}, *da, 3999}}, backend.get());
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.tmp"));
}

// 25M parameters (192 MiB of AdamW state, in host memory on the cpu backend; 48 MiB of 8-bit
// AdamW codes, 96 MiB of SGD momentum, 32 to 128 MiB of Adafactor's): for each optimizer the
// streamed save adds under 16 MiB to the peak RSS (its one 4 MiB piece buffer and the writer's),
// the old path (SaveState, then WriteSafetensors) at least 3/4 of the state.
TEST(OptimizerWriteState, SaveRssGrowthStaysNearItsBuffer) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = MakeParams({{4096, 4096}, {8 << 20}, {4096}}, &n);
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.what);
    std::unique_ptr<Backend> backend = MakeCpuBackend(0);
    DeviceArena arena(backend.get(), 0);
    auto opt = MakeOptimizer(c.training, params, n, &arena);
    ASSERT_TRUE(opt.ok()) << opt.status().ToString();
    Train(opt->get(), backend.get(), &arena, n, 1);
    const int64_t state_bytes = OptimizerPlanBytes(c.training, params, n);
    ASSERT_GT(state_bytes, int64_t{32} << 20);
    const std::string dir = MakeTempDir("optim_write_rss");

    int64_t before = StartPeakRss();
    const Status s = (*opt)->WriteState(dir + "/streamed.safetensors");
    const int64_t streamed_growth = ProcStatusBytes("VmHWM") - before;
    ASSERT_TRUE(s.ok()) << s.ToString();

    before = StartPeakRss();
    {
      const SafetensorsFile state = (*opt)->SaveState();
      ASSERT_TRUE(WriteSafetensors(dir + "/whole.safetensors", state).ok());
    }
    const int64_t whole_growth = ProcStatusBytes("VmHWM") - before;
    std::printf("%s state %.1f MiB: RSS growth while saving streamed %.1f MiB, SaveState path "
                "%.1f MiB\n",
                c.what.c_str(), static_cast<double>(state_bytes) / 1048576.0,
                static_cast<double>(streamed_growth) / 1048576.0,
                static_cast<double>(whole_growth) / 1048576.0);
    EXPECT_LT(streamed_growth, int64_t{16} << 20);
    EXPECT_GT(whole_growth, state_bytes / 4 * 3)
        << "the reference path no longer copies the state: the bound above proves less than it says";
    EXPECT_TRUE(FileBytes(dir + "/streamed.safetensors") == FileBytes(dir + "/whole.safetensors"));
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace traind::engine::testing
