// DeviceArena: byte accounting by category, the high-water mark, zeroed memory, release, and
// RESOURCE_EXHAUSTED errors that name what was being allocated.
#include "backend/arena.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/backend.h"

namespace traind::engine {
namespace {

TEST(DeviceArena, CountsBytesByCategoryAndPeak) {
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 0);
  auto w = arena.Allocate(MemoryCategory::kWeights, 1000, "w");
  auto a = arena.Allocate(MemoryCategory::kActivations, 300, "a");
  auto t = arena.Allocate(MemoryCategory::kTemporary, 24, "t");
  ASSERT_TRUE(w.ok() && a.ok() && t.ok());
  EXPECT_EQ(arena.used_bytes(), 1324);
  EXPECT_EQ(arena.used_by_category().weights, 1000);
  EXPECT_EQ(arena.used_by_category().activations, 300);
  EXPECT_EQ(arena.used_by_category().temporary, 24);
  EXPECT_EQ(arena.used_by_category().gradients, 0);
  // Zeroed memory.
  std::vector<unsigned char> host(1000, 0xff);
  be->CopyDeviceToHost(host.data(), *w, host.size());
  for (unsigned char c : host) ASSERT_EQ(c, 0);
  arena.Release(*a);
  EXPECT_EQ(arena.used_bytes(), 1024);
  EXPECT_EQ(arena.used_by_category().activations, 0);
  EXPECT_EQ(arena.peak_bytes(), 1324);
  auto g = arena.Allocate(MemoryCategory::kGradients, 100, "g");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(arena.peak_bytes(), 1324);
  EXPECT_EQ(arena.used_bytes(), 1124);
}

TEST(DeviceArena, BudgetExceededNamesTheBuffer) {
  auto be = MakeCpuBackend(1);
  DeviceArena arena(be.get(), 4096);
  ASSERT_TRUE(arena.Allocate(MemoryCategory::kWeights, 4000, "weights").ok());
  auto r = arena.Allocate(MemoryCategory::kActivations, 200, "block 3 activations");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kResourceExhausted);
  EXPECT_NE(r.status().message().find("block 3 activations"), std::string::npos);
  EXPECT_NE(r.status().message().find("4096"), std::string::npos) << r.status().message();
  EXPECT_EQ(arena.used_bytes(), 4000);
  // Exactly at the budget still fits.
  EXPECT_TRUE(arena.Allocate(MemoryCategory::kTemporary, 96, "t").ok());
}

}  // namespace
}  // namespace traind::engine
