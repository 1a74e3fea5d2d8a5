// The encoders of message_encoder.h: their bytes are what stock protobuf
// writes for the same message, payloads go out from the caller's memory
// (ZeroCopy) and are released when gRPC drops them, including across a real
// gRPC call; PullResponseBuilder's memory is recycled.
#include "wire/message_encoder.h"

#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/buffer_pool.h"
#include "wire/message_views.h"
#include "wire/testing/view_diff.h"
#include "wire/testing/wire_samples.h"
// The generated raw methods hide the typed ones of the same name, which
// clang points out where the header declares them.
#ifdef __clang__
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Woverloaded-virtual"
#endif
#include "proto/shardtrain.grpc.pb.h"
#ifdef __clang__
#pragma clang diagnostic pop
#endif

namespace shardtrain::wire {
namespace {

using google::protobuf::util::MessageDifferencer;

constexpr DType kDTypes[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
constexpr Encoding kEncodings[] = {ENCODING_DENSE, ENCODING_SPARSE};

std::vector<grpc::Slice> SlicesOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  return slices;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::string bytes;
  for (const grpc::Slice& slice : SlicesOf(buffer)) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

PushHeader HeaderOf(const PushRequest& push) {
  PushHeader header;
  header.worker = push.worker();
  header.clock = push.clock();
  header.worker_incarnation = push.worker_incarnation();
  header.sequence = push.sequence();
  header.shard_incarnation = push.shard_incarnation();
  header.clock_parts = push.clock_parts();
  return header;
}

// The parts of `push` (every one with a payload), referencing its strings.
std::vector<GradientPartOut> PartsOf(const PushRequest& push) {
  std::vector<GradientPartOut> parts;
  for (const GradientPart& part : push.parts()) {
    GradientPartOut& out = parts.emplace_back();
    out.tensor = part.key().tensor();
    out.partition = part.key().partition();
    out.version = part.version();
    out.dtype = part.grad().dtype();
    out.encoding = part.grad().encoding();
    out.data = part.grad().data();
    out.indices = part.grad().indices();
  }
  return parts;
}

// Expects `buffer` to be exactly stock protobuf's encoding of `expected`.
template <typename Stock>
void ExpectEncodes(const grpc::ByteBuffer& buffer, const Stock& expected) {
  const std::string bytes = Flatten(buffer);
  Stock parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  std::string report;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&report);
  EXPECT_TRUE(differencer.Compare(parsed, expected)) << report;
  EXPECT_EQ(bytes, expected.SerializeAsString());
}

TEST(WireCompatEncode, PushAndPushPull) {
  for (DType dtype : kDTypes) {
    for (Encoding encoding : kEncodings) {
      SCOPED_TRACE(absl::StrCat("dtype ", dtype, " encoding ", encoding));
      const PushRequest push = SamplePush(dtype, encoding, 5, /*with_bare_part=*/false);
      const std::vector<GradientPartOut> parts = PartsOf(push);
      SendRefs refs;
      {
        grpc::ByteBuffer buffer;
        EncodePush(HeaderOf(push), parts, &refs, &buffer);
        ExpectEncodes(buffer, push);
        // And our parser reads it back from its slices.
        ReceivedMessage message;
        ASSERT_TRUE(message.Take(&buffer).ok());
        PushView view;
        ASSERT_TRUE(ParsePush(message, &view).ok());
        EXPECT_EQ(DiffViews(view, ViewOf(push)), "");
      }
      {
        PushPullRequest push_pull;
        *push_pull.mutable_push() = push;
        *push_pull.mutable_pull() = SamplePullRequest(5);
        grpc::ByteBuffer buffer;
        EncodePushPull(HeaderOf(push), parts, push_pull.pull(), &refs, &buffer);
        ExpectEncodes(buffer, push_pull);
        ReceivedMessage message;
        ASSERT_TRUE(message.Take(buffer).ok());
        PushPullView view;
        ASSERT_TRUE(ParsePushPull(message, &view).ok());
        EXPECT_EQ(DiffViews(view, ViewOf(push_pull)), "");
      }
      EXPECT_EQ(refs.Outstanding(), 0);
    }
  }
}

TEST(WireCompatEncode, EmptyMessagesAndPayloads) {
  SendRefs refs;
  grpc::ByteBuffer buffer;
  EncodePush(PushHeader(), {}, &refs, &buffer);
  ExpectEncodes(buffer, PushRequest());
  EncodePushPull(PushHeader(), {}, PullRequest(), &refs, &buffer);
  PushPullRequest push_pull;
  push_pull.mutable_push();
  push_pull.mutable_pull();
  ExpectEncodes(buffer, push_pull);

  // Parts with empty payloads still carry one (an empty Payload message
  // when its dtype is unspecified), and any enum value goes through. Every
  // part has a key, empty or not.
  PushRequest push;
  GradientPart* empty = push.add_parts();
  empty->mutable_key();
  empty->mutable_grad();
  GradientPart* no_data = push.add_parts();
  no_data->mutable_key()->set_partition(1);
  no_data->mutable_grad()->set_dtype(DTYPE_BF16);
  GradientPart* odd = push.add_parts();
  odd->mutable_key()->set_tensor("t");
  odd->set_version(-3);
  odd->mutable_grad()->set_dtype(static_cast<DType>(-7));
  odd->mutable_grad()->set_encoding(static_cast<Encoding>(9));
  EncodePush(HeaderOf(push), PartsOf(push), &refs, &buffer);
  ExpectEncodes(buffer, push);
}

TEST(WireCompatEncode, PullResponseAndPushPullResponse) {
  // The builder writes dense payloads only (pulls are dense).
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(absl::StrCat("dtype ", dtype));
    const PullResponse expected =
        SamplePullResponse(dtype, ENCODING_DENSE, 2, /*with_bare_part=*/false);
    for (bool push_pull : {false, true}) {
      PullResponseBuilder builder;
      for (const ParameterPart& part : expected.parts()) {
        const std::string& data = part.value().data();
        char* out = builder.AddPart(part.key().tensor(), part.key().partition(),
                                    part.version(), part.value().dtype(), data.size());
        if (!data.empty()) std::memcpy(out, data.data(), data.size());
      }
      grpc::ByteBuffer buffer;
      if (!push_pull) {
        builder.Finish(expected.wait_seconds(), expected.incarnation(), &buffer);
        ExpectEncodes(buffer, expected);
        ReceivedMessage message;
        ASSERT_TRUE(message.Take(buffer).ok());
        PullResponseView view;
        ASSERT_TRUE(ParsePullResponse(message, &view).ok());
        EXPECT_EQ(DiffViews(view, ViewOf(expected)), "");
      } else {
        PushPullResponse response;
        *response.mutable_push() = SamplePushResponse(2);
        *response.mutable_pull() = expected;
        builder.FinishPushPull(response.push(), expected.wait_seconds(),
                               expected.incarnation(), &buffer);
        ExpectEncodes(buffer, response);
        ReceivedMessage message;
        ASSERT_TRUE(message.Take(buffer).ok());
        PushPullResponseView view;
        ASSERT_TRUE(ParsePushPullResponse(message, &view).ok());
        EXPECT_EQ(DiffViews(view, ViewOf(response)), "");
      }
    }
  }
  // Nothing at all; an empty push inside a PushPullResponse.
  PullResponseBuilder empty;
  grpc::ByteBuffer buffer;
  empty.Finish(0, 0, &buffer);
  ExpectEncodes(buffer, PullResponse());
  PullResponseBuilder empty_push_pull;
  empty_push_pull.FinishPushPull(PushResponse(), -0.0, 0, &buffer);
  PushPullResponse response;
  response.mutable_push();
  response.mutable_pull()->set_wait_seconds(-0.0);
  ExpectEncodes(buffer, response);
}

// A dense f32 tensor cut into partitions lying back to back.
struct Tensor {
  explicit Tensor(size_t elements) : values(elements) {
    std::iota(values.begin(), values.end(), 0.5f);
  }
  std::vector<GradientPartOut> Parts(size_t partitions) const {
    std::vector<GradientPartOut> parts;
    const size_t per = values.size() / partitions;
    for (size_t p = 0; p < partitions; ++p) {
      GradientPartOut& part = parts.emplace_back();
      part.tensor = "dense";
      part.partition = static_cast<uint32_t>(p);
      part.data = absl::string_view(reinterpret_cast<const char*>(values.data() + p * per),
                                    per * sizeof(float));
    }
    return parts;
  }
  std::string Bytes() const {
    return std::string(reinterpret_cast<const char*>(values.data()),
                       values.size() * sizeof(float));
  }
  std::vector<float> values;
};

// Byte for byte stock protobuf's LookupResponse: rows of several sizes
// (none, smaller than a copied payload, large) with and without an
// incarnation.
TEST(WireCompatEncode, LookupResponse) {
  for (size_t bytes : {size_t{0}, size_t{64}, size_t{4096 * 16 * 4}}) {
    for (uint64_t incarnation : {uint64_t{0}, uint64_t{0x123456789abcdefULL}}) {
      SCOPED_TRACE(absl::StrCat(bytes, " bytes of rows, incarnation ", incarnation));
      LookupResponse expected;
      std::string rows(bytes, '\0');
      for (size_t i = 0; i < bytes; ++i) rows[i] = static_cast<char>(i * 7 + 3);
      expected.set_rows(rows);
      expected.set_incarnation(incarnation);
      LookupResponseBuilder builder;
      char* out = builder.Rows(bytes);
      ASSERT_EQ(out == nullptr, bytes == 0);
      if (bytes > 0) std::memcpy(out, rows.data(), bytes);
      builder.set_incarnation(incarnation);
      grpc::ByteBuffer buffer;
      builder.Finish(&buffer);
      ExpectEncodes(buffer, expected);
    }
  }
}

TEST(ZeroCopy, DensePayloadsAreSentFromTheTensor) {
  const Tensor tensor(16384);
  const std::vector<GradientPartOut> parts = tensor.Parts(4);
  SendRefs refs;
  auto buffer = std::make_unique<grpc::ByteBuffer>();
  EncodePush(PushHeader{1, 2, 3, 4, 5}, parts, &refs, buffer.get());
  // Each partition's data is one slice pointing into the tensor.
  std::set<const void*> sent_from;
  for (const grpc::Slice& slice : SlicesOf(*buffer)) {
    if (slice.size() == 4096 * sizeof(float)) sent_from.insert(slice.begin());
  }
  for (const GradientPartOut& part : parts) {
    EXPECT_EQ(sent_from.count(part.data.data()), 1u);
  }
  // Back-to-back partitions share one referenced slice.
  EXPECT_EQ(refs.Outstanding(), 1);
  auto copy = std::make_unique<grpc::ByteBuffer>(*buffer);
  buffer.reset();
  EXPECT_EQ(refs.Outstanding(), 1);
  copy.reset();
  EXPECT_EQ(refs.Outstanding(), 0);
  EXPECT_TRUE(refs.WaitReleased(absl::Now()));
}

TEST(ZeroCopy, OutstandingCountsMemoryRuns) {
  const Tensor a(4096), b(4096);
  std::vector<GradientPartOut> parts = a.Parts(2);
  // b's partitions in reverse order: not back to back as sent.
  for (const GradientPartOut& part : b.Parts(2)) parts.push_back(part);
  std::swap(parts[2], parts[3]);
  // A sparse part: indices and values in buffers of their own; and a small
  // payload, copied.
  const std::string indices(400, '\1'), values(400, '\2'), small(8, '\3');
  GradientPartOut& sparse = parts.emplace_back();
  sparse.encoding = ENCODING_SPARSE;
  sparse.indices = indices;
  sparse.data = values;
  parts.emplace_back().data = small;
  SendRefs refs;
  {
    grpc::ByteBuffer buffer;
    EncodePush(PushHeader(), parts, &refs, &buffer);
    EXPECT_EQ(refs.Outstanding(), 1 + 2 + 2);
    // Still the stock encoding.
    PushRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
    ASSERT_EQ(parsed.parts_size(), 6);
    EXPECT_EQ(parsed.parts(2).grad().data(), std::string(parts[2].data));
    EXPECT_EQ(parsed.parts(4).grad().indices(), indices);
    EXPECT_EQ(parsed.parts(5).grad().data(), small);
  }
  EXPECT_EQ(refs.Outstanding(), 0);
}

// A server whose Push and Pull take and send raw bytes through the wire
// codec.
class RawService final
    : public ParameterServer::WithRawCallbackMethod_Push<
          ParameterServer::WithRawCallbackMethod_Pull<ParameterServer::CallbackService>> {
 public:
  explicit RawService(BufferPool* pool) : pool_(pool) {}

  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    ReceivedMessage message;
    PushView view;
    absl::Status status = message.Take(*request);
    if (status.ok()) status = ParsePush(message, &view);
    if (!status.ok()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   std::string(status.message())));
      return reactor;
    }
    received.clear();
    for (const GradientPartView& part : view.parts) received += part.grad.data.ToString();
    PushResponse reply;
    reply.set_incarnation(99);
    const std::string bytes = reply.SerializeAsString();
    grpc::Slice slice(bytes);
    *response = grpc::ByteBuffer(&slice, 1);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    PullResponseBuilder builder(pool_);
    for (uint32_t p = 0; p < 3; ++p) {
      char* out = builder.AddPart("w", p, 7, DTYPE_F32, kPullPartBytes);
      for (size_t i = 0; i < kPullPartBytes; ++i) out[i] = static_cast<char>(i * 7 + p);
    }
    builder.Finish(0.5, 99, response);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  static constexpr size_t kPullPartBytes = 100000;
  std::string received;  // written by Push, read after the call completed

 private:
  BufferPool* const pool_;
};

class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    stub_ = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // A unary call; false if it did not complete within 10 s.
  bool Call(const std::string& method, const grpc::ByteBuffer& request,
            grpc::ByteBuffer* response, grpc::Status* status) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    absl::Notification done;
    stub_->UnaryCall(&context, method, grpc::StubOptions(), &request, response,
                     [&](grpc::Status result) {
                       *status = std::move(result);
                       done.Notify();
                     });
    return done.WaitForNotificationWithTimeout(absl::Seconds(15));
  }

  BufferPool pool_{size_t{64} << 20};
  RawService service_{&pool_};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

TEST_F(Loopback, PushSendsTheTensorBytesAndReleasesThem) {
  Tensor tensor(1 << 18);  // 1 MiB in 4 partitions
  const std::string sent = tensor.Bytes();
  SendRefs refs;
  grpc::ByteBuffer request;
  EncodePush(PushHeader{1, 1, 1, 1, 0}, tensor.Parts(4), &refs, &request);
  grpc::ByteBuffer response;
  grpc::Status status;
  ASSERT_TRUE(Call("/shardtrain.ParameterServer/Push", request, &response, &status));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(service_.received, sent);
  PushResponse reply;
  ASSERT_TRUE(reply.ParseFromString(Flatten(response)));
  EXPECT_EQ(reply.incarnation(), 99u);

  // The reuse rule: after the call completed, drop our buffer and wait for
  // gRPC to drop its references; only then may the tensor change.
  request.Clear();
  ASSERT_TRUE(refs.WaitReleased(absl::Now() + absl::Seconds(10)));
  std::fill(tensor.values.begin(), tensor.values.end(), -1.0f);

  // The next push sends the new values.
  EncodePush(PushHeader{1, 2, 1, 2, 0}, tensor.Parts(4), &refs, &request);
  ASSERT_TRUE(Call("/shardtrain.ParameterServer/Push", request, &response, &status));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(service_.received, tensor.Bytes());
  request.Clear();
  EXPECT_TRUE(refs.WaitReleased(absl::Now() + absl::Seconds(10)));
}

TEST_F(Loopback, PullResponseArrivesIntactAndItsMemoryIsRecycled) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    grpc::Slice empty_slice;
    grpc::ByteBuffer request(&empty_slice, 0);
    grpc::ByteBuffer response;
    grpc::Status status;
    ASSERT_TRUE(Call("/shardtrain.ParameterServer/Pull", request, &response, &status));
    ASSERT_TRUE(status.ok()) << status.error_message();
    ReceivedMessage message;
    ASSERT_TRUE(message.Take(&response).ok());
    PullResponseView view;
    ASSERT_TRUE(ParsePullResponse(message, &view).ok());
    ASSERT_EQ(view.parts.size(), 3u);
    for (uint32_t p = 0; p < 3; ++p) {
      const std::string data = view.parts[p].value.data.ToString();
      ASSERT_EQ(data.size(), RawService::kPullPartBytes);
      for (size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(data[i], static_cast<char>(i * 7 + p)) << "part " << p << " byte " << i;
      }
    }
    // The server's blocks go back to the pool once gRPC sent them.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (pool_.stats().kept_bytes < 3 * 131072 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    const BufferPool::Stats stats = pool_.stats();
    EXPECT_EQ(stats.kept_bytes, 3u * 131072);
    // Only the first round allocates.
    EXPECT_EQ(stats.allocated, 3);
    EXPECT_EQ(stats.reused, 3 * round);
  }
}

TEST(PullResponseBuilderTest, ReusesPoolBlocks) {
  BufferPool pool(size_t{16} << 20);
  std::set<char*> first;
  for (int round = 0; round < 2; ++round) {
    PullResponseBuilder builder(&pool);
    std::set<char*> blocks;
    for (uint32_t p = 0; p < 4; ++p) {
      char* out = builder.AddPart("t", p, 1, DTYPE_F16, 5000 + p);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(out) % 64, 0u);
      std::memset(out, 'a' + p, 5000 + p);
      blocks.insert(out);
    }
    grpc::ByteBuffer buffer;
    builder.Finish(1.0, 2, &buffer);
    // The slices carrying the data are the blocks written to.
    std::set<char*> sent;
    for (const grpc::Slice& slice : SlicesOf(buffer)) {
      sent.insert(const_cast<char*>(reinterpret_cast<const char*>(slice.begin())));
    }
    for (char* block : blocks) EXPECT_EQ(sent.count(block), 1u);
    PullResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
    ASSERT_EQ(parsed.parts_size(), 4);
    EXPECT_EQ(parsed.parts(3).value().data(), std::string(5003, 'd'));
    EXPECT_EQ(pool.stats().kept_bytes, 0u);  // all in flight
    buffer.Clear();
    EXPECT_EQ(pool.stats().kept_bytes, 4u * 8192);
    if (round == 0) {
      first = blocks;
    } else {
      EXPECT_EQ(blocks, first);
    }
  }
  EXPECT_EQ(pool.stats().allocated, 4);
  EXPECT_EQ(pool.stats().reused, 4);

  // A builder dropped before Finish gives its blocks back.
  {
    PullResponseBuilder builder(&pool);
    builder.AddPart("t", 0, 1, DTYPE_F32, 5000);
    builder.AddPart("t", 1, 1, DTYPE_F32, 10);  // small: not from the pool
  }
  EXPECT_EQ(pool.stats().kept_bytes, 4u * 8192);
  EXPECT_EQ(pool.stats().reused, 5);
}

}  // namespace
}  // namespace shardtrain::wire
