#include "sparse/step_gradients.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::sparse {
namespace {

using ::testing::ElementsAre;

TEST(StepGradientsTest, TheMeanOverTheWorkersInIdOrder) {
  StepGradients step(/*dim=*/2, /*num_workers=*/2);
  const std::vector<uint64_t> ids0 = {30, 10};
  const std::vector<float> grads0 = {1, 2, 3, 4};
  const std::vector<uint64_t> ids1 = {10, 20};
  const std::vector<float> grads1 = {10, 20, 5, 6};
  step.Add(0, ids0, grads0.data());
  EXPECT_TRUE(step.arrived(0));
  EXPECT_FALSE(step.arrived(1));
  EXPECT_FALSE(step.complete());
  step.Add(1, ids1, grads1.data());
  EXPECT_TRUE(step.complete());
  EXPECT_EQ(step.rows(), 3);
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  step.TakeMean(&ids, &grads);
  EXPECT_THAT(ids, ElementsAre(10, 20, 30));
  // id 10: (3 + 10) / 2, (4 + 20) / 2; ids named once: half their gradient.
  EXPECT_THAT(grads, ElementsAre(6.5f, 12.0f, 2.5f, 3.0f, 0.5f, 1.0f));
}

TEST(StepGradientsTest, TakeMeanStartsAnEmptyStep) {
  StepGradients step(1, 1);
  const std::vector<uint64_t> ids = {7};
  const std::vector<float> grads = {4};
  step.Add(0, ids, grads.data());
  ASSERT_TRUE(step.complete());
  std::vector<uint64_t> out_ids;
  std::vector<float> out_grads;
  step.TakeMean(&out_ids, &out_grads);
  EXPECT_THAT(out_grads, ElementsAre(4.0f));
  EXPECT_FALSE(step.arrived(0));
  EXPECT_EQ(step.arrivals(), 0);
  EXPECT_EQ(step.rows(), 0);
  step.TakeMean(&out_ids, &out_grads);
  EXPECT_TRUE(out_ids.empty());
  EXPECT_TRUE(out_grads.empty());
}

TEST(StepGradientsTest, AnEmptyPushCountsAsAnArrival) {
  StepGradients step(4, 2);
  step.Add(1, {}, nullptr);
  EXPECT_TRUE(step.arrived(1));
  EXPECT_EQ(step.rows(), 0);
  step.Clear();
  EXPECT_FALSE(step.arrived(1));
}

TEST(StepGradientsTest, AnExportedStepSumsOnBitForBit) {
  StepGradients step(2, 3);
  const std::vector<uint64_t> ids0 = {9, 4};
  const std::vector<float> g0 = {0.1f, 0.2f, 0.3f, 0.4f};
  step.Add(0, ids0, g0.data());
  std::string bytes;
  std::vector<uint32_t> arrived;
  step.Export(&bytes, &arrived);
  EXPECT_THAT(arrived, ElementsAre(0u));
  StepGradients copy(2, 3);
  ASSERT_TRUE(copy.Import(bytes, arrived).ok());
  EXPECT_TRUE(copy.arrived(0));
  EXPECT_EQ(copy.arrivals(), 1);
  const std::vector<uint64_t> ids = {4, 7};
  const std::vector<float> g = {1e-8f, 0.5f, 2.0f, 3.0f};
  for (StepGradients* s : {&step, &copy}) {
    s->Add(1, ids, g.data());
    s->Add(2, ids0, g0.data());
  }
  std::vector<uint64_t> a_ids, b_ids;
  std::vector<float> a, b;
  step.TakeMean(&a_ids, &a);
  copy.TakeMean(&b_ids, &b);
  EXPECT_EQ(a_ids, b_ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(StepGradientsTest, ImportRefusesABadStepAndKeepsItsOwn) {
  StepGradients step(1, 2);
  const std::vector<uint64_t> ids = {5};
  const float g = 1.0f;
  step.Add(0, ids, &g);
  std::string good;
  std::vector<uint32_t> arrived;
  step.Export(&good, &arrived);
  StepGradients other(1, 2);
  EXPECT_EQ(other.Import(good.substr(1), arrived).code(), absl::StatusCode::kInvalidArgument);
  std::string repeated(2 * sizeof(uint64_t) + 2 * sizeof(float), '\0');
  std::memcpy(repeated.data(), &ids[0], sizeof(uint64_t));
  std::memcpy(repeated.data() + sizeof(uint64_t), &ids[0], sizeof(uint64_t));
  EXPECT_EQ(other.Import(repeated, arrived).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> outside = {2};
  EXPECT_EQ(other.Import(good, outside).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> twice = {1, 1};
  EXPECT_EQ(other.Import(good, twice).code(), absl::StatusCode::kInvalidArgument);
  std::string nan = good;
  const float bad = std::nanf("");
  std::memcpy(nan.data() + 8, &bad, sizeof(bad));
  EXPECT_EQ(other.Import(nan, arrived).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.arrivals(), 0);
  EXPECT_EQ(other.rows(), 0);
}

}  // namespace
}  // namespace shardtrain::sparse
