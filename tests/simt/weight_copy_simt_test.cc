// The 16-bit weight copy of a bf16 job on the GPU backend is made ONCE per optimizer step, after
// the update (StepRunner::IssueOptimizer -> Model::ParamsChanged: one Cast of the whole flat
// table, inside the step that CUDA graphs capture), never per use (per GEMM, per layer or per
// micro-batch). A GpuBackend under simt that counts the conversions reading the fp32 weights runs
// steps of a tiny bf16 GPT-2 and a tiny bf16 llama through the StepRunner (3 micro-batches a
// step; op by op, so each op call is seen: a captured step records these same calls once).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/arena.h"
#include "backend/backend.h"
#include "backend/cuda/gpu_backend.h"
#include "models/model.h"
#include "optim/adamw.h"
#include "train/step_runner.h"
#include "../engine/model_test_util.h"

namespace traind::engine {
namespace {

// The simt GPU backend with the CPU's GEMM run in place (no capture needed: graphs are off) and
// a log of the weight conversions and optimizer updates, in issue order.
class CountingGpu final : public gpu::GpuBackend {
 public:
  CountingGpu() : GpuBackend("simt-counting"), cpu_(MakeCpuBackend(1)) {}
  Status Start() { return Init(); }
  void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc,
            DType ab_type, DType c_type) override {
    cpu_->Gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab_type, c_type);
  }
  void Cast(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) override {
    const auto* s = static_cast<const float*>(src);
    if (src_type == DType::kF32 && dst_type != DType::kF32 && weights_ != nullptr &&
        s >= weights_ && s < weights_ + n_weights_) {
      events.push_back("cast " + std::to_string(n));
    }
    GpuBackend::Cast(dst, dst_type, src, src_type, n);
  }
  void AdamWRunsFromScalars(float* param, const float* grad, float* m, float* v,
                            const AdamWRun* runs, int64_t n_runs, const StepScalars* s,
                            float beta1, float beta2, float eps) override {
    events.push_back("adamw");
    GpuBackend::AdamWRunsFromScalars(param, grad, m, v, runs, n_runs, s, beta1, beta2, eps);
  }
  void Watch(const float* weights, int64_t n) {
    weights_ = weights;
    n_weights_ = n;
  }
  std::vector<std::string> events;

 private:
  std::unique_ptr<Backend> cpu_;
  const float* weights_ = nullptr;
  int64_t n_weights_ = 0;
};

void ExpectOneCopyPerStep(Arch arch) {
  auto gpu = std::make_unique<CountingGpu>();
  ASSERT_TRUE(gpu->Start().ok());
  CountingGpu* be = gpu.get();
  const ModelConfig c = arch == Arch::kGpt2 ? testing::TinyGpt2() : testing::TinyLlama(false);
  ModelOptions o = testing::TinyOptions(2, 11);
  o.compute_type = DType::kBF16;
  DeviceArena arena(be, 0);
  auto m = Model::Create(c, o, &arena);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::unique_ptr<Model> model = std::move(m).value();
  model->InitRandom(3);
  auto opt = AdamWOptimizer::Create(model->trainable_params(), model->num_trainable(),
                                    AdamWOptions{}, &arena);
  ASSERT_TRUE(opt.ok()) << opt.status().ToString();
  StepRunner::Options so;
  so.accumulation_steps = 3;
  so.use_graphs = false;  // every op call reaches the counting backend
  auto runner = StepRunner::Create(so, model.get(), opt->get(), &arena);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  be->Watch(model->param_data(), model->num_params());
  std::mt19937 rng(9);
  auto next = [&](int32_t* in, int32_t* tg, double* wait) {
    for (int64_t i = 0; i < 2 * 11; ++i) {
      in[i] = static_cast<int32_t>(rng() % 67);
      tg[i] = static_cast<int32_t>(rng() % 67);
    }
    *wait += 0.0;
    return Status::Ok();
  };
  const std::vector<std::string> want = {"adamw", "cast " + std::to_string(model->num_params())};
  for (int step = 0; step < 3; ++step) {
    be->events.clear();
    double wait = 0.0;
    auto r = (*runner)->Run(next, 1e-3, 1.0f, &wait);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // The first forward may refresh a stale copy (after InitRandom) before the micro-batches.
    std::vector<std::string> got = be->events;
    if (step == 0 && !got.empty() && got.front() != "adamw") got.erase(got.begin());
    EXPECT_EQ(got, want) << "step " << step
                         << ": one whole-table copy after the update, none per use";
  }
  EXPECT_TRUE(be->status().ok()) << be->status().ToString();
}

TEST(WeightCopy, Gpt2Bf16IsCopiedOncePerStepAfterTheUpdate) { ExpectOneCopyPerStep(Arch::kGpt2); }
TEST(WeightCopy, LlamaBf16IsCopiedOncePerStepAfterTheUpdate) { ExpectOneCopyPerStep(Arch::kLlama); }

}  // namespace
}  // namespace traind::engine
