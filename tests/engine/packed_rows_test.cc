// Packing of instruction examples (data.packing, data/packing.h, ExampleSet::OfPackedRows) and the
// decoders' example rows (ModelOptions::example_rows: doc_start and positions with each batch):
//  - best-fit decreasing on planted sizes (order, best fit, ties);
//  - the packed rows' ids, targets, doc_start and positions on planted examples;
//  - packed and unpacked batches give the loss and gradients of the examples run one by one
//    through the same engine as plain rows (fp32, cpu, within 1e-6), for learned positions
//    (gpt2), RoPE with GQA (llama) and a sliding window (mistral);
//  - a packed job: gradient accumulation equals one big batch, the plan counts the rows buffers
//    and equals the measured peak within 2%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "data/example_data.h"
#include "data/instruction_data.h"
#include "data/packing.h"
#include "job_run_util.h"
#include "model_test_util.h"
#include "train/planner.h"
#include "train/step_runner.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

using Rows = std::vector<std::vector<int64_t>>;

TEST(Packing, BestFitDecreasingOnPlantedSizes) {
  // Longest first: 9, 8, 7, 6, 5 each open a row (rooms 1, 2, 3, 4, 5 of 10); 3 fills the row of
  // 7 exactly, 2 the row of 8, 1 the row of 9 (best fit, not first fit: first fit would put 3
  // into the row of 6).
  EXPECT_EQ(PackBestFitDecreasing({5, 9, 3, 7, 2, 8, 1, 6}, 10),
            (Rows{{1, 6}, {4, 5}, {2, 3}, {7}, {0}}));
  // Equal sizes in file order; equal rooms: the row opened first.
  EXPECT_EQ(PackBestFitDecreasing({4, 4, 4}, 10), (Rows{{0, 1}, {2}}));
  EXPECT_EQ(PackBestFitDecreasing({6, 6, 3}, 9), (Rows{{0, 2}, {1}}));
  // Full rows; nothing; one row.
  EXPECT_EQ(PackBestFitDecreasing({10, 10}, 10), (Rows{{0}, {1}}));
  EXPECT_EQ(PackBestFitDecreasing({}, 10), Rows{});
  EXPECT_EQ(PackBestFitDecreasing({1, 2, 3}, 6), (Rows{{0, 1, 2}}));
  // Every index exactly once, no row over capacity, on a larger random set.
  std::mt19937 rng(3);
  std::vector<int64_t> sizes(500);
  for (int64_t& s : sizes) s = 1 + static_cast<int64_t>(rng() % 64);
  const Rows rows = PackBestFitDecreasing(sizes, 64);
  std::vector<int> seen(sizes.size(), 0);
  int64_t total = 0;
  for (const auto& r : rows) {
    int64_t fill = 0;
    for (int64_t i : r) fill += sizes[static_cast<size_t>(i)], ++seen[static_cast<size_t>(i)];
    EXPECT_LE(fill, 64);
    total += fill;
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  std::printf("[packing] 500 examples of 1..64 into rows of 64: %zu rows, %.1f%% filled\n",
              rows.size(), 100.0 * static_cast<double>(total) / (64.0 * rows.size()));
  EXPECT_LE(rows.size(), static_cast<size_t>(total / 64 + 1) + 10);  // near the lower bound
}

struct Ex {
  std::vector<int32_t> ids, labels;
};

Ex MakeEx(std::vector<int32_t> ids, std::vector<int32_t> labels) { return Ex{std::move(ids), std::move(labels)}; }

// Concatenated ids, labels and lengths, as LoadInstructionData hands them to ExampleSet.
struct Flat {
  std::vector<int32_t> ids, labels, lengths;
};
Flat Flatten(const std::vector<Ex>& ex) {
  Flat f;
  for (const Ex& e : ex) {
    f.ids.insert(f.ids.end(), e.ids.begin(), e.ids.end());
    f.labels.insert(f.labels.end(), e.labels.begin(), e.labels.end());
    f.lengths.push_back(static_cast<int32_t>(e.ids.size()));
  }
  return f;
}

struct Filled {
  std::vector<int32_t> in, tg, mask;  // mask: doc_start (B*T) then positions (B*T)
};
Filled Fill(const ExampleSet& set, int64_t B) {
  ExampleData data;
  data.pad_id = 0;
  const int64_t T = set.seq_len();
  Filled f;
  f.in.resize(static_cast<size_t>(B * T));
  f.tg.resize(static_cast<size_t>(B * T));
  f.mask.resize(static_cast<size_t>(2 * B * T));
  std::vector<int64_t> rows(static_cast<size_t>(B)), epochs(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) rows[static_cast<size_t>(b)] = b < set.size() ? b : -1;
  FillExampleBatch(data, set, rows.data(), epochs.data(), B, f.in.data(), f.tg.data(), f.mask.data());
  return f;
}

TEST(Packing, PackedRowsIdsTargetsDocStartsAndPositions) {
  const int32_t X = -100;
  // Positions taken (ids - 1, at least 1): 3, 8 (11 ids kept to T + 1 = 9), 1, 1, 3.
  const std::vector<Ex> ex = {
      MakeEx({10, 11, 12, 13}, {X, 11, 12, 13}),
      MakeEx({20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30}, {X, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30}),
      MakeEx({30, 31}, {X, 31}),
      MakeEx({40}, {X}),
      MakeEx({50, 51, 52, 53}, {X, X, 52, 53}),
  };
  Flat f = Flatten(ex);
  const ExampleSet set = ExampleSet::OfPackedRows(f.ids, f.labels, f.lengths, 8, 0);
  ASSERT_EQ(set.size(), 2);  // {example 1} fills a row; {0, 2, 3, 4} the other
  EXPECT_TRUE(set.packed());
  EXPECT_EQ(set.MaskWords(), 2);
  const Filled got = Fill(set, 3);  // the third row empty
  using V = std::vector<int32_t>;
  auto part = [](const V& v, int64_t from, int64_t n = 8) {
    return V(v.begin() + from, v.begin() + from + n);
  };
  EXPECT_EQ(part(got.in, 0), (V{20, 21, 22, 23, 24, 25, 26, 27}));
  EXPECT_EQ(part(got.tg, 0), (V{21, 22, 23, 24, 25, 26, 27, 28}));
  EXPECT_EQ(part(got.mask, 0), (V{0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(part(got.mask, 24), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  // Row 1: example 0 (3 positions), 2 (1), 3 (1: its one id, no target), 4 (3; its first label
  // -100). Nothing is predicted across examples: each example's last target is its own last id.
  EXPECT_EQ(part(got.in, 8), (V{10, 11, 12, 30, 40, 50, 51, 52}));
  EXPECT_EQ(part(got.tg, 8), (V{11, 12, 13, 31, -1, -1, 52, 53}));
  EXPECT_EQ(part(got.mask, 8), (V{0, 0, 0, 3, 4, 5, 5, 5}));
  EXPECT_EQ(part(got.mask, 32), (V{0, 1, 2, 0, 0, 0, 1, 2}));
  // The empty row: padding, each position its own example.
  EXPECT_EQ(part(got.in, 16), (V{0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(part(got.tg, 16), (V{-1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(part(got.mask, 16), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(part(got.mask, 40), (V{0, 0, 0, 0, 0, 0, 0, 0}));

  // A part-filled row: the padding after the examples.
  Flat one = Flatten({ex[0]});
  const Filled pad = Fill(ExampleSet::OfPackedRows(one.ids, one.labels, one.lengths, 8, 7), 1);
  EXPECT_EQ(pad.in, (V{10, 11, 12, 7, 7, 7, 7, 7}));
  EXPECT_EQ(pad.tg, (V{11, 12, 13, -1, -1, -1, -1, -1}));
  EXPECT_EQ(pad.mask, (V{0, 0, 0, 3, 4, 5, 6, 7, 0, 1, 2, 0, 0, 0, 0, 0}));

  // Unpacked rows: one example a row (its min(ids, T) tokens), then the padding as above.
  const Filled rows = Fill(ExampleSet::OfLabelledRows(f.ids, f.labels, f.lengths, 8, 0), 5);
  EXPECT_EQ(part(rows.in, 0), (V{10, 11, 12, 13, 0, 0, 0, 0}));
  EXPECT_EQ(part(rows.tg, 0), (V{11, 12, 13, -1, -1, -1, -1, -1}));
  EXPECT_EQ(part(rows.mask, 0), (V{0, 0, 0, 0, 4, 5, 6, 7}));
  EXPECT_EQ(part(rows.mask, 40), (V{0, 1, 2, 3, 0, 0, 0, 0}));
  EXPECT_EQ(part(rows.tg, 8), (V{21, 22, 23, 24, 25, 26, 27, 28}));
  EXPECT_EQ(part(rows.mask, 8), (V{0, 0, 0, 0, 0, 0, 0, 0}));
}

// ---- the model: packed rows equal the examples run one by one ----

// Examples of 1 to 20 ids (20 > T + 1: truncated) with some -100 labels.
std::vector<Ex> ModelExamples(int64_t V) {
  std::mt19937 rng(9);
  std::vector<Ex> ex;
  for (int n : {9, 5, 13, 3, 7, 2, 20, 1, 11, 4}) {
    Ex e;
    for (int i = 0; i < n; ++i) {
      e.ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(V)));
      e.labels.push_back(i == 0 || rng() % 5 == 0 ? -100 : e.ids.back());
    }
    ex.push_back(std::move(e));
  }
  return ex;
}

struct LossGrads {
  double loss_sum = 0.0;  // sum of the token losses
  int64_t count = 0;      // tokens that carry loss
  std::vector<double> grads;  // d(loss_sum)/d(params)
};

// Forward + backward of `set`'s rows in one micro-batch of B = set.size() rows.
LossGrads RunRows(const ModelConfig& config, const ExampleSet& set, bool example_rows,
                  const std::vector<float>& params, int threads) {
  ModelOptions o = testing::TinyOptions(set.size(), set.seq_len());
  o.example_rows = example_rows;
  testing::TestModel t = testing::TestModel::Make(config, o, threads);
  LossGrads r;
  r.grads.assign(params.size(), 0.0);
  if (t.model == nullptr) return r;
  Model& m = *t.model;
  Backend& be = *t.backend;
  be.CopyHostToDevice(m.param_data(), params.data(), params.size() * sizeof(float));
  m.ParamsChanged();
  const Filled f = Fill(set, set.size());
  be.CopyHostToDevice(m.inputs(), f.in.data(), f.in.size() * sizeof(int32_t));
  be.CopyHostToDevice(m.targets(), f.tg.data(), f.tg.size() * sizeof(int32_t));
  if (example_rows) {
    EXPECT_NE(m.attention_mask(), nullptr);
    be.CopyHostToDevice(m.attention_mask(), f.mask.data(), f.mask.size() * sizeof(int32_t));
  } else {
    EXPECT_EQ(m.attention_mask(), nullptr);
  }
  for (int32_t x : f.tg) r.count += x != -1;
  if (r.count == 0) return r;  // nothing to learn (an example whose labels are all -100)
  m.ZeroGrad();
  const double mean = m.Forward(/*for_backward=*/true, 1.0f);
  m.Backward();
  r.loss_sum = mean * static_cast<double>(r.count);
  const std::vector<float> g = testing::ToHost(be, m.grad_data(), m.num_params());
  r.grads.assign(g.begin(), g.end());
  for (double& x : r.grads) x *= static_cast<double>(r.count);
  return r;
}

void ExpectPackedEqualsOneByOne(const std::string& family) {
  const ModelConfig config = family == "gpt2" ? testing::TinyGpt2() : testing::TinyFamily(family);
  const int64_t T = 16;
  const std::vector<Ex> ex = ModelExamples(config.vocab_size);
  // The parameters: one seeded init, shared by every model below.
  std::vector<float> params;
  {
    testing::TestModel t = testing::TestModel::Make(config, testing::TinyOptions(1, T));
    ASSERT_NE(t.model, nullptr);
    t.model->InitRandom(5);
    params = testing::ToHost(*t.backend, t.model->param_data(), t.model->num_params());
  }
  // Reference: each example alone, a plain row of its own (no example rows: today's path).
  LossGrads ref;
  ref.grads.assign(params.size(), 0.0);
  for (const Ex& e : ex) {
    Flat one = Flatten({e});
    const LossGrads r = RunRows(config, ExampleSet::OfLabelledRows(one.ids, one.labels, one.lengths, T, 0),
                                /*example_rows=*/false, params, 1);
    ref.loss_sum += r.loss_sum;
    ref.count += r.count;
    for (size_t i = 0; i < r.grads.size(); ++i) ref.grads[i] += r.grads[i];
  }
  ASSERT_GT(ref.count, 20);
  Flat all = Flatten(ex);
  for (bool packed : {true, false}) {
    const ExampleSet set = packed ? ExampleSet::OfPackedRows(all.ids, all.labels, all.lengths, T, 0)
                                  : ExampleSet::OfLabelledRows(all.ids, all.labels, all.lengths, T, 0);
    if (packed) {
      EXPECT_LT(set.size(), static_cast<int64_t>(ex.size()) / 2) << "packing put several a row";
    }
    for (int threads : {1, 2}) {
      const LossGrads got = RunRows(config, set, /*example_rows=*/true, params, threads);
      const std::string what = family + (packed ? " packed" : " one a row") + ", " +
                               std::to_string(set.size()) + " rows, threads " + std::to_string(threads);
      ASSERT_EQ(got.count, ref.count) << what;
      // The step's loss and gradients (sums over the tokens / their count, as training takes them).
      const double n = static_cast<double>(ref.count);
      EXPECT_NEAR(got.loss_sum / n, ref.loss_sum / n, 1e-6) << what;
      double worst = 0.0, largest = 0.0;
      for (size_t i = 0; i < ref.grads.size(); ++i) {
        worst = std::max(worst, std::abs(got.grads[i] - ref.grads[i]) / n);
        largest = std::max(largest, std::abs(ref.grads[i]) / n);
      }
      std::printf("[packed-model] %s: loss %.9f vs %.9f, worst gradient diff %.3g (largest %.3g)\n",
                  what.c_str(), got.loss_sum / n, ref.loss_sum / n, worst, largest);
      EXPECT_LE(worst, 1e-6) << what;
      EXPECT_GT(largest, 1e-3) << what;  // gradients that could differ
    }
  }
  // Without the rows (one sequence a row) the packed batch is another computation: the examples
  // see each other and their positions run on.
  const ExampleSet set = ExampleSet::OfPackedRows(all.ids, all.labels, all.lengths, T, 0);
  ModelOptions o = testing::TinyOptions(set.size(), T);
  o.example_rows = true;
  testing::TestModel t = testing::TestModel::Make(config, o);
  ASSERT_NE(t.model, nullptr);
  t.backend->CopyHostToDevice(t.model->param_data(), params.data(), params.size() * sizeof(float));
  t.model->ParamsChanged();
  const Filled f = Fill(set, set.size());
  testing::SetBatch(t, testing::Batch{f.in, f.tg});  // the rows Create filled: one sequence a row
  const double mean = t.model->Forward(false, 1.0f);
  EXPECT_GT(std::abs(mean - ref.loss_sum / static_cast<double>(ref.count)), 1e-4) << family;
}

TEST(PackedModel, Gpt2PackedAndUnpackedEqualTheExamplesOneByOne) { ExpectPackedEqualsOneByOne("gpt2"); }
TEST(PackedModel, LlamaPackedAndUnpackedEqualTheExamplesOneByOne) { ExpectPackedEqualsOneByOne("llama_head_dim"); }
TEST(PackedModel, MistralPackedAndUnpackedEqualTheExamplesOneByOne) { ExpectPackedEqualsOneByOne("mistral"); }

// ---- a packed job ----

// 40 conversations (testing::Conversations) packed into rows of 128 (testing::ChatJobSpec).
JobSpec PackedSpec(const std::string& dir) {
  testing::WriteChatFiles(dir, 40);
  JobSpec spec = testing::ChatJobSpec(dir, dir + "/chat.jsonl", dir + "/t.jinja", /*seq_len=*/128);
  spec.data.packing = true;
  return spec;
}

TEST(PackedTraining, AccumulationTwoByTwoEqualsFourByOne) {
  const std::string dir = testing::MakeTempDir("packed-accum");
  {
    JobSpec spec = PackedSpec(dir);
    auto data = LoadInstructionData(spec.data, "");
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    EXPECT_TRUE(data->train.packed());
    std::printf("[packed-accum] 40 conversations in %lld packed rows of 128\n",
                static_cast<long long>(data->train.size()));
    EXPECT_LT(data->train.size(), 30);
  }
  testing::ExpectAccumulationMatchesBatch(PackedSpec(dir), dir, "packed-accum");
}

// The plan holds the example rows (doc_start and positions: 2 B T int32 in the model and in each
// of the two upload slots) and equals the measured peak within 2% (TrainerPlan's bound).
TEST(PackedTraining, PlanCountsTheRowsAndMatchesThePeak) {
  const std::string dir = testing::MakeTempDir("packed-plan");
  JobSpec spec = PackedSpec(dir);
  spec.training.per_device_train_batch_size = 4;
  spec.training.max_steps = 1;
  const int64_t B = 4, T = spec.data.seq_len;
  JobSpec stream = spec;
  stream.data.format = "tokens";
  stream.data.packing = false;
  const int64_t with = JobBytes(spec.model.config, JobModelOptions(spec, B, false, false)).total();
  const int64_t without = JobBytes(stream.model.config, JobModelOptions(stream, B, false, false)).total();
  EXPECT_EQ(with - without, 2 * B * T * 4 + 2 * (2 * B * T * 4));
  EXPECT_EQ(StepRunner::PlanBytes(B, T, 2) - StepRunner::PlanBytes(B, T), 2 * (2 * B * T * 4));
  RunOptions o = testing::TestRunOptions();
  auto est = EstimateJob(spec, o.device);
  ASSERT_TRUE(est.ok()) << est.status().ToString();
  auto r = RunJob(spec, o, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double planned = static_cast<double>(est->bytes.total());
  const double peak = static_cast<double>(r->peak_memory_bytes);
  EXPECT_EQ(r->plan.bytes.total(), est->bytes.total());
  EXPECT_LE(std::abs(peak - planned) / planned, 0.02) << "planned " << planned << " peak " << peak;
  std::printf("[packed-plan] planned %.0f measured peak %.0f (%+.3f%%)\n", planned, peak,
              100.0 * (peak - planned) / planned);
}

// Packing is for instruction examples: stream data and the encoders refuse it by name.
TEST(PackedTraining, PackingOnStreamDataIsAnError) {
  const std::string dir = testing::MakeTempDir("packed-stream");
  {
    std::ofstream(dir + "/text.jsonl") << "{\"text\": \"hello there\"}\n{\"text\": \"more text here\"}\n";
  }
  JobSpec spec = testing::TinySpec(dir + "/out", dir + "/text.jsonl");
  spec.model.config.vocab_size = 256;
  spec.data.format = "jsonl";
  spec.data.tokenizer = "byte";
  spec.data.packing = true;
  spec.data.validation_split = 0.0;
  auto r = RunJob(spec, testing::TestRunOptions(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("data.packing: " + dir + "/text.jsonl holds text lines"),
            std::string::npos)
      << r.status().ToString();
}

}  // namespace
}  // namespace traind::engine
