#include "worker/model/mlp_layout.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/device/cpu/cpu_backend.h"

namespace shardtrain::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec Spec(const char* text) { return ModelSpec::Parse(text).value(); }

TEST(MlpLayoutTest, WholeModelIsLinearReluPairsEndingInLinear) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  const ModelSpec spec = Spec("mlp:6-5-4-3");
  ASSERT_EQ(NumLinearLayers(spec), 3);
  ASSERT_OK_AND_ASSIGN(MlpSection whole,
                       BuildMlpSection(spec, 0, 3, backend.get()));
  ASSERT_EQ(whole.layers.size(), 5u);
  std::vector<int> widths;
  for (const auto& layer : whole.layers) widths.push_back(layer->out_dim());
  EXPECT_THAT(widths, ElementsAre(5, 5, 4, 4, 3));
  // Only Linear layers hold parameters; ReLUs sit between them.
  EXPECT_EQ(whole.layers[1]->num_params(), 0);
  EXPECT_EQ(whole.layers[3]->num_params(), 0);

  std::vector<std::string> names;
  for (const ParamInfo& p : whole.params) names.push_back(p.name);
  EXPECT_THAT(names, ElementsAre("fc0.weight", "fc0.bias", "fc1.weight",
                                 "fc1.bias", "fc2.weight", "fc2.bias"));
  EXPECT_THAT(whole.params[2].shape, ElementsAre(5, 4));
  EXPECT_THAT(whole.params[3].shape, ElementsAre(4));
  EXPECT_EQ(whole.params[0].init, Init::kHeUniform);
  EXPECT_EQ(whole.params[1].init, Init::kZeros);
  EXPECT_EQ(whole.params[4].init, Init::kGlorotUniform);

  // Each slot names a buffer of its parameter's size.
  ASSERT_EQ(whole.slots.size(), whole.params.size());
  for (size_t i = 0; i < whole.params.size(); ++i) {
    const ParamSlot slot = whole.slots[i];
    EXPECT_EQ(static_cast<int64_t>(
                  whole.layers[slot.layer]->param(slot.local)->size()),
              NumElements(whole.params[i]))
        << whole.params[i].name;
  }
}

TEST(MlpLayoutTest, SectionsConcatenateToTheWholeModel) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  const ModelSpec spec = Spec("mlp:7-6-5-4-3");
  ASSERT_OK_AND_ASSIGN(MlpSection whole,
                       BuildMlpSection(spec, 0, 4, backend.get()));
  ASSERT_OK_AND_ASSIGN(MlpSection front,
                       BuildMlpSection(spec, 0, 1, backend.get()));
  ASSERT_OK_AND_ASSIGN(MlpSection back,
                       BuildMlpSection(spec, 1, 4, backend.get()));
  // A section not at the end keeps the ReLU after its last Linear.
  EXPECT_EQ(front.layers.size(), 2u);
  EXPECT_EQ(back.layers.size(), 5u);
  std::vector<ParamInfo> joined = front.params;
  joined.insert(joined.end(), back.params.begin(), back.params.end());
  ASSERT_EQ(joined.size(), whole.params.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    EXPECT_EQ(joined[i].name, whole.params[i].name);
    EXPECT_EQ(joined[i].shape, whole.params[i].shape);
    EXPECT_EQ(joined[i].init, whole.params[i].init);
  }
  // Slots index layers of their own section.
  EXPECT_EQ(back.slots[0].layer, 0);
  EXPECT_EQ(back.slots[2].layer, 2);
}

TEST(MlpLayoutTest, RejectsBadRangesSpecsAndBackends) {
  std::unique_ptr<Backend> backend = MakeCpuBackend();
  const ModelSpec spec = Spec("mlp:6-5-4-3");
  const auto code = [&](const ModelSpec& s, int first, int end, Backend* b) {
    return BuildMlpSection(s, first, end, b).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(spec, 0, 4, backend.get()), kInvalid);
  EXPECT_EQ(code(spec, -1, 2, backend.get()), kInvalid);
  EXPECT_EQ(code(spec, 2, 2, backend.get()), kInvalid);
  EXPECT_EQ(code(spec, 0, 3, nullptr), kInvalid);
  ModelSpec one_size;
  one_size.layer_sizes = {4};
  EXPECT_EQ(code(one_size, 0, 1, backend.get()), kInvalid);
}

TEST(MlpLayoutTest, ChecksNameTheModelAndTheProblem) {
  const std::vector<ParamInfo> params = {{"fc0.weight", {2, 3}, Init::kZeros}};
  EXPECT_OK(CheckParamAccess("Mlp", params, 0, 6));
  absl::Status status = CheckParamAccess("Mlp", params, 1, 6);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("Mlp: parameter index 1"));
  status = CheckParamAccess("PipelineModel", params, 0, 5);
  EXPECT_THAT(status.message(),
              HasSubstr("PipelineModel: parameter fc0.weight has 6 values"));

  const float x[2] = {0, 0};
  const int32_t labels[2] = {0, 3};
  EXPECT_OK(CheckBatch("Mlp", x, labels, 1, 4, 3));
  status = CheckBatch("Mlp", x, labels, 2, 4, 3);
  EXPECT_THAT(status.message(), HasSubstr("label 3 of example 1"));
  EXPECT_EQ(CheckBatch("Mlp", x, labels, 5, 4, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckBatch("Mlp", nullptr, labels, 1, 4, 4).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardtrain::worker
