// LR schedules and the clip coefficient: LrLambda against torch's LambdaLR driven by the HF
// schedule formulas (reference/optim_schedule_reference.py), plus hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "optim/adamw.h"
#include "optim/schedule.h"
#include "trainer_test_util.h"

namespace traind::engine {
namespace {

TEST(LrSchedule, HandValues) {
  // cosine, warmup 2 of 6: 0, 0.5, then 0.5*(1+cos(pi*k/4)) for k = 0..3, 0 at the end.
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kCosine, 2, 6, 0), 0.0);
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kCosine, 2, 6, 1), 0.5);
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kCosine, 2, 6, 2), 1.0);
  EXPECT_NEAR(LrLambda(LrScheduleType::kCosine, 2, 6, 4), 0.5, 1e-15);
  EXPECT_NEAR(LrLambda(LrScheduleType::kCosine, 2, 6, 6), 0.0, 1e-15);
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kLinear, 0, 10, 3), 0.7);
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kLinear, 0, 10, 12), 0.0);  // clamped past the end
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kConstant, 4, 10, 1), 0.25);
  EXPECT_DOUBLE_EQ(LrLambda(LrScheduleType::kConstant, 4, 10, 9), 1.0);
}

TEST(LrSchedule, ParseNames) {
  EXPECT_TRUE(ParseLrScheduleType("cosine").ok());
  Result<LrScheduleType> bad = ParseLrScheduleType("cosine_with_restarts");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("training.lr_scheduler_type"), std::string::npos);
}

TEST(LrSchedule, MatchesTorchLambdaLRWithHfFormulas) {
  if (!testing::HaveTorch()) GTEST_SKIP() << "SKIPPED: " << TRAIND_TEST_PYTHON << " has no torch";
  std::string out;
  ASSERT_EQ(testing::RunPython("optim_schedule_reference.py", "", &out), 0) << out;
  nlohmann::json ref = nlohmann::json::parse(out);
  int cases = 0;
  for (auto& [key, lrs] : ref.items()) {
    const auto slash1 = key.find('/');
    const auto slash2 = key.rfind('/');
    const std::string kind = key.substr(0, slash1);
    const int64_t warmup = std::stoll(key.substr(slash1 + 1, slash2 - slash1 - 1));
    const int64_t total = std::stoll(key.substr(slash2 + 1));
    const LrScheduleType type = ParseLrScheduleType(kind).value();
    for (size_t s = 0; s < lrs.size(); ++s) {
      // Same double formulas; allow a few ulps for cos implementations.
      EXPECT_NEAR(LrLambda(type, warmup, total, static_cast<int64_t>(s)), lrs[s].get<double>(),
                  1e-12)
          << key << " step " << s;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 18);
}

TEST(ClipCoefficient, TorchRule) {
  // clip_coef = max_norm / (total_norm + 1e-6), applied only when < 1.
  EXPECT_FLOAT_EQ(ClipCoefficient(2.0, 1.0), 1.0f / (2.0f + 1e-6f));
  EXPECT_EQ(ClipCoefficient(0.5, 1.0), 1.0f);
  EXPECT_LT(ClipCoefficient(1.0, 1.0), 1.0f);  // 1 / (1 + 1e-6): torch scales here too
  EXPECT_EQ(ClipCoefficient(100.0, 0.0), 1.0f);  // disabled
  EXPECT_LT(ClipCoefficient(1.001, 1.0), 1.0f);
}

}  // namespace
}  // namespace traind::engine
