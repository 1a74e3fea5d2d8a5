// Shard::Push with gradients as received: payloads of every dtype in pieces
// cut at odd places are applied exactly as the same gradients decoded into
// floats, and a refused push (a NaN in an element split across pieces, a
// bad size) changes nothing.
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard.h"
#include "wire/message_views.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

constexpr int kElements = 1000;
constexpr int kMaxPartitionElements = 128;
constexpr int kPartitions = 8;  // of 125 elements each
constexpr int kPartitionElements = 125;

ShardOptions Options(ConsistencyMode mode, const char* optimizer) {
  ShardOptions options;
  options.mode = mode;
  options.num_workers = 2;
  options.optimizer.name = optimizer;
  options.optimizer.learning_rate = 0.1f;
  options.optimizer.weight_decay = 0.01f;
  options.partitioning.max_partition_elements = kMaxPartitionElements;
  return options;
}

class Shards {
 public:
  explicit Shards(const ShardOptions& options) {
    auto shard = Shard::Create(options, &metrics_);
    EXPECT_TRUE(shard.ok()) << shard.status();
    shard_ = std::move(*shard);
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(kElements);
    spec->set_dtype(DTYPE_F32);
    spec->mutable_init()->set_kind(Initializer::KIND_CONSTANT);
    spec->mutable_init()->set_scale(0.5f);
    RegisterResponse response;
    EXPECT_TRUE(shard_->Register(request, &response).ok());
    EXPECT_EQ(response.partitions_size(), kPartitions);
    for (const PartitionInfo& info : response.partitions()) {
      EXPECT_EQ(info.size(), kPartitionElements);
    }
  }
  Shard& operator*() { return *shard_; }
  Shard* operator->() { return shard_.get(); }

 private:
  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
  std::unique_ptr<Shard> shard_;
};

// Gradient element i of partition p at a step.
float Grad(int step, int worker, int p, int i) {
  return std::sin(0.1f * static_cast<float>(i + 7 * p + 13 * step + 31 * worker)) *
         (i % 9 == 0 ? 1e-3f : 1.0f);
}

// A push of every partition of "w" with `dtype` payloads.
PushRequest MakePush(int step, int worker, DType dtype) {
  PushRequest request;
  request.set_worker(worker);
  request.set_clock(step + 1);
  for (int p = kPartitions - 1; p >= 0; --p) {  // not in partition order
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->mutable_key()->set_partition(p);
    part->set_version(step);
    std::vector<float> values(kPartitionElements);
    for (int i = 0; i < kPartitionElements; ++i) values[i] = Grad(step, worker, p, i);
    common::EncodeDense(values, dtype, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(dtype);
  }
  return request;
}

// The same push with each payload decoded to f32 (what the stock path got).
PushRequest Decoded(const PushRequest& request) {
  PushRequest decoded = request;
  for (GradientPart& part : *decoded.mutable_parts()) {
    std::vector<float> values(kPartitionElements);
    EXPECT_TRUE(common::DecodePayload(part.grad(), absl::MakeSpan(values)).ok());
    common::EncodeDense(values, DTYPE_F32, part.mutable_grad()->mutable_data());
    part.mutable_grad()->set_dtype(DTYPE_F32);
  }
  return decoded;
}

// A view of `request` whose payloads lie at odd addresses in pieces of
// 1 to 61 bytes, splitting elements; the copies live in `storage`.
wire::PushView InPieces(const PushRequest& request, std::deque<std::string>* storage) {
  wire::PushView view = wire::ViewOf(request);
  size_t length = 1;
  for (wire::GradientPartView& part : view.parts) {
    const std::string& data = storage->emplace_back("x" + part.grad.data.ToString());
    const absl::string_view all = absl::string_view(data).substr(1);
    part.grad.data = wire::ReceivedBytes();
    for (size_t begin = 0; begin < all.size(); begin += length) {
      length = length % 61 + 1;
      part.grad.data.Append(all.substr(begin, length));
    }
  }
  return view;
}

TEST(ShardWireTest, PiecesOfEveryDTypeApplyAsDecodedFloats) {
  for (ConsistencyMode mode : {ConsistencyMode::kSync, ConsistencyMode::kAsync}) {
    for (const char* optimizer : {"sgd", "momentum", "adam", "adagrad"}) {
      for (DType dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
        Shards wire(Options(mode, optimizer));
        Shards stock(Options(mode, optimizer));
        for (int step = 0; step < 3; ++step) {
          for (int worker = 0; worker < 2; ++worker) {
            // Async: both workers push from the same version (staleness 1).
            const int version = mode == ConsistencyMode::kSync ? step : 2 * step;
            const PushRequest push = MakePush(version, worker, dtype);
            std::deque<std::string> storage;
            PushResponse wire_response, stock_response;
            const absl::Status wire_status =
                wire->Push(InPieces(push, &storage), &wire_response);
            ASSERT_TRUE(wire_status.ok()) << wire_status;
            const absl::Status stock_status = stock->Push(Decoded(push), &stock_response);
            ASSERT_TRUE(stock_status.ok()) << stock_status;
            EXPECT_EQ(wire_response.max_staleness(), stock_response.max_staleness());
            ASSERT_EQ(wire->Checksum(), stock->Checksum())
                << optimizer << " " << common::DTypeName(dtype) << " step " << step
                << " worker " << worker;
          }
        }
        StatusResponse status;
        wire->FillStatus(StatusRequest(), &status);
        EXPECT_EQ(status.updates_applied(), kPartitions * (mode == ConsistencyMode::kSync ? 3 : 6));
      }
    }
  }
}

TEST(ShardWireTest, ANonFiniteElementSplitAcrossPiecesChangesNothing) {
  for (ConsistencyMode mode : {ConsistencyMode::kSync, ConsistencyMode::kAsync}) {
    for (DType dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
      Shards shard(Options(mode, "adam"));
      PushResponse response;
      const absl::Status first = shard->Push(MakePush(0, 1, dtype), &response);
      ASSERT_TRUE(first.ok()) << first;
      const uint64_t before = shard->Checksum();
      for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity()}) {
        // Partition 0 comes last in the request but is checked with the
        // others before anything is applied to any of them.
        PushRequest push = MakePush(mode == ConsistencyMode::kSync ? 0 : 1, 0, dtype);
        GradientPart* part = push.mutable_parts(kPartitions - 1);
        ASSERT_EQ(part->key().partition(), 0u);
        std::vector<float> values(kPartitionElements);
        ASSERT_TRUE(common::DecodePayload(part->grad(), absl::MakeSpan(values)).ok());
        values[77] = bad;
        common::EncodeDense(values, dtype, part->mutable_grad()->mutable_data());
        // Element 77 split between two pieces.
        wire::PushView view = wire::ViewOf(push);
        const std::string data = part->grad().data();
        const size_t width = common::DTypeSize(dtype);
        const size_t cut = 77 * width + 1;
        wire::ReceivedBytes pieces;
        pieces.Append(absl::string_view(data).substr(0, cut));
        pieces.Append(absl::string_view(data).substr(cut));
        view.parts[kPartitions - 1].grad.data = pieces;
        const absl::Status status = shard->Push(view, &response);
        EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(status.message(), HasSubstr("w/0: gradient element 77 is"));
        EXPECT_EQ(shard->Checksum(), before) << common::DTypeName(dtype);
      }
      // A payload one element short, one byte long, or with an unknown dtype.
      PushRequest push = MakePush(mode == ConsistencyMode::kSync ? 0 : 1, 0, dtype);
      std::string* data = push.mutable_parts(3)->mutable_grad()->mutable_data();
      data->resize(data->size() - common::DTypeSize(dtype));
      EXPECT_THAT(shard->Push(push, &response).message(), HasSubstr("payload has"));
      data->append(common::DTypeSize(dtype) + 1, '\0');
      EXPECT_THAT(shard->Push(push, &response).message(), HasSubstr("payload has"));
      push = MakePush(mode == ConsistencyMode::kSync ? 0 : 1, 0, dtype);
      push.mutable_parts(5)->mutable_grad()->set_dtype(static_cast<DType>(9));
      EXPECT_THAT(shard->Push(push, &response).message(), HasSubstr("not one of f32"));
      push.mutable_parts(5)->clear_grad();
      EXPECT_THAT(shard->Push(push, &response).message(), HasSubstr("dtype unspecified"));
      EXPECT_EQ(shard->Checksum(), before);
    }
  }
}

}  // namespace
}  // namespace shardtrain::server
