#include "client/wire_requests.h"

#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

using ::testing::HasSubstr;

// Tensor 0 ("a", 100 elements) in partitions [0, 40) and [40, 100); tensor
// 1 ("b", 48 elements) in one partition. Each partition is over
// wire::kCopyBelowBytes, so it is referenced rather than copied.
class WireRequestsTest : public ::testing::Test {
 protected:
  WireRequestsTest() {
    for (int i = 0; i < 3; ++i) versions_.emplace_back(10 + i);
    for (int i = 0; i < 100; ++i) grad_a_.push_back(0.5f * i - 1);
    for (int i = 0; i < 48; ++i) grad_b_.push_back(7.0f + (i % 5));
  }

  std::vector<PartitionSlice> Slices() const {
    return {PartitionSlice{0, 0, 0, 40, 0}, PartitionSlice{0, 1, 40, 60, 1},
            PartitionSlice{1, 0, 0, 48, 2}};
  }
  absl::Span<const float> GradOf(int tensor) const {
    return tensor == 0 ? absl::Span<const float>(grad_a_) : absl::Span<const float>(grad_b_);
  }

  template <typename Message>
  static Message Parse(const grpc::ByteBuffer& buffer) {
    grpc::ByteBuffer copy = buffer;  // shares the slices
    Message message;
    EXPECT_TRUE((grpc::GenericDeserialize<grpc::ProtoBufferReader, Message>(&copy, &message))
                    .ok());
    return message;
  }

  template <typename Message>
  static grpc::ByteBuffer Serialize(const Message& message) {
    grpc::ByteBuffer buffer;
    bool own = false;
    EXPECT_TRUE(
        (grpc::GenericSerialize<grpc::ProtoBufferWriter, Message>(message, &buffer, &own))
            .ok());
    return buffer;
  }

  const std::vector<std::string> names_ = {"a", "b"};
  VersionTable versions_;
  std::vector<float> grad_a_;
  std::vector<float> grad_b_;
};

TEST_F(WireRequestsTest, ZeroCopyDenseF32IsSentFromTheTensorItself) {
  WireOptions options;
  options.worker = 3;
  options.worker_incarnation = 99;
  WireRequests requests(options, Slices(), &names_);
  requests.SetPush(5, 17, [&](int t) { return GradOf(t); }, versions_);
  grpc::ByteBuffer request;
  requests.EncodePush(/*shard_incarnation=*/42, nullptr, &request);

  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(request.Dump(&slices).ok());
  // Every partition's bytes lie in one slice that points into the gradient.
  std::vector<const float*> starts;
  for (const grpc::Slice& slice : slices) {
    starts.push_back(reinterpret_cast<const float*>(slice.begin()));
  }
  EXPECT_THAT(starts, ::testing::Contains(grad_a_.data()));
  EXPECT_THAT(starts, ::testing::Contains(grad_a_.data() + 40));
  EXPECT_THAT(starts, ::testing::Contains(grad_b_.data()));
  slices.clear();
  EXPECT_GT(requests.refs().Outstanding(), 0);

  // And the bytes are a PushRequest as stock protobuf reads it.
  const PushRequest push = Parse<PushRequest>(request);
  EXPECT_EQ(push.worker(), 3u);
  EXPECT_EQ(push.clock(), 5);
  EXPECT_EQ(push.worker_incarnation(), 99u);
  EXPECT_EQ(push.sequence(), 17u);
  EXPECT_EQ(push.shard_incarnation(), 42u);
  ASSERT_EQ(push.parts_size(), 3);
  EXPECT_EQ(push.parts(1).key().tensor(), "a");
  EXPECT_EQ(push.parts(1).key().partition(), 1u);
  EXPECT_EQ(push.parts(1).version(), 11);
  EXPECT_EQ(push.parts(1).grad().dtype(), DTYPE_F32);
  EXPECT_EQ(push.parts(1).grad().encoding(), ENCODING_DENSE);
  EXPECT_EQ(push.parts(1).grad().data(),
            std::string(reinterpret_cast<const char*>(grad_a_.data() + 40), 60 * sizeof(float)));
  EXPECT_EQ(push.parts(2).key().tensor(), "b");

  // Once the request is gone nothing references the gradient.
  request.Clear();
  EXPECT_EQ(requests.refs().Outstanding(), 0);
  EXPECT_TRUE(requests.refs().WaitReleased(absl::Now()));
}

TEST_F(WireRequestsTest, HalfPrecisionIsConvertedOnceIntoStagingThatIsReferenced) {
  for (DType dtype : {DTYPE_F16, DTYPE_BF16}) {
    WireOptions options;
    options.dtype = dtype;
    WireRequests requests(options, Slices(), &names_);
    requests.SetPush(1, 1, [&](int t) { return GradOf(t); }, versions_);
    grpc::ByteBuffer request;
    requests.EncodePush(0, nullptr, &request);
    const PushRequest push = Parse<PushRequest>(request);
    ASSERT_EQ(push.parts_size(), 3);
    std::string expected;
    common::EncodeDense(absl::MakeConstSpan(grad_a_).subspan(40, 60), dtype, &expected);
    EXPECT_EQ(push.parts(1).grad().dtype(), dtype);
    EXPECT_EQ(push.parts(1).grad().data(), expected);
    // The gradient itself is not what is sent: changing it does not change
    // the encoded request.
    grad_a_[5] = 1000;
    EXPECT_EQ(Parse<PushRequest>(request).parts(1).grad().data(), expected);
    grad_a_[5] = 1.5f;
    request.Clear();
    EXPECT_EQ(requests.refs().Outstanding(), 0);
  }
}

TEST_F(WireRequestsTest, TopKSendsTheCompressorsSparsePayload) {
  ASSERT_OK_AND_ASSIGN(common::TopKCompressor topk,
                       common::TopKCompressor::Create(0.5, {40, 60, 48}));
  ASSERT_OK_AND_ASSIGN(common::TopKCompressor reference,
                       common::TopKCompressor::Create(0.5, {40, 60, 48}));
  WireOptions options;
  options.topk = &topk;
  WireRequests requests(options, Slices(), &names_);
  requests.SetPush(1, 1, [&](int t) { return GradOf(t); }, versions_);
  grpc::ByteBuffer request;
  requests.EncodePush(0, nullptr, &request);
  const PushRequest push = Parse<PushRequest>(request);
  ASSERT_EQ(push.parts_size(), 3);
  Payload expected;
  reference.Encode(1, absl::MakeConstSpan(grad_a_).subspan(40, 60), DTYPE_F32, &expected);
  EXPECT_EQ(push.parts(1).grad().encoding(), ENCODING_SPARSE);
  EXPECT_EQ(push.parts(1).grad().data(), expected.data());
  EXPECT_EQ(push.parts(1).grad().indices(), expected.indices());
}

TEST_F(WireRequestsTest, AsyncRetriesClampVersionsToWhatTheShardHasNow) {
  WireRequests requests(WireOptions(), Slices(), &names_);
  requests.SetPush(1, 1, [&](int t) { return GradOf(t); }, versions_);
  versions_[1].store(4);  // the shard restarted and lost updates
  grpc::ByteBuffer request;
  requests.EncodePush(7, &versions_, &request);
  const PushRequest push = Parse<PushRequest>(request);
  EXPECT_EQ(push.parts(0).version(), 10);
  EXPECT_EQ(push.parts(1).version(), 4);
  EXPECT_EQ(push.shard_incarnation(), 7u);
  // Sync (no clamp): the versions are the step and stay.
  WireRequests sync(WireOptions(), Slices(), &names_);
  versions_[1].store(11);
  sync.SetPush(1, 1, [&](int t) { return GradOf(t); }, versions_);
  versions_[1].store(4);
  sync.EncodePush(7, nullptr, &request);
  EXPECT_EQ(Parse<PushRequest>(request).parts(1).version(), 11);
  request.Clear();  // before the requests it references go
}

TEST_F(WireRequestsTest, PullAsksForEveryPartitionAndDecodesIntoTheDestinations) {
  WireOptions options;
  options.worker = 2;
  options.dtype = DTYPE_BF16;
  WireRequests requests(options, Slices(), &names_);
  std::vector<float> a(100, -1), b(48, -1);
  requests.SetPull(6, 4, [&](int t) { return t == 0 ? absl::MakeSpan(a) : absl::MakeSpan(b); });
  grpc::ByteBuffer request;
  // The exchange pulls with the buffer its push went out in.
  requests.SetPush(6, 1, [&](int t) { return GradOf(t); }, versions_);
  requests.EncodePush(8, nullptr, &request);
  requests.EncodePull(8, &request);
  EXPECT_EQ(requests.refs().Outstanding(), 0);
  const PullRequest pull = Parse<PullRequest>(request);
  EXPECT_EQ(pull.worker(), 2u);
  EXPECT_EQ(pull.clock(), 6);
  EXPECT_EQ(pull.min_version(), 4);
  EXPECT_EQ(pull.dtype(), DTYPE_BF16);
  EXPECT_EQ(pull.shard_incarnation(), 8u);
  ASSERT_EQ(pull.parts_size(), 3);
  EXPECT_EQ(pull.parts(1).tensor(), "a");
  EXPECT_EQ(pull.parts(1).partition(), 1u);

  PullResponse response;
  response.set_wait_seconds(0.25);
  std::vector<std::vector<float>> values = {std::vector<float>(40), std::vector<float>(60),
                                            std::vector<float>(48)};
  for (int i = 0; i < 3; ++i) {
    for (size_t j = 0; j < values[i].size(); ++j) values[i][j] = 1000.0f * i + j;
  }
  for (int i = 0; i < 3; ++i) {
    ParameterPart* part = response.add_parts();
    *part->mutable_key() = pull.parts(i);
    part->set_version(20 + i);
    part->mutable_value()->set_dtype(DTYPE_F32);
    common::EncodeDense(values[i], DTYPE_F32, part->mutable_value()->mutable_data());
  }
  grpc::ByteBuffer answer = Serialize(response);
  PullResult result;
  ASSERT_OK(requests.DecodePull(&answer, &versions_, &result));
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 40), values[0]);
  EXPECT_EQ(std::vector<float>(a.begin() + 40, a.end()), values[1]);
  EXPECT_EQ(b, values[2]);
  EXPECT_EQ(versions_[0].load(), 20);
  EXPECT_EQ(versions_[2].load(), 22);
  EXPECT_EQ(result.min_version, 20);
  EXPECT_EQ(result.wait_seconds, 0.25);

  // Answers that do not match the request are refused.
  PullResponse wrong_key = response;
  wrong_key.mutable_parts(1)->mutable_key()->set_partition(5);
  answer = Serialize(wrong_key);
  EXPECT_THAT(requests.DecodePull(&answer, &versions_, &result).message(),
              HasSubstr("partition 5 of a"));
  PullResponse too_few = response;
  too_few.mutable_parts()->RemoveLast();
  answer = Serialize(too_few);
  EXPECT_EQ(requests.DecodePull(&answer, &versions_, &result).code(),
            absl::StatusCode::kInternal);
  PullResponse short_payload = response;
  short_payload.mutable_parts(2)->mutable_value()->mutable_data()->resize(8);
  answer = Serialize(short_payload);
  EXPECT_EQ(requests.DecodePull(&answer, &versions_, &result).code(),
            absl::StatusCode::kInvalidArgument);
  grpc::Slice junk("\xff\xff\xff", 3);
  answer = grpc::ByteBuffer(&junk, 1);
  EXPECT_FALSE(requests.DecodePull(&answer, &versions_, &result).ok());
}

TEST_F(WireRequestsTest, PushPullCarriesBothHalvesAndDecodesBoth) {
  WireRequests requests(WireOptions(), Slices(), &names_);
  std::vector<float> a(100), b(48);
  requests.SetPush(3, 9, [&](int t) { return GradOf(t); }, versions_);
  requests.SetPull(3, 2, [&](int t) { return t == 0 ? absl::MakeSpan(a) : absl::MakeSpan(b); });
  grpc::ByteBuffer request;
  requests.EncodePushPull(5, nullptr, &request);
  const PushPullRequest both = Parse<PushPullRequest>(request);
  EXPECT_EQ(both.push().sequence(), 9u);
  EXPECT_EQ(both.push().shard_incarnation(), 5u);
  EXPECT_EQ(both.push().parts_size(), 3);
  EXPECT_EQ(both.pull().min_version(), 2);
  EXPECT_EQ(both.pull().shard_incarnation(), 5u);
  EXPECT_EQ(both.pull().parts_size(), 3);

  PushPullResponse response;
  response.mutable_push()->set_max_staleness(4);
  for (int i = 0; i < 3; ++i) {
    ParameterPart* part = response.mutable_pull()->add_parts();
    *part->mutable_key() = both.pull().parts(i);
    part->set_version(30);
    part->mutable_value()->set_dtype(DTYPE_F32);
    const std::vector<float> values(i == 1 ? 60 : i == 0 ? 40 : 48, 1.0f + i);
    common::EncodeDense(values, DTYPE_F32, part->mutable_value()->mutable_data());
  }
  grpc::ByteBuffer answer = Serialize(response);
  PushResult pushed;
  PullResult pulled;
  ASSERT_OK(requests.DecodePushPull(&answer, &versions_, &pushed, &pulled));
  EXPECT_EQ(pushed.max_staleness, 4);
  EXPECT_EQ(pulled.min_version, 30);
  EXPECT_EQ(a[0], 1);
  EXPECT_EQ(a[99], 2);
  EXPECT_EQ(b[47], 3);
}

TEST_F(WireRequestsTest, EveryRequestCarriesTheChainEpochOnceSet) {
  WireRequests requests(WireOptions(), Slices(), &names_);
  std::vector<float> a(100), b(48);
  requests.SetPush(3, 9, [&](int t) { return GradOf(t); }, versions_);
  requests.SetPull(3, 2, [&](int t) { return t == 0 ? absl::MakeSpan(a) : absl::MakeSpan(b); });
  grpc::ByteBuffer request;
  requests.EncodePush(0, nullptr, &request);
  EXPECT_EQ(Parse<PushRequest>(request).chain_epoch(), 0u);  // unreplicated
  requests.set_chain_epoch(12);
  requests.EncodePush(0, nullptr, &request);
  EXPECT_EQ(Parse<PushRequest>(request).chain_epoch(), 12u);
  requests.EncodePull(0, &request);
  EXPECT_EQ(Parse<PullRequest>(request).chain_epoch(), 12u);
  requests.set_chain_epoch(13);
  requests.EncodePushPull(0, nullptr, &request);
  const PushPullRequest both = Parse<PushPullRequest>(request);
  EXPECT_EQ(both.push().chain_epoch(), 13u);
  EXPECT_EQ(both.pull().chain_epoch(), 13u);
  EXPECT_EQ(both.push().sequence(), 9u);
}

}  // namespace
}  // namespace shardtrain::client
