#include "sparse/step_gradients.h"

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

}  // namespace
}  // namespace shardtrain::sparse
