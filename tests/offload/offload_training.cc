// training.offload through the whole trainer (engine RunJob with offload/'s stores):
// - the weights after N steps are bit-identical to the in-memory optimizer's, for `cpu` (host RAM)
//   and `nvme` (the value log), fp32, bf16 and fp16, and for every optimizer (AdamW, 8-bit AdamW,
//   SGD, Adafactor): the optimizer state leaves the device (with AdamW in bf16/fp16 the fp32
//   master weights too), the update math does not change;
// - the plan's optimizer bytes are the largest group's window, not the whole state, and the
//   measured peak equals the plan;
// - checkpoints are in the in-memory format: a run saved with offload resumes without it and the
//   other way round, bit-identical to an uninterrupted run;
// - a resume streams the optimizer file into the store (ReadState): RSS grows by the window and
//   the store's buffers, not the state, and the store then holds exactly the file;
// - errors: an offload_dir that cannot be used, a store damaged between steps, and a disk that
//   fills mid-run end the job with one clear error naming the directory, never a silent wrong
//   update, and the last checkpoint resumes elsewhere;
// - each step reports its offload I/O (the daemon's traind_offload_* metrics come from it).
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "models/hf_config.h"
#include "models/layout.h"
#include "optim/offloaded_optimizer.h"
#include "train/planner.h"
#include "model_test_util.h"
#include "rss_test_util.h"
#include "trainer_test_util.h"
#include "traind/engine/trainer.h"
#include "traind/offload/offload.h"

namespace traind::engine {
namespace {

namespace fs = std::filesystem;

// Opens the store the job runner would open for the spec (offload/'s factories; nvme: the
// default value-log store).
Result<std::unique_ptr<OptimizerStateStore>> OpenStore(const TrainingSpec& t) {
  if (t.offload == "cpu") return offload::MakeHostStore();
  return offload::MakeNvmeStore(*t.offload_dir);
}

RunOptions Options(bool offload) {
  RunOptions o = testing::TestRunOptions(2);
  if (offload) o.open_optimizer_state_store = OpenStore;
  return o;
}

// The same job in memory and offloaded (the offloaded run's step reports and messages kept): the
// final weights must be byte-identical and the training loss equal.
struct PairedRuns {
  std::optional<RunSummary> mem, off;
  std::vector<StepReport> steps;
  std::vector<std::string> notes;
};

void RunPaired(const JobSpec& mem, const JobSpec& off, PairedRuns* p) {
  auto rm = RunJob(mem, Options(false), {});
  ASSERT_TRUE(rm.ok()) << rm.status().ToString();
  p->mem = std::move(*rm);
  RunCallbacks cb;
  cb.on_step = [p](const StepReport& r) { p->steps.push_back(r); };
  cb.on_message = [p](const std::string& m) { p->notes.push_back(m); };
  auto ro = RunJob(off, Options(true), cb);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();
  p->off = std::move(*ro);
  EXPECT_EQ(testing::ReadFile(mem.output_dir + "/model.safetensors"),
            testing::ReadFile(off.output_dir + "/model.safetensors"))
      << "weights after " << p->steps.size() << " steps differ from the in-memory optimizer's";
  EXPECT_EQ(p->mem->train_loss, p->off->train_loss);
}

struct Case {
  const char* optim;
  const char* offload;  // cpu | nvme
  const char* precision;  // fp32 | bf16 | fp16
  int steps;
  // gpt2 (tied embeddings) | llama (untied lm_head) | mixtral (experts) | qwen3 (q/k norms) |
  // gemma (1 + w norms, GeGLU, scaled embeddings)
  const char* arch = "gpt2";
};

std::string Name(const Case& c) {
  return std::string(c.optim) + "_" + c.offload + "_" + c.precision +
         (std::string(c.arch) == "gpt2" ? "" : std::string("_") + c.arch);
}

class OffloadTraining : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("offload-train");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 1200, 64, 11);
  }
  JobSpec Spec(const std::string& sub, bool offload) const {
    const Case c = GetParam();
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    if (std::string(c.arch) != "gpt2") {  // the same size in the llama family (2 kv heads)
      ModelConfig& m = s.model.config;
      m = testing::TinyLlamaConfig({32, 64, 2, 4, 2, 32});
      m.arch = ParseArch(c.arch).value();
      if (std::string(c.arch) == "mixtral") {
        m.intermediate_size = 24;
        m.num_local_experts = 4;
        m.num_experts_per_tok = 2;
      }
    }
    s.training.optim = c.optim;
    if (std::string(c.optim) == "sgd") {
      s.training.optim_args.momentum = 0.9;
      s.training.learning_rate = 0.05;
    }
    if (std::string(c.optim) == "adafactor") s.training.optim_args.beta1 = 0.9;
    s.training.bf16 = std::string(c.precision) == "bf16";
    s.training.fp16 = std::string(c.precision) == "fp16";
    s.training.max_steps = c.steps;
    s.training.gradient_accumulation_steps = 2;
    if (offload) {
      s.training.offload = c.offload;
      if (std::string(c.offload) == "nvme") s.training.offload_dir = dir_ + "/" + sub + "-store";
    }
    return s;
  }
  std::string dir_, data_;
};

TEST_P(OffloadTraining, WeightsBitIdenticalToInMemoryAndPlanIsTheWindow) {
  const JobSpec mem = Spec("mem", false);
  const JobSpec off = Spec("off", true);
  PairedRuns p;
  RunPaired(mem, off, &p);
  if (HasFatalFailure()) return;
  const std::optional<RunSummary>& rm = p.mem;
  const std::optional<RunSummary>& ro = p.off;
  const std::vector<StepReport>& steps = p.steps;
  const std::vector<std::string>& notes = p.notes;

  // The device holds one group's window, a fraction of the state; the plan is exact.
  const int64_t state = rm->plan.bytes.optimizer;
  const int64_t window = ro->plan.bytes.optimizer;
  // AdamW in bf16/fp16: the fp32 master weights are in the store too (a third window); the device
  // keeps the 16-bit weights and fp32 copies of only the tensors read in fp32 (embeddings, norms,
  // biases).
  const bool master_off = std::string(GetParam().precision) != "fp32";
  EXPECT_GT(window, 0);
  EXPECT_LE((master_off ? window / 3 * 2 : window) * 4, state)
      << "the optimizer-state window must be a fraction of the whole state";
  EXPECT_EQ(ro->peak_memory_bytes, ro->plan.bytes.total()) << "plan == measured peak";
  const ModelConfig config = mem.model.config;
  const ParamTable table = BuildParams(MakeArchDims(config));
  const int64_t params = table.total;
  int64_t resident = 0;
  for (const Fp32ResidentTensor& t : Fp32ResidentTensors(table)) {
    resident += t.numel;
    // Only what the step reads in fp32 stays: embedding tables and vectors (norms, biases); every
    // part of a fused GEMM weight (llama's k/v/up, mixtral's w3) is read in the compute type.
    for (const ParamInfo& info : table.infos) {
      if (info.offset != t.offset) continue;
      EXPECT_TRUE(info.shape.size() == 1 || t.offset == table.wte || t.offset == table.wpe)
          << info.hf_name << " keeps an fp32 copy on the device";
    }
  }
  const int64_t weights_freed = rm->plan.bytes.weights - ro->plan.bytes.weights;
  if (master_off) {
    EXPECT_EQ(ro->plan.offload_master_bytes, 4 * params);
    EXPECT_EQ(weights_freed, 4 * (params - resident));
    EXPECT_GT(params - resident, params / 2) << "most of the tiny gpt2 is GEMM weights";
  } else {
    EXPECT_EQ(ro->plan.offload_master_bytes, 0);
    EXPECT_EQ(weights_freed, 0);
  }
  EXPECT_EQ(ro->plan.bytes.total() + state - window + weights_freed, rm->plan.bytes.total());

  ASSERT_EQ(steps.size(), static_cast<size_t>(GetParam().steps));
  for (const StepReport& r : steps) {
    EXPECT_EQ(r.offload_updated_during_backward, 0) << "clipping (max_grad_norm 1) needs every gradient first";
  }
  EXPECT_EQ(steps[0].offload_read_bytes, ro->plan.offload_master_bytes)
      << "step 1 starts from zero state: it reads the master weights only (when they are there)";
  EXPECT_GT(steps[0].offload_written_bytes, state / 2);
  EXPECT_GT(steps[1].offload_read_bytes, state / 2);
  EXPECT_GT(steps.back().offload_store_bytes, 0);
  bool noted = false, master_noted = false;
  for (const std::string& n : notes) {
    noted = noted || n.find("training.offload") != std::string::npos;
    master_noted = master_noted || n.find("fp32 master weights") != std::string::npos;
  }
  EXPECT_TRUE(noted) << "the job says where its optimizer state is";
  EXPECT_EQ(master_noted, master_off) << "and whether its master weights are there";
}

INSTANTIATE_TEST_SUITE_P(
    Stores, OffloadTraining,
    ::testing::Values(Case{"adamw", "cpu", "fp32", 20}, Case{"adamw", "nvme", "fp32", 20},
                      Case{"adamw", "cpu", "bf16", 20}, Case{"adamw", "nvme", "bf16", 20},
                      Case{"adamw", "nvme", "fp16", 20}, Case{"adamw", "nvme", "bf16", 12, "llama"},
                      Case{"adamw", "cpu", "bf16", 12, "mixtral"}, Case{"adamw", "nvme", "bf16", 12, "qwen3"},
                      Case{"adamw", "cpu", "fp32", 12, "gemma"}, Case{"adamw_8bit", "nvme", "bf16", 8},
                      Case{"sgd", "cpu", "bf16", 8}, Case{"adafactor", "nvme", "bf16", 8},
                      Case{"adamw_8bit", "nvme", "fp32", 8}, Case{"sgd", "cpu", "fp32", 8},
                      Case{"adafactor", "nvme", "fp32", 8}),
    [](const auto& info) { return Name(info.param); });

// max_grad_norm 0 (no clipping) with the offloaded AdamW: each block's parameters update while
// backward goes on below it (the final norm and an untied lm head after the last block's backward,
// the embeddings after backward), chunk by chunk from the last; the weights are bit-identical to
// the in-memory run that updates after backward (fp32 and bf16 with the master weights in the
// store, with accumulation and with gradient checkpointing).
struct EarlyCase {
  const char* precision;
  const char* offload;
  const char* arch;
  bool checkpointing;
};

class OffloadEarlyUpdate : public ::testing::TestWithParam<EarlyCase> {};

TEST_P(OffloadEarlyUpdate, DuringBackwardBitIdenticalToInMemory) {
  const EarlyCase c = GetParam();
  const std::string dir = testing::MakeTempDir("offload-early");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 1200, 64, 23);
  auto spec = [&](const std::string& sub, bool offload) {
    JobSpec s = testing::TinySpec(dir + "/" + sub, dir + "/tokens.bin");
    if (std::string(c.arch) != "gpt2") {
      s.model.config = testing::TinyLlamaConfig({32, 64, 2, 4, 2, 32});
      s.model.config.arch = ParseArch(c.arch).value();
      if (std::string(c.arch) == "mixtral") {
        s.model.config.intermediate_size = 24;
        s.model.config.num_local_experts = 4;
        s.model.config.num_experts_per_tok = 2;
      }
    }
    s.training.max_grad_norm = 0.0;
    s.training.bf16 = std::string(c.precision) == "bf16";
    s.training.max_steps = 12;
    s.training.gradient_accumulation_steps = 2;
    s.training.gradient_checkpointing = c.checkpointing;
    if (offload) {
      s.training.offload = c.offload;
      if (std::string(c.offload) == "nvme") s.training.offload_dir = dir + "/" + sub + "-store";
    }
    return s;
  };
  const JobSpec mem = spec("mem", false), off = spec("off", true);
  PairedRuns p;
  RunPaired(mem, off, &p);
  if (HasFatalFailure()) return;
  const std::optional<RunSummary>& ro = p.off;
  const std::vector<StepReport>& steps = p.steps;
  const std::vector<std::string>& notes = p.notes;
  EXPECT_EQ(ro->peak_memory_bytes, ro->plan.bytes.total()) << "plan == measured peak";
  const ParamTable table = BuildParams(MakeArchDims(mem.model.config));
  ASSERT_EQ(steps.size(), 12u);
  for (const StepReport& r : steps) {
    // Every chunk past the embeddings' updates during backward; the embeddings' chunks after it.
    EXPECT_GT(r.offload_updated_during_backward, table.total / 4) << "step " << r.step;
    EXPECT_LT(r.offload_updated_during_backward, table.total) << "step " << r.step;
  }
  std::printf("[%s] %lld of %lld parameters updated during backward each step\n", c.arch,
              static_cast<long long>(steps[0].offload_updated_during_backward),
              static_cast<long long>(table.total));
  bool noted = false;
  for (const std::string& n : notes) noted = noted || n.find("while backward") != std::string::npos;
  EXPECT_TRUE(noted) << "the job says its update runs during backward";
}

INSTANTIATE_TEST_SUITE_P(NoClipping, OffloadEarlyUpdate,
                         ::testing::Values(EarlyCase{"fp32", "nvme", "gpt2", false},
                                           EarlyCase{"bf16", "cpu", "gpt2", true},
                                           EarlyCase{"bf16", "nvme", "llama", false},
                                           EarlyCase{"fp32", "cpu", "mixtral", true}),
                         [](const auto& info) {
                           return std::string(info.param.precision) + "_" + info.param.offload + "_" +
                                  info.param.arch + (info.param.checkpointing ? "_ckpt" : "");
                         });

// OffloadOptions::update_on_host (what a cuda or simt job uses: the gradients down, the update by
// a CPU backend in host memory, the weights up, through the backend's HostStaging), here on a CPU
// arena, where the host's kernels are the device's: for every optimizer, 4 steps over 4 tensors
// (one of them larger than a chunk, decay on three; AdamW's 5 chunks and SGD's and 8-bit AdamW's
// groups reuse both staging slots within a step) end bit-identical to the in-memory optimizer, and the store
// holds the same state (the checkpoint file is the same bytes); AdamW also when its chunks update
// during backward (BeginStep, GradientsFinalFrom twice, then Step). The offloaded optimizer's own
// arena (the device's) holds nothing: its state windows are on the host, and the plan says so.
// The host-update tests' model: four tensors (one spanning several 4096-element chunks, decay on
// three), the optimizer `optim` (SGD with momentum), and a host vector copied into `arena`.
std::vector<ParamInfo> HostUpdateParams(int64_t* n) {
  *n = 20164;
  return {{"a.weight", {64, 200}, {64, 200}, 0, 12800, true},
          {"a.bias", {64}, {64}, 12800, 64, false},
          {"b.weight", {80, 80}, {80, 80}, 12864, 6400, true},
          {"c.weight", {30, 30}, {30, 30}, 19264, 900, true}};
}
TrainingSpec HostUpdateSpec(const std::string& optim) {
  TrainingSpec t;
  t.optim = optim;
  t.weight_decay = 0.1;
  if (t.optim == "sgd") t.optim_args.momentum = 0.9;
  return t;
}
float* ToArena(DeviceArena* arena, const std::vector<float>& host) {
  auto r = arena->Allocate(MemoryCategory::kWeights, static_cast<int64_t>(host.size() * 4), "test");
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return nullptr;
  arena->backend()->CopyHostToDevice(*r, host.data(), host.size() * 4);
  return static_cast<float*>(*r);
}

TEST(OffloadHostUpdate, EveryOptimizerBitIdenticalToInMemory) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = HostUpdateParams(&n);
  for (const char* optim : {"adamw", "sgd", "adamw_8bit", "adafactor"}) {
    SCOPED_TRACE(optim);
    auto backend = MakeCpuBackend(2);
    DeviceArena arena(backend.get(), 0);
    DeviceArena off_arena(backend.get(), 0);  // the offloaded optimizers' device memory only
    const TrainingSpec t = HostUpdateSpec(optim);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (float& x : p0) x = normal(rng);
    float* p_mem = ToArena(&arena, p0);
    float* p_off = ToArena(&arena, p0);
    float* p_early = ToArena(&arena, p0);
    float* grads = ToArena(&arena, g);
    auto mem = MakeOptimizer(t, params, n, &arena);
    ASSERT_TRUE(mem.ok()) << mem.status().ToString();
    auto store = offload::MakeHostStore();
    ASSERT_TRUE(store.ok());
    OffloadOptions oo;
    oo.group_state_bytes = 16384;  // AdamW: chunks of 4096 elements (5); SGD, 8-bit AdamW: 3-4 groups
    oo.update_on_host = true;
    oo.host_threads = 2;
    auto off = MakeOffloadedOptimizer(t, params, n, &off_arena, store->get(), oo);
    ASSERT_TRUE(off.ok()) << off.status().ToString();
    const bool adamw = t.optim == "adamw";
    auto store_early = offload::MakeHostStore();
    ASSERT_TRUE(store_early.ok());
    auto early = MakeOffloadedOptimizer(t, params, n, &off_arena, store_early->get(), oo);
    ASSERT_TRUE(early.ok()) << early.status().ToString();
    EXPECT_EQ((*early)->updates_during_backward(), adamw);
    for (int step = 1; step <= 4; ++step) {
      for (float& x : g) x = normal(rng);
      backend->CopyHostToDevice(grads, g.data(), g.size() * 4);
      (*mem)->Step(p_mem, grads, 1e-2 / step, 0.5f);
      (*off)->Step(p_off, grads, 1e-2 / step, 0.5f);
      ASSERT_TRUE((*off)->status().ok()) << (*off)->status().ToString();
      if (adamw) {
        (*early)->BeginStep(p_early, grads, 1e-2 / step, 0.5f);
        (*early)->GradientsFinalFrom(12864);  // chunk 4 only
        (*early)->GradientsFinalFrom(5000);   // chunks 3 and 2 (chunk 1 begins at 4096 < 5000)
        EXPECT_EQ((*early)->updated_during_backward(), n - 2 * 4096);
      }
      (*early)->Step(p_early, grads, 1e-2 / step, 0.5f);
      ASSERT_TRUE((*early)->status().ok()) << (*early)->status().ToString();
    }
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), e(static_cast<size_t>(n));
    backend->CopyDeviceToHost(a.data(), p_mem, a.size() * 4);
    backend->CopyDeviceToHost(b.data(), p_off, b.size() * 4);
    backend->CopyDeviceToHost(e.data(), p_early, e.size() * 4);
    backend->Synchronize();
    EXPECT_EQ(a, b) << "weights after 4 steps";
    EXPECT_EQ(a, e) << "weights after 4 steps (the second run)";
    EXPECT_NE(a, p0);
    EXPECT_EQ(off_arena.peak_bytes(), 0) << "state windows on the device";
    EXPECT_EQ(OffloadedOptimizerDeviceBytes(t, params, n, oo), 0);
    OffloadOptions on_device = oo;
    on_device.update_on_host = false;
    EXPECT_GT(OffloadedOptimizerDeviceBytes(t, params, n, on_device), 0);
    const std::string dir = testing::MakeTempDir("offload-host-update");
    ASSERT_TRUE((*mem)->WriteState(dir + "/mem.safetensors").ok());
    ASSERT_TRUE((*off)->WriteState(dir + "/off.safetensors").ok());
    EXPECT_EQ(testing::ReadFile(dir + "/mem.safetensors"), testing::ReadFile(dir + "/off.safetensors"));
  }
}

// What a 16-bit model keeps on the device with its master weights in the store: the bf16 copy of
// every weight and fp32 copies of some tensors (here a.bias and c.weight). MasterUpdated is the
// device-window path's refresh (the device cast); ComputeCopyOf where the host update uploads.
class FakeComputeCopy final : public MasterWeightsSink {
 public:
  FakeComputeCopy(Backend* be, DeviceArena* arena, const std::vector<ParamInfo>& params, int64_t n)
      : be_(be), n_(n) {
    w16_ = static_cast<uint16_t*>(*arena->Allocate(MemoryCategory::kWeights, n * 2, "w16"));
    for (const ParamInfo& p : params) {
      if (p.hf_name != "a.bias" && p.hf_name != "c.weight") continue;
      residents_.push_back({p.offset, p.numel, static_cast<float*>(*arena->Allocate(MemoryCategory::kWeights, p.numel * 4, p.hf_name))});
    }
  }
  void Publish(const float* host) {  // the initial weights, as the model publishes them
    std::vector<uint16_t> w16(static_cast<size_t>(n_));
    F32To16Span(true, host, n_, w16.data());
    be_->CopyHostToDevice(w16_, w16.data(), w16.size() * 2);
    for (const Fp32Piece& r : residents_) be_->CopyHostToDevice(r.device, host + r.offset, static_cast<size_t>(r.n) * 4);
  }
  void MasterUpdated(int64_t offset, const float* device, int64_t n) override {
    be_->Cast(w16_ + offset, DType::kBF16, device, DType::kF32, n);
    for (const Fp32Piece& r : residents_) {
      const int64_t a = std::max(offset, r.offset), b = std::min(offset + n, r.offset + r.n);
      if (a < b) be_->CopyDeviceToDevice(r.device + (a - r.offset), device + (a - offset), static_cast<size_t>(b - a) * 4);
    }
  }
  ComputeCopy ComputeCopyOf(int64_t offset, int64_t n) override {
    ComputeCopy c;
    c.type = DType::kBF16;
    c.weights16 = w16_ + offset;
    for (const Fp32Piece& r : residents_) {
      const int64_t a = std::max(offset, r.offset), b = std::min(offset + n, r.offset + r.n);
      if (a < b) c.fp32.push_back({a, b - a, r.device + (a - r.offset)});
    }
    return c;
  }
  // The bf16 copy and the fp32 pieces, read back.
  std::pair<std::vector<uint16_t>, std::vector<float>> Read() const {
    std::vector<uint16_t> w16(static_cast<size_t>(n_));
    be_->CopyDeviceToHost(w16.data(), w16_, w16.size() * 2);
    std::vector<float> fp32;
    for (const Fp32Piece& r : residents_) {
      const size_t at = fp32.size();
      fp32.resize(at + static_cast<size_t>(r.n));
      be_->CopyDeviceToHost(fp32.data() + at, r.device, static_cast<size_t>(r.n) * 4);
    }
    be_->Synchronize();
    return {w16, fp32};
  }

 private:
  Backend* be_;
  int64_t n_;
  uint16_t* w16_ = nullptr;
  std::vector<Fp32Piece> residents_;
};

// The master weights in the store, updated on the host: the model's compute copy goes up from the
// staging slots (the bf16 weights rounded on the host, the fp32 pieces as they are; no master
// window on the device). For AdamW (chunks) and SGD (groups), 4 steps: the bf16 copy and the fp32
// pieces are bit-identical to the device-window path's (the device cast of the updated master
// weights, MasterUpdated) and to the in-memory optimizer's weights rounded; the host path's
// device arena holds nothing.
TEST(OffloadHostUpdate, ComputeCopyGoesUpFromTheHostBitIdentical) {
  int64_t n = 0;
  const std::vector<ParamInfo> params = HostUpdateParams(&n);
  for (const char* optim : {"adamw", "sgd"}) {
    SCOPED_TRACE(optim);
    auto backend = MakeCpuBackend(2);
    DeviceArena arena(backend.get(), 0);
    const TrainingSpec t = HostUpdateSpec(optim);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> p0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (float& x : p0) x = normal(rng);
    float* p_mem = ToArena(&arena, p0);
    float* grads = ToArena(&arena, g);
    auto mem = MakeOptimizer(t, params, n, &arena);
    ASSERT_TRUE(mem.ok());
    struct Run {
      std::unique_ptr<FakeComputeCopy> model;
      std::unique_ptr<OptimizerStateStore> store;
      std::unique_ptr<DeviceArena> arena;
      std::unique_ptr<Optimizer> opt;
    };
    Run runs[2];  // 0: host update (ComputeCopyOf), 1: device window (MasterUpdated)
    for (int i = 0; i < 2; ++i) {
      runs[i].model = std::make_unique<FakeComputeCopy>(backend.get(), &arena, params, n);
      runs[i].model->Publish(p0.data());
      auto store = offload::MakeHostStore();
      ASSERT_TRUE(store.ok());
      runs[i].store = std::move(*store);
      runs[i].arena = std::make_unique<DeviceArena>(backend.get(), 0);
      OffloadOptions oo;
      oo.group_state_bytes = 16384;
      oo.master_weights = true;
      oo.master_sink = runs[i].model.get();
      oo.update_on_host = i == 0;
      oo.host_threads = 2;
      auto opt = MakeOffloadedOptimizer(t, params, n, runs[i].arena.get(), runs[i].store.get(), oo);
      ASSERT_TRUE(opt.ok()) << opt.status().ToString();
      runs[i].opt = std::move(*opt);
      MasterWeightsStore* master = runs[i].opt->master_weights_store();
      ASSERT_NE(master, nullptr);
      ASSERT_TRUE(master->PutMaster(0, p0.data(), n).ok());
      ASSERT_TRUE(master->CommitMaster().ok());
    }
    for (int step = 1; step <= 4; ++step) {
      for (float& x : g) x = normal(rng);
      backend->CopyHostToDevice(grads, g.data(), g.size() * 4);
      (*mem)->Step(p_mem, grads, 1e-2 / step, 0.5f);
      for (Run& r : runs) {
        r.opt->Step(nullptr, grads, 1e-2 / step, 0.5f);
        ASSERT_TRUE(r.opt->status().ok()) << r.opt->status().ToString();
      }
    }
    backend->Synchronize();
    const auto host = runs[0].model->Read();
    const auto window = runs[1].model->Read();
    EXPECT_TRUE(host.first == window.first) << "bf16 weights: host update vs device window";
    EXPECT_TRUE(host.second == window.second) << "fp32 pieces: host update vs device window";
    std::vector<float> w(static_cast<size_t>(n));
    backend->CopyDeviceToHost(w.data(), p_mem, w.size() * 4);
    backend->Synchronize();
    std::vector<uint16_t> w16(static_cast<size_t>(n));
    F32To16Span(true, w.data(), n, w16.data());
    EXPECT_TRUE(host.first == w16) << "bf16 weights: host update vs the in-memory optimizer's, rounded";
    std::vector<float> pieces(w.begin() + 12800, w.begin() + 12864);
    pieces.insert(pieces.end(), w.begin() + 19264, w.end());
    EXPECT_TRUE(host.second == pieces) << "fp32 pieces: host update vs the in-memory optimizer's";
    EXPECT_NE(host.first, std::vector<uint16_t>(static_cast<size_t>(n), 0));
    EXPECT_EQ(runs[0].arena->peak_bytes(), 0) << "nothing of the optimizer on the device";
    EXPECT_GT(runs[1].arena->peak_bytes(), 0);
  }
}

// A model export reads the master weights from the store in tensor-name order (h.0, h.1, h.10,
// ..., and within a block attn, ln_1, ln_2, mlp), not in flat order: Get keeps the two segments
// last used, so a block that straddles two chunks reads each once; what is still read again is a
// chunk shared by two blocks that name order visits apart (h.1 and h.2 around h.10-h.11). gpt2 of
// 12 layers, AdamW chunks of 1/16 of the parameters: the export's store reads over the master
// bytes, 1.25x measured, bound 1.5x (with the one cached segment Get had before: 3.81x).
TEST(OffloadMasterExport, NameOrderReadsEachChunkAboutOnce) {
  JobSpec spec = testing::TinySpec("/nonexistent", "/nonexistent/tokens.bin");
  ModelConfig& c = spec.model.config;
  c.vocab_size = 512;
  c.n_positions = 64;
  c.n_embd = 64;
  c.n_layer = 12;
  c.n_head = 4;
  const std::vector<ParamInfo> params = Model::TrainableParamsOf(c, JobModelOptions(spec, 1, false));
  ASSERT_FALSE(params.empty());
  int64_t n = 0;
  for (const ParamInfo& p : params) n = std::max(n, p.offset + p.numel);
  struct NullSink final : MasterWeightsSink {
    void MasterUpdated(int64_t, const float*, int64_t) override {}
    ComputeCopy ComputeCopyOf(int64_t, int64_t) override { return {}; }
  } sink;
  auto backend = MakeCpuBackend(1);
  DeviceArena arena(backend.get(), 0);
  auto store = offload::MakeHostStore();
  ASSERT_TRUE(store.ok());
  TrainingSpec t;
  OffloadOptions oo;
  oo.master_weights = true;
  oo.master_sink = &sink;
  auto opt = MakeOffloadedOptimizer(t, params, n, &arena, store->get(), oo);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  MasterWeightsStore* master = (*opt)->master_weights_store();
  ASSERT_NE(master, nullptr);
  std::vector<float> init(static_cast<size_t>(n));
  for (size_t i = 0; i < init.size(); ++i) init[i] = static_cast<float>(i % 1000) * 1e-3f;
  ASSERT_TRUE(master->PutMaster(0, init.data(), n).ok());
  ASSERT_TRUE(master->CommitMaster().ok());
  std::vector<ParamInfo> by_name = params;
  std::sort(by_name.begin(), by_name.end(),
            [](const ParamInfo& a, const ParamInfo& b) { return a.hf_name < b.hf_name; });
  const uint64_t before = (*store)->Stats().read_bytes;
  std::vector<float> got(static_cast<size_t>(n), -1.0f);
  for (const ParamInfo& p : by_name) {
    ASSERT_TRUE(master->GetMaster(p.offset, got.data() + p.offset, p.numel).ok()) << p.hf_name;
  }
  const double ratio = static_cast<double>((*store)->Stats().read_bytes - before) / (static_cast<double>(n) * 4);
  std::printf("master export of a 12-layer gpt2 (%lld parameters) in name order: store reads %.2fx the master bytes\n",
              static_cast<long long>(n), ratio);
  EXPECT_EQ(got, init);
  EXPECT_GE(ratio, 1.0);
  EXPECT_LT(ratio, 1.5);
}

// Saved with offload, resumed without it, and the other way round: both end bit-identical to an
// uninterrupted in-memory run (the checkpoint's optimizer state has one format). In bf16 the
// offloaded runs keep their fp32 master weights in the store (the checkpoint's model file is
// streamed out of it, and a resume streams it back in).
class OffloadResumeCross : public ::testing::TestWithParam<const char*> {};

TEST_P(OffloadResumeCross, CheckpointsCrossBetweenOffloadAndInMemory) {
  const bool bf16 = std::string(GetParam()) == "bf16";
  const std::string dir = testing::MakeTempDir("offload-resume");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 1200, 64, 5);
  auto spec = [&](const std::string& sub, const std::string& offload) {
    JobSpec s = testing::TinySpec(dir + "/" + sub, dir + "/tokens.bin");
    s.training.bf16 = bf16;
    s.training.max_steps = 6;
    s.training.save_steps = 2;
    s.training.offload = offload;
    if (offload == "nvme") s.training.offload_dir = dir + "/" + sub + "-store";
    return s;
  };
  const JobSpec a = spec("a", "none");
  ASSERT_TRUE(RunJob(a, Options(false), {}).ok());
  const std::string want = testing::ReadFile(a.output_dir + "/model.safetensors");

  for (const auto& [first, second] : {std::pair<std::string, std::string>{"nvme", "none"},
                                      std::pair<std::string, std::string>{"none", "nvme"},
                                      std::pair<std::string, std::string>{"cpu", "nvme"}}) {
    SCOPED_TRACE(first + " then " + second);
    const std::string sub = "b-" + first + "-" + second;
    std::atomic<bool> cancel{false};
    RunOptions o1 = Options(first != "none");
    o1.cancel = &cancel;
    RunCallbacks cb;
    cb.on_step = [&](const StepReport& r) {
      if (r.step == 3) cancel.store(true);
    };
    ASSERT_EQ(RunJob(spec(sub, first), o1, cb).status().code(), Status::Code::kCancelled);
    ASSERT_TRUE(fs::exists(dir + "/" + sub + "/out/checkpoint-2/optimizer.safetensors"));
    RunOptions o2 = Options(second != "none");
    o2.resume = true;
    JobSpec b2 = spec(sub, second);
    if (second == "nvme") b2.training.offload_dir = dir + "/" + sub + "-store2";
    auto r = RunJob(b2, o2, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(testing::ReadFile(b2.output_dir + "/model.safetensors"), want);
    EXPECT_EQ(testing::ReadFile(b2.output_dir + "/checkpoint-6/optimizer.safetensors"),
              testing::ReadFile(a.output_dir + "/checkpoint-6/optimizer.safetensors"));
    EXPECT_EQ(testing::ReadFile(b2.output_dir + "/checkpoint-6/model.safetensors"),
              testing::ReadFile(a.output_dir + "/checkpoint-6/model.safetensors"));
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, OffloadResumeCross, ::testing::Values("fp32", "bf16"));

// LoRA with offload in bf16/fp16: the frozen base is held on the device only in the compute type
// (plus the fp32 embeddings, norms and biases it reads in fp32); its fp32 copy is nowhere, and the
// merged export reads it again from init_from. Same adapters and same merged model, byte for byte,
// as the in-memory LoRA job that keeps the fp32 base on the device; the plan's weights drop by the
// fp32 copy of every GEMM weight, and the plan equals the measured peak.
struct LoraCase {
  const char* precision;  // bf16 | fp16
  const char* offload;    // cpu | nvme
  const char* arch;       // gpt2 | llama
};

class OffloadLora : public ::testing::TestWithParam<LoraCase> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("offload-lora");
    data_ = dir_ + "/tokens.bin";
    testing::WriteSyntheticTokens(data_, 1200, 64, 13);
    base_dir_ = dir_ + "/base";
    JobSpec s = testing::TinySpec(dir_, data_);
    config_ = std::string(GetParam().arch) == "llama" ? testing::TinyLlamaConfig({32, 64, 2, 4, 2, 32})
                                                      : s.model.config;
    testing::TestModel b = testing::TestModel::Make(config_, testing::TinyOptions(4, 16));
    ASSERT_NE(b.model, nullptr);
    b.model->InitRandom(99);
    fs::create_directories(base_dir_);
    ASSERT_TRUE(WriteSafetensors(base_dir_ + "/model.safetensors", b.model->ExportHf()).ok());
    testing::WriteFile(base_dir_ + "/config.json", WriteHfConfigJson(config_));
  }
  JobSpec Spec(const std::string& sub, bool offload) const {
    const LoraCase c = GetParam();
    JobSpec s = testing::TinySpec(dir_ + "/" + sub, data_);
    s.model.config = config_;
    s.model.init_from = base_dir_;
    PeftSpec p;
    p.r = 4;
    p.lora_alpha = 8;
    if (std::string(c.arch) == "gpt2") p.target_modules = {"c_attn", "c_proj", "c_fc"};
    p.merge = true;
    s.training.peft = p;
    s.training.learning_rate = 1e-2;
    s.training.bf16 = std::string(c.precision) == "bf16";
    s.training.fp16 = std::string(c.precision) == "fp16";
    s.training.max_steps = 10;
    s.training.save_steps = 5;
    s.training.gradient_accumulation_steps = 2;
    if (offload) {
      s.training.offload = c.offload;
      if (std::string(c.offload) == "nvme") s.training.offload_dir = dir_ + "/" + sub + "-store";
    }
    return s;
  }
  std::string dir_, data_, base_dir_;
  ModelConfig config_;
};

TEST_P(OffloadLora, FrozenBaseOnlyInTheComputeTypeSameAdaptersAndMergedModel) {
  const JobSpec mem = Spec("mem", false);
  const JobSpec off = Spec("off", true);
  auto rm = RunJob(mem, Options(false), {});
  ASSERT_TRUE(rm.ok()) << rm.status().ToString();
  std::vector<std::string> notes;
  RunCallbacks cb;
  cb.on_message = [&](const std::string& m) { notes.push_back(m); };
  auto ro = RunJob(off, Options(true), cb);
  ASSERT_TRUE(ro.ok()) << ro.status().ToString();

  for (const char* file : {"/adapter_model.safetensors", "/model.safetensors",
                           "/checkpoint-5/adapter_model.safetensors"}) {
    const std::string want = testing::ReadFile(mem.output_dir + file);
    ASSERT_FALSE(want.empty()) << file;
    EXPECT_EQ(want, testing::ReadFile(off.output_dir + file)) << file << " differs from the in-memory LoRA job's";
  }
  EXPECT_EQ(rm->train_loss, ro->train_loss);
  // The merged model moved away from the base (the adapters trained).
  EXPECT_NE(testing::ReadFile(off.output_dir + "/model.safetensors"),
            testing::ReadFile(base_dir_ + "/model.safetensors"));

  // A frozen LoRA base is held in the compute type only, with or without offload (qlora_test
  // checks the bytes of that plan): offload changes nothing of its device bytes.
  EXPECT_EQ(rm->plan.bytes.weights, ro->plan.bytes.weights)
      << "offload changes nothing of a frozen base's device bytes";
  EXPECT_EQ(ro->plan.offload_master_bytes, 0) << "the frozen base has no master weights in the store";
  EXPECT_EQ(ro->peak_memory_bytes, ro->plan.bytes.total()) << "plan == measured peak";
  bool noted = false;
  for (const std::string& n : notes) noted = noted || n.find("frozen base") != std::string::npos;
  EXPECT_TRUE(noted) << "the job says where its frozen base is";
}

INSTANTIATE_TEST_SUITE_P(Precisions, OffloadLora,
                         ::testing::Values(LoraCase{"bf16", "nvme", "gpt2"}, LoraCase{"fp16", "cpu", "gpt2"},
                                           LoraCase{"bf16", "cpu", "llama"}),
                         [](const auto& info) {
                           return std::string(info.param.precision) + "_" + info.param.offload + "_" +
                                  info.param.arch;
                         });

// The merged export reads the fp32 base again from init_from: a base rewritten while the job ran
// is refused there (one error naming init_from), not merged silently; the adapters are written.
class OffloadLoraBase : public OffloadLora {};

TEST_P(OffloadLoraBase, RewrittenDuringTheJobIsRefusedAtTheMerge) {
  const JobSpec off = Spec("rewritten", true);
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) {
    if (r.step != 2) return;
    testing::TestModel other = testing::TestModel::Make(config_, testing::TinyOptions(4, 16));
    other.model->InitRandom(7);
    ASSERT_TRUE(WriteSafetensors(base_dir_ + "/model.safetensors", other.model->ExportHf()).ok());
  };
  auto ro = RunJob(off, Options(true), cb);
  ASSERT_FALSE(ro.ok());
  std::printf("the job's error: %s\n", ro.status().ToString().c_str());
  EXPECT_EQ(ro.status().code(), Status::Code::kFailedPrecondition) << ro.status().ToString();
  EXPECT_NE(ro.status().message().find("init_from"), std::string::npos) << ro.status().ToString();
  EXPECT_TRUE(fs::exists(off.output_dir + "/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(off.output_dir + "/model.safetensors"));
}

INSTANTIATE_TEST_SUITE_P(Bf16, OffloadLoraBase, ::testing::Values(LoraCase{"bf16", "nvme", "gpt2"}),
                         [](const auto&) { return std::string("nvme_gpt2"); });

// training.sample_every with the master weights in the store (bf16, nvme): the samples come from
// the 16-bit compute weights (KvWeights), the job is planned (peak == plan, the master weights off
// the device) and training is unchanged by them (losses and weights bit-identical to the same
// offloaded job without samples).
TEST(OffloadSample, SamplesFromTheComputeWeightsLeaveTrainingUnchanged) {
  const std::string dir = testing::MakeTempDir("offload-sample");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 1200, 64, 17);
  auto spec = [&](const std::string& sub, int64_t every) {
    JobSpec s = testing::TinySpec(dir + "/" + sub, dir + "/tokens.bin");
    s.training.bf16 = true;
    s.training.max_steps = 6;
    s.training.sample_every = every;
    s.training.offload = "nvme";
    s.training.offload_dir = dir + "/" + sub + "-store";
    return s;
  };
  std::vector<double> plain_losses, sampled_losses;
  RunCallbacks plain;
  plain.on_step = [&](const StepReport& r) { plain_losses.push_back(r.loss); };
  auto a = RunJob(spec("plain", 0), Options(true), plain);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::vector<SampleReport> samples;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) { sampled_losses.push_back(r.loss); };
  cb.on_sample = [&](const SampleReport& r) { samples.push_back(r); };
  auto b = RunJob(spec("sampled", 2), Options(true), cb);
  ASSERT_TRUE(b.ok()) << b.status().ToString();

  EXPECT_EQ(sampled_losses, plain_losses);
  EXPECT_EQ(testing::ReadFile(dir + "/sampled/out/model.safetensors"),
            testing::ReadFile(dir + "/plain/out/model.safetensors"));
  const ParamTable table = BuildParams(MakeArchDims(spec("x", 2).model.config));
  EXPECT_EQ(b->plan.offload_master_bytes, 4 * table.total) << "the master weights stay off the device";
  EXPECT_EQ(b->plan.bytes.weights, a->plan.bytes.weights);
  EXPECT_EQ(b->peak_memory_bytes, b->plan.bytes.total()) << "plan == measured peak";
  ASSERT_EQ(samples.size(), 3u);
  for (const SampleReport& r : samples) {
    EXPECT_EQ(r.ids.size(), 24u);
    for (int32_t id : r.ids) EXPECT_TRUE(id >= 0 && id < 64) << id;
  }
  EXPECT_NE(samples[0].ids, samples[2].ids) << "the weights the samples read moved";
}

// An offload_dir that is a file, or in a read-only directory: the job fails before its first step
// with one error naming the directory; nothing of output_dir's earlier checkpoints is touched.
TEST(OffloadErrors, UnusableOffloadDirIsOneClearError) {
  const std::string dir = testing::MakeTempDir("offload-bad-dir");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 600, 64, 5);
  JobSpec s = testing::TinySpec(dir + "/run", dir + "/tokens.bin");
  s.training.max_steps = 2;
  s.training.offload = "nvme";
  { std::ofstream(dir + "/a-file") << "x"; }
  s.training.offload_dir = dir + "/a-file";
  auto r = RunJob(s, Options(true), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir + "/a-file"), std::string::npos) << r.status().ToString();

  if (geteuid() != 0) {  // root writes through a read-only mode
    fs::create_directories(dir + "/ro");
    chmod((dir + "/ro").c_str(), 0555);
    s.training.offload_dir = dir + "/ro/store";
    auto r2 = RunJob(s, Options(true), {});
    chmod((dir + "/ro").c_str(), 0755);
    ASSERT_FALSE(r2.ok());
    EXPECT_NE(r2.status().message().find(dir + "/ro"), std::string::npos) << r2.status().ToString();
  }
  // Without a store factory (an embedding program that did not wire offload/): FAILED_PRECONDITION.
  s.training.offload = "cpu";
  auto r3 = RunJob(s, testing::TestRunOptions(1), {});
  ASSERT_FALSE(r3.ok());
  EXPECT_EQ(r3.status().code(), Status::Code::kFailedPrecondition) << r3.status().ToString();
}

// Damages the data files (extension `ext`: RocksDB's ".blob", the value log's ".vlog") of an
// nvme store right after the commit of step `step` (bytes overwritten in place), before anything
// of that step is read back: commits run in the caller (CommitInCallerStore), so the damage lands
// between the commit and the next step's reads.
class DamageAfterCommit final : public offload::CommitInCallerStore {
 public:
  DamageAfterCommit(std::unique_ptr<OptimizerStateStore> store, std::string dir, std::string ext,
                    int64_t step)
      : CommitInCallerStore(std::move(store)), dir_(std::move(dir)), ext_(std::move(ext)), step_(step) {}
  int damaged() const { return damaged_; }
  Status Commit(int64_t step) override {
    TRAIND_RETURN_IF_ERROR(CommitInCallerStore::Commit(step));
    if (step == step_) Damage();
    return Status::Ok();
  }

 private:
  void Damage() {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      if (e.path().extension() != ext_) continue;
      const auto size = static_cast<std::streamoff>(fs::file_size(e.path(), ec));
      if (ec) continue;  // garbage-collected meanwhile
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      for (std::streamoff at = 64; at < size; at += 97) {
        f.seekp(at);
        f.put(static_cast<char>(0xA5));
      }
      ++damaged_;
    }
  }
  std::string dir_;
  std::string ext_;
  int64_t step_;
  int damaged_ = 0;
};

// The nvme store's data files damaged on disk between steps (bytes overwritten in place): the next
// step fails with DATA_LOSS naming the store's directory; it never trains on wrong state, and the
// checkpoint written before stays intact. Both nvme stores.
class OffloadDamage : public ::testing::TestWithParam<std::string> {};

TEST_P(OffloadDamage, DataFileDamagedBetweenStepsFailsTheJobWithDataLoss) {
  const bool rocksdb = GetParam() == "rocksdb";
  const std::string dir = testing::MakeTempDir("offload-damaged-" + GetParam());
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 600, 64, 5);
  JobSpec s = testing::TinySpec(dir + "/run", dir + "/tokens.bin");
  s.training.max_steps = 6;
  s.training.save_steps = 2;
  s.training.offload = "nvme";
  s.training.offload_dir = dir + "/store";
  auto opened = offload::MakeNvmeStore(dir + "/store", GetParam());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  DamageAfterCommit store(std::move(opened).value(), dir + "/store", rocksdb ? ".blob" : ".vlog", 3);
  RunOptions o = testing::TestRunOptions(2);
  o.optimizer_state_store = &store;
  auto r = RunJob(s, o, {});
  ASSERT_GT(store.damaged(), 0) << "the store wrote no data files";
  ASSERT_FALSE(r.ok()) << "a damaged store must fail the job";
  std::printf("the job's error: %s\n", r.status().ToString().c_str());
  EXPECT_EQ(r.status().code(), Status::Code::kDataLoss) << r.status().ToString();
  EXPECT_NE(r.status().message().find(dir + "/store"), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(fs::exists(s.output_dir + "/checkpoint-2/optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(s.output_dir + "/checkpoint-4")) << "no checkpoint after the damage";
}
INSTANTIATE_TEST_SUITE_P(Stores, OffloadDamage, ::testing::Values("rocksdb", "valuelog"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A store directory of one layout opened as the other: one clear error naming the directory,
// nothing of it removed (the RocksDB store's files stay for TRAIND_OFFLOAD_STORE=rocksdb).
TEST(OffloadErrors, StoreOfTheOtherLayoutIsRefused) {
  const std::string dir = testing::MakeTempDir("offload-layout");
  {
    auto r = offload::MakeRocksDbStore(dir + "/store");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  auto v = offload::MakeNvmeStore(dir + "/store");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), Status::Code::kFailedPrecondition) << v.status().ToString();
  EXPECT_NE(v.status().message().find(dir + "/store"), std::string::npos) << v.status().ToString();
  EXPECT_NE(v.status().message().find("RocksDB store"), std::string::npos) << v.status().ToString();
  EXPECT_TRUE(fs::exists(dir + "/store/CURRENT"));
  auto again = offload::MakeNvmeStore(dir + "/store", "rocksdb");
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  again = Status::Internal("closed");
  {
    auto r = offload::MakeValueLogStore(dir + "/vl");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  auto rdb = offload::MakeNvmeStore(dir + "/vl", "rocksdb");
  ASSERT_FALSE(rdb.ok());
  EXPECT_EQ(rdb.status().code(), Status::Code::kFailedPrecondition) << rdb.status().ToString();
  EXPECT_NE(rdb.status().message().find("value-log store"), std::string::npos) << rdb.status().ToString();
  auto bad = offload::MakeNvmeStore(dir + "/x", "leveldb");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("TRAIND_OFFLOAD_STORE"), std::string::npos);
}

// The group payload format: a round trip, and truncation or trailing bytes are DATA_LOSS naming
// where the payload came from.
TEST(OffloadFormat, StatePayloadRoundTripsAndRejectsTruncation) {
  SafetensorsFile f;
  f.metadata["format"] = "traind-adamw-v1";
  f.metadata["step"] = "3";
  const std::vector<float> v = {1, 2, 3};
  f.tensors["w.exp_avg"] = HostTensor::FromF32(v.data(), {3});
  const std::string payload = SerializeOptimizerState(f);
  auto back = ParseOptimizerState(payload, "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->tensors.at("w.exp_avg").data, f.tensors.at("w.exp_avg").data);
  EXPECT_EQ(back->tensors.at("w.exp_avg").shape, f.tensors.at("w.exp_avg").shape);
  EXPECT_EQ(back->metadata, f.metadata);
  for (size_t cut : {size_t{0}, size_t{3}, payload.size() / 2, payload.size() - 1}) {
    auto bad = ParseOptimizerState(payload.substr(0, cut), "group x of test");
    ASSERT_FALSE(bad.ok()) << "truncated at " << cut;
    EXPECT_EQ(bad.status().code(), Status::Code::kDataLoss);
    EXPECT_NE(bad.status().message().find("group x of test"), std::string::npos);
  }
  EXPECT_FALSE(ParseOptimizerState(payload + "x", "t").ok()) << "trailing bytes";
}


using testing::ProcStatusBytes;
using testing::StartPeakRss;

bool FilesEqual(const std::string& a, const std::string& b) {
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(size_t{1} << 20), bb(size_t{1} << 20);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() || std::memcmp(ba.data(), bb.data(), static_cast<size_t>(fa.gcount())) != 0) {
      return false;
    }
  }
  return fa.eof() && fb.eof();
}

// Resume with offload streams optimizer.safetensors into the store (transformers #17258: a resume
// that read the optimizer file whole was OOM-killed): an AdamW state of 128 MiB, a window of
// 2 x 4 MiB, a RocksDB store with 2 x 4 MiB memtables and 8 MiB write-behind: the process's RSS
// grows by less than 64 MiB while ReadState loads it (half the state; the whole-file path
// measured beside it grows by more than the state), and the store then holds exactly the file:
// written back out (streamed) it is byte-identical.
TEST(OffloadResume, ReadStateStreamsTheFileWithinTheWindow) {
  const std::string dir = testing::MakeTempDir("offload-stream-resume");
  std::vector<ParamInfo> params;
  int64_t n = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay) {
    ParamInfo p;
    p.hf_name = name;
    p.shape = shape;
    p.hf_shape = shape;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.offset = n;
    p.weight_decay = decay;
    n += p.numel;
    params.push_back(p);
  };
  add("transformer.wte.weight", {4096, 2048}, true);            // 8M elements
  add("transformer.h.0.mlp.c_fc.weight", {2048, 3072}, true);   // 6M
  add("transformer.h.0.mlp.c_fc.bias", {3072}, false);
  add("transformer.h.0.mlp.c_proj.weight", {1024, 2048}, true);  // 2M
  add("transformer.ln_f.weight", {2048}, false);
  const int64_t state_bytes = 8 * n;  // m and v, fp32
  ASSERT_GT(state_bytes, int64_t{120} << 20);

  // The checkpoint's file, written streamed with deterministic values (never whole in memory).
  const std::string file = dir + "/optimizer.safetensors";
  std::vector<StreamedTensor> specs;
  for (const ParamInfo& p : params) {
    specs.push_back({p.hf_name + ".exp_avg", "F32", p.shape});
    specs.push_back({p.hf_name + ".exp_avg_sq", "F32", p.shape});
  }
  std::map<std::string, std::string> metadata = {{"format", "traind-adamw-v1"}, {"step", "5"}};
  const Status written = WriteSafetensorsStreamed(file, metadata, specs, [&](size_t i, const SafetensorsSink& sink) -> Status {
    int64_t numel = 1;  // i: the index into `specs`
    for (int64_t d : specs[i].shape) numel *= d;
    std::vector<float> buf(1 << 16);
    for (int64_t at = 0; at < numel; at += static_cast<int64_t>(buf.size())) {
      const int64_t k = std::min<int64_t>(static_cast<int64_t>(buf.size()), numel - at);
      for (int64_t j = 0; j < k; ++j) {
        buf[static_cast<size_t>(j)] = static_cast<float>((at + j + 7 * static_cast<int64_t>(i)) % 1000) * 1e-3f;
      }
      if (!sink(buf.data(), static_cast<size_t>(k) * 4)) return Status::Internal("sink");
    }
    return Status::Ok();
  });
  ASSERT_TRUE(written.ok()) << written.ToString();

  TrainingSpec t;
  t.optim = "adamw";
  offload::StoreOptions so;
  so.write_buffer_bytes = size_t{4} << 20;
  so.max_write_buffers = 2;
  so.max_pending_write_bytes = size_t{8} << 20;
  so.max_prefetch_bytes = size_t{8} << 20;
  OffloadOptions oo;
  oo.group_state_bytes = int64_t{8} << 20;  // chunks of 1M elements: m + v = 8 MiB of window
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 0);

  std::vector<std::unique_ptr<OptimizerStateStore>> stores_;  // outlive the optimizers below
  auto load = [&](const std::string& store_dir, bool streamed, int64_t* growth) -> std::unique_ptr<Optimizer> {
    auto store = offload::MakeRocksDbStore(store_dir, so);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    if (!store.ok()) return nullptr;
    stores_.push_back(std::move(*store));
    auto opt = MakeOffloadedOptimizer(t, params, n, &arena, stores_.back().get(), oo);
    EXPECT_TRUE(opt.ok()) << opt.status().ToString();
    if (!opt.ok()) return nullptr;
    const int64_t before = StartPeakRss();
    Status s;
    if (streamed) {
      s = (*opt)->ReadState(file);
    } else {
      auto whole = ReadSafetensors(file);
      s = whole.ok() ? (*opt)->LoadState(*whole) : whole.status();
    }
    *growth = ProcStatusBytes("VmHWM") - before;
    EXPECT_TRUE(s.ok()) << s.ToString();
    return std::move(*opt);
  };

  int64_t streamed_growth = 0, whole_growth = 0;
  std::unique_ptr<Optimizer> opt = load(dir + "/store", true, &streamed_growth);
  ASSERT_NE(opt, nullptr);
  std::unique_ptr<Optimizer> whole = load(dir + "/store-whole", false, &whole_growth);
  ASSERT_NE(whole, nullptr);
  std::printf("optimizer state %.1f MiB: RSS growth while loading streamed %.1f MiB, whole %.1f MiB\n",
              static_cast<double>(state_bytes) / 1048576.0,
              static_cast<double>(streamed_growth) / 1048576.0,
              static_cast<double>(whole_growth) / 1048576.0);
  // The bound: the window (8 MiB) + the store's configured buffers (memtables 8, write-behind 8,
  // read-ahead 8 MiB) + 32 MiB for RocksDB's own (block cache, table and blob readers, thread
  // arenas): 64 MiB, half the state. Measured 43.5-51.7 MiB here (2 loaded cores); the whole-file
  // path 304 MiB (the file, the flat m/v copies, the store).
  EXPECT_LT(streamed_growth, int64_t{64} << 20)
      << "streamed resume must stay near the window and the store's buffers";
  EXPECT_GT(whole_growth, state_bytes) << "the measurement must see a whole-file read";

  EXPECT_EQ(opt->step(), 5);
  ASSERT_TRUE(opt->WriteState(dir + "/again.safetensors").ok());
  EXPECT_TRUE(FilesEqual(file, dir + "/again.safetensors"))
      << "the store must hold exactly the checkpoint's state";
}

// The other optimizers' streamed resume (one group's tensors at a time through its transient
// instance): after ReadState their state written back out equals the in-memory optimizer's file.
TEST(OffloadResume, ReadStateOfEveryOptimizerEqualsTheFile) {
  const std::string dir = testing::MakeTempDir("offload-stream-resume-all");
  std::vector<ParamInfo> params;
  int64_t n = 0;
  for (int i = 0; i < 6; ++i) {
    ParamInfo p;
    p.hf_name = "h." + std::to_string(i) + (i % 2 == 0 ? ".weight" : ".bias");
    p.shape = i % 2 == 0 ? std::vector<int64_t>{64, 96} : std::vector<int64_t>{96};
    p.hf_shape = p.shape;
    p.numel = i % 2 == 0 ? 64 * 96 : 96;
    p.offset = n;
    p.weight_decay = i % 2 == 0;
    n += p.numel;
    params.push_back(p);
  }
  std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    w[static_cast<size_t>(i)] = static_cast<float>(i % 17) * 0.01f;
    g[static_cast<size_t>(i)] = static_cast<float>(i % 13) * 0.003f - 0.02f;
  }
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 0);
  OffloadOptions oo;
  oo.group_state_bytes = 16 << 10;  // several groups
  for (const char* name : {"adamw", "sgd", "adafactor", "adamw_8bit"}) {
    SCOPED_TRACE(name);
    TrainingSpec t;
    t.optim = name;
    t.optim_args.momentum = 0.9;
    auto mem = MakeOptimizer(t, params, n, &arena);
    ASSERT_TRUE(mem.ok()) << mem.status().ToString();
    for (int s = 0; s < 3; ++s) (*mem)->Step(w.data(), g.data(), 1e-3, 1.0f);
    const std::string file = dir + "/" + name + ".safetensors";
    ASSERT_TRUE((*mem)->WriteState(file).ok());
    auto store = offload::MakeNvmeStore(dir + "/" + name + "-store");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto off = MakeOffloadedOptimizer(t, params, n, &arena, store->get(), oo);
    ASSERT_TRUE(off.ok()) << off.status().ToString();
    ASSERT_TRUE((*off)->ReadState(file).ok());
    EXPECT_EQ((*off)->step(), 3);
    ASSERT_TRUE((*off)->WriteState(file + ".again").ok());
    EXPECT_TRUE(FilesEqual(file, file + ".again"));
    // A file of another optimizer is DATA_LOSS, as LoadState's.
    const std::string other = dir + (std::string(name) == "sgd" ? "/adamw" : "/sgd") + ".safetensors";
    if (fs::exists(other)) {
      auto again = MakeOffloadedOptimizer(t, params, n, &arena, store->get(), oo);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ((*again)->ReadState(other).code(), Status::Code::kDataLoss);
    }
  }
}

// The offload_dir's file system fills mid-run (a 40 MiB tmpfs; after step 3 a filler file leaves
// about 6 MiB, less than the store's space check asks for any write: the memtables' and queued
// bytes + the chunk + 8 MiB, offload/README.md "Errors"): step 4 fails the job with
// RESOURCE_EXHAUSTED naming the directory, checkpoint-2 (output_dir is on another disk) is intact,
// and resumed with the store elsewhere the job finishes bit-identical to an uninterrupted run.
TEST(OffloadErrors, DiskFullMidRunFailsTheJobAndTheLastCheckpointResumes) {
  const std::string dir = testing::MakeTempDir("offload-disk-full");
  testing::WriteSyntheticTokens(dir + "/tokens.bin", 1200, 64, 5);
  const std::string mnt = dir + "/small-fs";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=41943040,mode=0755") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN): the job-level disk-full path is not exercised";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  auto spec = [&](const std::string& sub, const std::string& store) {
    JobSpec s = testing::TinySpec(dir + "/" + sub, dir + "/tokens.bin");
    s.training.max_steps = 6;
    s.training.save_steps = 2;
    if (!store.empty()) {
      s.training.offload = "nvme";
      s.training.offload_dir = store;
    }
    return s;
  };
  RunOptions o = testing::TestRunOptions(2);
  o.open_optimizer_state_store = [](const TrainingSpec& t) {
    offload::StoreOptions so;  // small buffers, so the space check fits a 40 MiB file system
    so.write_buffer_bytes = 2 << 20;
    so.blob_file_bytes = 2 << 20;
    so.max_pending_write_bytes = 1 << 20;
    return offload::MakeNvmeStore(*t.offload_dir, "", so);
  };
  const JobSpec a = spec("a", "");
  ASSERT_TRUE(RunJob(a, testing::TestRunOptions(2), {}).ok());

  const std::string store = mnt + "/store";
  const JobSpec b = spec("b", store);
  int64_t filled_after = -1;
  RunCallbacks cb;
  cb.on_step = [&](const StepReport& r) {
    if (r.step != 3) return;
    const auto space = fs::space(mnt);
    const uint64_t fill = space.available > (6u << 20) ? space.available - (6u << 20) : 0;
    std::ofstream filler(mnt + "/filler", std::ios::binary);
    std::vector<char> ones(1 << 20, 1);
    for (uint64_t done = 0; done < fill; done += ones.size()) {
      filler.write(ones.data(), static_cast<std::streamsize>(std::min<uint64_t>(ones.size(), fill - done)));
    }
    filled_after = r.step;
  };
  auto r = RunJob(b, o, cb);
  ASSERT_EQ(filled_after, 3) << "the job never reached step 3: " << r.status().ToString();
  ASSERT_FALSE(r.ok()) << "the job finished with its store's file system full";
  std::printf("the job's error: %s\n", r.status().ToString().c_str());
  EXPECT_EQ(r.status().code(), Status::Code::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find(store), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(fs::exists(b.output_dir + "/checkpoint-2/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(b.output_dir + "/checkpoint-2/model.safetensors"));
  EXPECT_FALSE(fs::exists(b.output_dir + "/checkpoint-4")) << "a checkpoint after the failure";
  EXPECT_FALSE(fs::exists(b.output_dir + "/model.safetensors")) << "a final model of a failed job";

  // The operator moves the store to a disk with room: the resume loads checkpoint-2 and finishes.
  RunOptions o2 = o;
  o2.resume = true;
  JobSpec b2 = b;
  b2.training.offload_dir = dir + "/store-elsewhere";
  auto r2 = RunJob(b2, o2, {});
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->global_step, 6);
  EXPECT_EQ(testing::ReadFile(b2.output_dir + "/model.safetensors"),
            testing::ReadFile(a.output_dir + "/model.safetensors"));
  EXPECT_EQ(testing::ReadFile(b2.output_dir + "/checkpoint-6/optimizer.safetensors"),
            testing::ReadFile(a.output_dir + "/checkpoint-6/optimizer.safetensors"));
}

}  // namespace
}  // namespace traind::engine
