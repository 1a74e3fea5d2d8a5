// The shard's data port (server/data_port.h) against a real in-process
// shard: stock protobuf messages sent as frames are served exactly as over
// gRPC (WireCompat for the frames path); bad frames are refused and change
// nothing; a client that stops reading stalls only its own connection (a
// parked pull of its, woken by another worker's push, is not written on
// that worker's thread); and a PsClient whose frames cannot reach the
// shard falls back to gRPC.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "client/ps_client.h"
#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/shardtrain.grpc.pb.h"
#include "server/ps_server.h"
#include "wire/frame_socket.h"

namespace shardtrain {
namespace {

using ::testing::HasSubstr;

constexpr int kElements = 1000;   // "w": one partition
constexpr int kBigElements = 1 << 20;  // "big": 16 partitions, 4 MB a pull
constexpr int kPartitionElements = 1 << 16;
constexpr float kLearningRate = 0.25f;

grpc::ByteBuffer Serialized(const google::protobuf::Message& message) {
  grpc::ByteBuffer buffer;
  bool own = false;
  EXPECT_TRUE(
      grpc::SerializationTraits<google::protobuf::Message>::Serialize(message, &buffer, &own)
          .ok());
  return buffer;
}

// One client connection to a data port, speaking frames by hand.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    auto socket = wire::FrameSocket::Connect("127.0.0.1", port, absl::Seconds(5));
    EXPECT_TRUE(socket.ok()) << socket.status();
    if (socket.ok()) socket_ = *std::move(socket);
  }

  absl::Status Send(wire::DataMethod method, const grpc::ByteBuffer& body, uint64_t id,
                    uint32_t timeout_ms = 10000) {
    wire::FrameHeader header;
    header.method = static_cast<uint8_t>(method);
    header.call_id = id;
    header.timeout_ms = timeout_ms;
    return socket_->Write(header, "", &body, absl::Now() + absl::Seconds(10));
  }

  // Reads one answer: its header, status message and body.
  absl::Status Receive(wire::FrameHeader* header, std::string* message, grpc::ByteBuffer* body,
                       absl::Duration timeout = absl::Seconds(10)) {
    return socket_->Read(uint64_t{1} << 30, 1 << 16, absl::Now() + timeout, header, message,
                         body);
  }

  // One call, answered before the next: the answer's status, its body
  // parsed into *response if OK.
  grpc::Status Call(wire::DataMethod method, const google::protobuf::Message& request,
                    google::protobuf::Message* response) {
    const uint64_t id = next_id_++;
    absl::Status sent = Send(method, Serialized(request), id);
    if (!sent.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(sent.message()));
    wire::FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    absl::Status read = Receive(&header, &message, &body);
    if (!read.ok()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(read.message()));
    EXPECT_TRUE(header.response);
    EXPECT_EQ(header.call_id, id);
    EXPECT_EQ(header.method, static_cast<uint8_t>(method));
    if (header.status != 0) {
      return grpc::Status(static_cast<grpc::StatusCode>(header.status), message);
    }
    response->Clear();
    if (body.Valid()) {
      grpc::ProtoBufferReader reader(&body);
      EXPECT_TRUE(response->ParseFromZeroCopyStream(&reader));
    }
    return grpc::Status::OK;
  }

  wire::FrameSocket* socket() { return socket_.get(); }

 private:
  std::unique_ptr<wire::FrameSocket> socket_;
  uint64_t next_id_ = 1;
};

// A header (with no body after it) as bytes.
std::string FrameBytes(bool response, uint64_t body_bytes) {
  wire::FrameHeader header;
  header.response = response;
  header.method = static_cast<uint8_t>(wire::DataMethod::kPush);
  header.call_id = 1;
  header.body_bytes = body_bytes;
  char bytes[wire::FrameHeader::kBytes];
  header.Encode(bytes);
  return std::string(bytes, sizeof(bytes));
}

// Sends `bytes` on a new connection to `port`; true when the shard then
// closes it without answering, within 10 s.
bool ClosedAfterSending(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool closed = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size())) {
    pollfd entry{fd, POLLIN, 0};
    char answer[64];
    closed = ::poll(&entry, 1, 10000) == 1 && ::recv(fd, answer, sizeof(answer), 0) <= 0;
  }
  ::close(fd);
  return closed;
}

class DataPortTest : public ::testing::Test {
 protected:
  void Start(server::ConsistencyMode mode, int workers, int max_connections = 256) {
    server::PsServerOptions options;
    options.metrics_address = "";
    options.data_listen = "127.0.0.1:0";
    options.max_data_connections = max_connections;
    options.max_message_bytes = 64 << 20;
    options.shard.mode = mode;
    options.shard.num_workers = workers;
    options.shard.optimizer.name = "sgd";
    options.shard.optimizer.learning_rate = kLearningRate;
    options.shard.partitioning.max_partition_elements = kPartitionElements;
    ASSERT_OK_AND_ASSIGN(server_, server::PsServer::Start(options));
    ASSERT_GT(server_->data_port(), 0);
    stub_ = ParameterServer::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
    RegisterRequest request;
    for (auto [name, elements] : {std::pair<const char*, int>{"w", kElements},
                                  std::pair<const char*, int>{"big", kBigElements}}) {
      TensorSpec* spec = request.add_tensors();
      spec->set_name(name);
      spec->add_shape(elements);
      spec->set_dtype(DTYPE_F32);
      spec->mutable_init()->set_kind(Initializer::KIND_CONSTANT);
      spec->mutable_init()->set_scale(0.5f);
    }
    request.set_worker(0);
    RegisterResponse response;
    grpc::ClientContext context;
    const grpc::Status registered = stub_->Register(&context, request, &response);
    ASSERT_TRUE(registered.ok()) << registered.error_message();
    EXPECT_EQ(response.data_port(), static_cast<uint32_t>(server_->data_port()));
  }

  static float Grad(int worker, int i) {
    return 0.01f * static_cast<float>((i * 7 + worker) % 23) - 0.1f;
  }

  static PushRequest MakePush(int worker, int64_t version) {
    PushRequest request;
    request.set_worker(worker);
    request.set_clock(version + 1);
    GradientPart* part = request.add_parts();
    part->mutable_key()->set_tensor("w");
    part->mutable_key()->set_partition(0);
    part->set_version(version);
    std::vector<float> values(kElements);
    for (int i = 0; i < kElements; ++i) values[i] = Grad(worker, i);
    common::EncodeDense(values, DTYPE_F32, part->mutable_grad()->mutable_data());
    part->mutable_grad()->set_dtype(DTYPE_F32);
    return request;
  }

  static PullRequest MakePull(int worker, int64_t min_version, const char* tensor = "w",
                              int partitions = 1) {
    PullRequest request;
    request.set_worker(worker);
    request.set_min_version(min_version);
    for (int p = 0; p < partitions; ++p) {
      PartitionKey* key = request.add_parts();
      key->set_tensor(tensor);
      key->set_partition(p);
    }
    return request;
  }

  PullResponse PullOverGrpc(const PullRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    PullResponse response;
    const grpc::Status status = stub_->Pull(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  std::unique_ptr<server::PsServer> server_;
  std::unique_ptr<ParameterServer::Stub> stub_;
};

TEST_F(DataPortTest, StockMessagesAsFramesAreServedAsOverGrpc) {
  Start(server::ConsistencyMode::kAsync, 1);
  RawConnection frames(server_->data_port());
  PushResponse pushed;
  const grpc::Status push = frames.Call(wire::DataMethod::kPush, MakePush(0, 0), &pushed);
  ASSERT_TRUE(push.ok()) << push.error_message();
  EXPECT_EQ(pushed.incarnation(), server_->shard().incarnation());
  EXPECT_FALSE(pushed.duplicate());

  PullResponse over_frames;
  const grpc::Status pull = frames.Call(wire::DataMethod::kPull, MakePull(0, 1), &over_frames);
  ASSERT_TRUE(pull.ok()) << pull.error_message();
  const PullResponse over_grpc = PullOverGrpc(MakePull(0, 1));
  ASSERT_EQ(over_frames.parts_size(), 1);
  EXPECT_EQ(over_frames.parts(0).SerializeAsString(), over_grpc.parts(0).SerializeAsString());
  EXPECT_EQ(over_frames.parts(0).version(), 1);
  std::vector<float> values(kElements);
  ASSERT_OK(common::DecodeDense(DTYPE_F32, over_frames.parts(0).value().data(),
                                absl::MakeSpan(values)));
  for (int i = 0; i < kElements; ++i) {
    ASSERT_EQ(values[i], 0.5f - kLearningRate * Grad(0, i)) << i;
  }

  // A PushPull applies the push and answers the pull after it.
  PushPullRequest both;
  *both.mutable_push() = MakePush(0, 1);
  *both.mutable_pull() = MakePull(0, 2);
  PushPullResponse answered;
  const grpc::Status push_pull = frames.Call(wire::DataMethod::kPushPull, both, &answered);
  ASSERT_TRUE(push_pull.ok()) << push_pull.error_message();
  EXPECT_EQ(answered.pull().parts(0).version(), 2);
  EXPECT_EQ(answered.pull().parts(0).SerializeAsString(),
            PullOverGrpc(MakePull(0, 2)).parts(0).SerializeAsString());

  // The same push sent again is recognised as a duplicate.
  PushRequest again = MakePush(0, 2);
  again.set_worker_incarnation(7);
  again.set_sequence(1);
  ASSERT_TRUE(frames.Call(wire::DataMethod::kPush, again, &pushed).ok());
  EXPECT_FALSE(pushed.duplicate());
  ASSERT_TRUE(frames.Call(wire::DataMethod::kPush, again, &pushed).ok());
  EXPECT_TRUE(pushed.duplicate());

  // Sparse calls: their errors travel as over gRPC.
  LookupRequest lookup;
  lookup.set_table("nope");
  lookup.set_ids(std::string(8, '\0'));
  LookupResponse rows;
  EXPECT_EQ(frames.Call(wire::DataMethod::kLookup, lookup, &rows).error_code(),
            grpc::StatusCode::NOT_FOUND);
  PushSparseRequest sparse;
  sparse.set_table("nope");
  PushSparseResponse sparse_response;
  EXPECT_EQ(frames.Call(wire::DataMethod::kPushSparse, sparse, &sparse_response).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A forward down a replica chain, to a shard that is not replicated.
  PushResponse replicated;
  EXPECT_EQ(frames.Call(wire::DataMethod::kReplicate, MakePush(0, 3), &replicated).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DataPortTest, BadFramesAreRefusedAndChangeNothing) {
  Start(server::ConsistencyMode::kAsync, 1);
  const uint64_t before = server_->shard().Checksum();
  {
    RawConnection frames(server_->data_port());
    // A body that is not a PushRequest: the gRPC method's answer.
    grpc::Slice junk(std::string("\xff\xff\xff\xff junk"));
    wire::FrameHeader header;
    std::string message;
    grpc::ByteBuffer body;
    ASSERT_OK(frames.Send(wire::DataMethod::kPush, grpc::ByteBuffer(&junk, 1), 1));
    ASSERT_OK(frames.Receive(&header, &message, &body));
    EXPECT_EQ(header.status, grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(message, HasSubstr("request body is not a valid shardtrain.PushRequest"));
    // A method the port does not serve.
    ASSERT_OK(frames.Send(static_cast<wire::DataMethod>(9), grpc::ByteBuffer(&junk, 1), 2));
    ASSERT_OK(frames.Receive(&header, &message, &body));
    EXPECT_EQ(header.call_id, 2u);
    EXPECT_EQ(header.status, grpc::StatusCode::UNIMPLEMENTED);
    // A push of a partition that does not exist.
    PushRequest wrong = MakePush(0, 0);
    wrong.mutable_parts(0)->mutable_key()->set_partition(5);
    PushResponse pushed;
    EXPECT_EQ(frames.Call(wire::DataMethod::kPush, wrong, &pushed).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // A response sent to the shard, a body over --max_message_mb (refused
  // before any of it is read) and bytes that are no frame at all each end
  // their connection.
  for (const std::string& bytes : {FrameBytes(/*response=*/true, 0), FrameBytes(false, 1ull << 40),
                                   std::string(64, 'x')}) {
    EXPECT_TRUE(ClosedAfterSending(server_->data_port(), bytes));
  }
  EXPECT_EQ(server_->shard().Checksum(), before);
  // The port still serves.
  RawConnection frames(server_->data_port());
  PullResponse pulled;
  EXPECT_TRUE(frames.Call(wire::DataMethod::kPull, MakePull(0, 0), &pulled).ok());
}

TEST_F(DataPortTest, AStalledClientStallsOnlyItsOwnConnection) {
  // Sync, two workers: worker 0's pulls of step 1 park until worker 1's
  // push completes the step, and that push wakes them on its own thread.
  Start(server::ConsistencyMode::kSync, 2);
  RawConnection stalled(server_->data_port());
  // Two pulls that park, then answers far larger than the socket buffers,
  // which worker 0 never reads: the shard cannot write to it any more.
  ASSERT_OK(stalled.Send(wire::DataMethod::kPull, Serialized(MakePull(0, 1)), 1, 60000));
  ASSERT_OK(stalled.Send(wire::DataMethod::kPull, Serialized(MakePull(0, 1)), 2, 60000));
  for (uint64_t id = 3; id < 19; ++id) {
    ASSERT_OK(stalled.Send(wire::DataMethod::kPull,
                           Serialized(MakePull(0, 0, "big", kBigElements / kPartitionElements)),
                           id, 60000));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // Worker 0's push of step 0 goes over gRPC; worker 1's, over its own
  // data-port connection, completes the step and wakes the parked pulls.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    PushResponse pushed;
    const grpc::Status status = stub_->Push(&context, MakePush(0, 0), &pushed);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  RawConnection other(server_->data_port());
  const absl::Time start = absl::Now();
  PushResponse pushed;
  const grpc::Status push = other.Call(wire::DataMethod::kPush, MakePush(1, 0), &pushed);
  ASSERT_TRUE(push.ok()) << push.error_message();
  PullResponse pulled;
  ASSERT_TRUE(other.Call(wire::DataMethod::kPull, MakePull(1, 1), &pulled).ok());
  EXPECT_EQ(pulled.parts(0).version(), 1);
  // Answered at once, not after --data_write_timeout_s (30 s).
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(DataPortTest, AClientFallsBackToGrpcWhenThePortTurnsItAway) {
  // One data-port connection at a time; the client opens two to the shard,
  // as a call of its four partitions (1 MB) is split over two connections
  // (PsClient splits no less than 128k elements per connection).
  Start(server::ConsistencyMode::kAsync, 1, /*max_connections=*/1);
  constexpr int kFour = 4 * kPartitionElements;
  client::PsClientOptions options;
  options.servers = {"127.0.0.1:" + std::to_string(server_->port())};
  options.max_partition_elements = kPartitionElements;
  options.channels_per_shard = 2;
  ASSERT_OK_AND_ASSIGN(auto client, client::PsClient::Create(options, nullptr));
  TensorSpec spec;
  spec.set_name("x");
  spec.add_shape(kFour);
  spec.set_dtype(DTYPE_F32);
  spec.mutable_init()->set_kind(Initializer::KIND_CONSTANT);
  spec.mutable_init()->set_scale(0.5f);
  ASSERT_OK(client->Register({spec}));
  std::vector<float> grad(kFour);
  for (int i = 0; i < kFour; ++i) grad[i] = Grad(0, i);
  std::vector<float> params(kFour);
  for (int step = 0; step < 4; ++step) {
    client::PushStats push;
    client::PullStats pull;
    ASSERT_OK(client->PushPull(step + 1, 0, {absl::MakeConstSpan(grad)},
                               {absl::MakeSpan(params)}, &push, &pull));
  }
  for (int i = 0; i < kFour; ++i) {
    ASSERT_NEAR(params[i], 0.5f - 4 * kLearningRate * Grad(0, i), 1e-5f) << i;
  }
  // One connection served, the other's calls went over gRPC.
  EXPECT_EQ(server_->data_connections(), 1);
}

}  // namespace
}  // namespace shardtrain
