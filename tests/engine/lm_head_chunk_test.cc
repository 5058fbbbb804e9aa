// The lm-head + cross-entropy in chunks of rows (ModelOptions::logits_chunk_rows): the same loss
// and gradients as one chunk over all rows (float reassociation only), on both forward paths
// (host loss and ForwardOnDevice), fp32 and bf16, and the (B*T, vocab) logits buffer gone from
// the plan of the small gpt2.
#include <gtest/gtest.h>

#include "model_test_util.h"
#include "models/layout.h"

namespace traind::engine {
namespace {

using testing::TestModel;

struct LossAndGrads {
  double loss = 0;
  std::vector<float> grads;
};

LossAndGrads ForwardBackward(const ModelConfig& c, ModelOptions o, int64_t chunk_rows, bool on_device) {
  o.logits_chunk_rows = chunk_rows;
  TestModel t = TestModel::Make(c, o);
  EXPECT_NE(t.model, nullptr);
  t.model->InitRandom(5);
  const int64_t N = o.micro_batch * o.seq_len;
  testing::SetBatch(t, testing::MakeBatch(N, c.vocab_size, 9));
  t.model->ZeroGrad();
  LossAndGrads r;
  if (on_device) {
    // grad scale and loss weight 1/(valid targets), as the step runner folds them.
    const testing::Batch b = testing::MakeBatch(N, c.vocab_size, 9);
    int64_t valid = 0;
    for (int32_t x : b.targets) valid += x != -1;
    const float w = 1.0f / static_cast<float>(valid);
    float* scalars = static_cast<float*>(t.backend->Alloc(64));
    double* sum = static_cast<double*>(t.backend->Alloc(64));
    const float host[2] = {w, w};
    const double zero = 0;
    t.backend->CopyHostToDevice(scalars, host, sizeof(host));
    t.backend->CopyHostToDevice(sum, &zero, sizeof(zero));
    t.model->ForwardOnDevice(scalars, scalars + 1, sum);
    t.backend->CopyDeviceToHost(&r.loss, sum, sizeof(double));
    t.backend->Synchronize();
    t.backend->Free(scalars);
    t.backend->Free(sum);
  } else {
    r.loss = t.model->Forward(true, 1.0f);
  }
  t.model->Backward();
  r.grads = testing::ToHost(*t.backend, t.model->grad_data(), t.model->num_trainable());
  return r;
}

class LmHeadChunkTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(LmHeadChunkTest, ChunkedLossAndGradientsEqualOneChunk) {
  const auto& [arch, bf16] = GetParam();
  const ModelConfig c = arch == "gpt2" ? testing::TinyGpt2() : testing::TinyLlama(true);
  ModelOptions o = testing::TinyOptions(3, 16);  // N = 48 rows
  if (bf16) o.compute_type = DType::kBF16;
  const double tol = bf16 ? 1e-5 : 1e-6;
  for (bool on_device : {false, true}) {
    const LossAndGrads whole = ForwardBackward(c, o, 48, on_device);
    for (int64_t rows : {7, 16, 47}) {  // ragged last chunks, and an exact split
      const LossAndGrads chunked = ForwardBackward(c, o, rows, on_device);
      EXPECT_NEAR(chunked.loss, whole.loss, tol * std::abs(whole.loss))
          << rows << " rows, on_device " << on_device;
      EXPECT_LT(testing::RelErr(chunked.grads, whole.grads), tol)
          << rows << " rows, on_device " << on_device;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, LmHeadChunkTest,
                         ::testing::Combine(::testing::Values("gpt2", "llama"),
                                            ::testing::Bool()));

// The small gpt2 of the benches (6 layers, d384, vocab 50304, B8, T256): the default chunk is 512
// of the 2048 rows, so the plan drops by the other 1536 rows of logits (309 MB).
TEST(LmHeadChunkPlanTest, TheSmallGpt2PlanLosesTheWholeLogits) {
  const ModelConfig c = testing::SmallGpt2();
  ModelOptions o = testing::TinyOptions(8, 256);
  const ArchDims d = MakeArchDims(c);
  EXPECT_EQ(LogitsChunkRows(d, o), 512);
  const MemoryBytes chunked = Model::PlanBytes(c, o);
  o.logits_chunk_rows = 8 * 256;
  const MemoryBytes whole = Model::PlanBytes(c, o);
  EXPECT_EQ(whole.total() - chunked.total(), (2048 - 512) * d.Vp * 4);
  EXPECT_GT(whole.total() - chunked.total(), 300'000'000);
}

}  // namespace
}  // namespace traind::engine
