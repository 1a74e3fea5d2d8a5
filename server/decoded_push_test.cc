#include "server/decoded_push.h"

#include <limits>
#include <memory>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

// Tensor "w" of 8 elements in partitions of 4 on one shard.
class DecodePushTest : public ::testing::Test {
 protected:
  DecodePushTest() {
    common::PartitionConfig partitioning;
    partitioning.max_partition_elements = 4;
    store_ = std::make_unique<TensorStore>(partitioning, 0, std::vector<int>{0},
                                           TensorStore::SlotSpec{}, 1);
    TensorSpec spec;
    spec.set_name("w");
    spec.add_shape(8);
    spec.set_dtype(DTYPE_F32);
    EXPECT_TRUE(store_->Register(spec).ok());
  }

  static GradientPart* AddDense(PushRequest& request, uint32_t partition,
                                std::vector<float> values) {
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->mutable_key()->set_partition(partition);
    common::EncodeDense(values, DTYPE_F32, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    return part;
  }

  // Partitions `a` and `b` of "w", each all ones.
  static PushRequest TwoParts(uint32_t a, uint32_t b) {
    PushRequest request;
    AddDense(request, a, {1, 1, 1, 1});
    AddDense(request, b, {1, 1, 1, 1});
    return request;
  }

  // What DecodePush answers for `request`.
  absl::Status Decoded(const PushRequest& request, int max_parts = 10) {
    return DecodePush(wire::ViewOf(request), *store_, max_parts, &metrics_).status();
  }

  double Refused() {
    return metrics_.requests_refused("max_parts_per_request").Value();
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::unique_ptr<TensorStore> store_;
};

TEST_F(DecodePushTest, PartsComeBackInPartitionOrderWithTheirRequestIndex) {
  PushRequest request;
  AddDense(request, 1, {1, 2, 3, 4})->set_version(7);
  AddDense(request, 0, {5, 6, 7, 8});
  const wire::PushView view = wire::ViewOf(request);
  auto parts = DecodePush(view, *store_, 10, &metrics_);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].partition->index, 0);
  EXPECT_EQ((*parts)[0].request_index, 1u);
  EXPECT_EQ((*parts)[1].partition->index, 1);
  EXPECT_EQ((*parts)[1].request_index, 0u);
  EXPECT_EQ((*parts)[1].version, 7);
  EXPECT_TRUE((*parts)[1].dense);
}

TEST_F(DecodePushTest, ASparsePartIsDecodedIntoScratch) {
  PushRequest request;
  GradientPart* part = request.add_parts();
  part->mutable_key()->set_tensor("w");
  part->mutable_key()->set_partition(1);
  Payload* payload = part->mutable_grad();
  payload->set_encoding(ENCODING_SPARSE);
  payload->set_dtype(DTYPE_F32);
  const std::vector<uint32_t> indices = {2, 2};  // repeated indices add up
  const std::vector<float> values = {1.5f, 2.0f};
  payload->set_indices(std::string(reinterpret_cast<const char*>(indices.data()),
                                   indices.size() * sizeof(uint32_t)));
  payload->set_data(std::string(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float)));
  const wire::PushView view = wire::ViewOf(request);
  auto parts = DecodePush(view, *store_, 10, &metrics_);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_FALSE(parts->front().dense);
  EXPECT_EQ(std::vector<float>(parts->front().decoded.begin(), parts->front().decoded.end()),
            std::vector<float>({0, 0, 3.5f, 0}));
  TrimDecodeScratch();
}

TEST_F(DecodePushTest, BadPushesAreRefusedWithTheirReason) {
  absl::Status status = Decoded(TwoParts(0, 0));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("appears twice"));

  PushRequest short_part;
  AddDense(short_part, 0, {1, 2, 3});
  status = Decoded(short_part);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("w/0"));

  PushRequest not_finite;
  AddDense(not_finite, 0, {1, 2, std::numeric_limits<float>::infinity(), 4});
  status = Decoded(not_finite);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("w/0: "));
  EXPECT_THAT(status.message(), HasSubstr("NaN and Inf are rejected"));

  PushRequest unknown;
  AddDense(unknown, 0, {1, 2, 3, 4})->mutable_key()->set_tensor("v");
  EXPECT_EQ(Decoded(unknown).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Decoded(PushRequest()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Refused(), 0);
}

TEST_F(DecodePushTest, TooManyPartsAreRefusedAndCounted) {
  EXPECT_TRUE(Decoded(TwoParts(0, 1), /*max_parts=*/2).ok());
  const absl::Status status = Decoded(TwoParts(0, 1), /*max_parts=*/1);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("--max_parts_per_request"));
  EXPECT_EQ(Refused(), 1);
}

}  // namespace
}  // namespace shardtrain::server
