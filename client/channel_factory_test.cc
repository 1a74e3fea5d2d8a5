#include "client/channel_factory.h"

#include <grpc/grpc.h>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace shardtrain::client {
namespace {

// The value of integer argument `key` in `args`, or -1.
int IntArg(const grpc::ChannelArguments& args, const char* key) {
  grpc_channel_args c_args = args.c_channel_args();
  for (size_t i = 0; i < c_args.num_args; ++i) {
    if (std::string(c_args.args[i].key) == key && c_args.args[i].type == GRPC_ARG_INTEGER) {
      return c_args.args[i].value.integer;
    }
  }
  return -1;
}

TEST(ChannelFactoryTest, SetsTheTransportTuningAndLeavesDefaultsAlone) {
  ChannelOptions options;
  options.max_message_bytes = 1 << 20;
  options.transport.write_buffer_bytes = 1 << 20;
  options.transport.lookahead_bytes = 8 << 20;
  options.transport.bdp_probe = false;
  ASSERT_OK_AND_ASSIGN(ChannelFactory factory, ChannelFactory::Create(options));
  const grpc::ChannelArguments& args = factory.arguments();
  EXPECT_EQ(IntArg(args, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH), 1 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE), 1 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES), 8 << 20);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_BDP_PROBE), 0);
  EXPECT_EQ(IntArg(args, GRPC_ARG_HTTP2_MAX_FRAME_SIZE), -1);  // gRPC's default
  EXPECT_EQ(IntArg(args, GRPC_ARG_KEEPALIVE_TIME_MS), 10000);
  EXPECT_NE(factory.Make("127.0.0.1:1", 0), nullptr);
  EXPECT_NE(factory.Make("127.0.0.1:1", 3), nullptr);
}

TEST(ChannelFactoryTest, RefusesBadSettings) {
  ChannelOptions negative;
  negative.transport.max_frame_bytes = -1;
  EXPECT_EQ(ChannelFactory::Create(negative).status().code(),
            absl::StatusCode::kInvalidArgument);
  ChannelOptions no_messages;
  no_messages.max_message_bytes = 0;
  EXPECT_EQ(ChannelFactory::Create(no_messages).status().code(),
            absl::StatusCode::kInvalidArgument);
  ChannelOptions token_without_tls;
  token_without_tls.security.token_file = "token";
  EXPECT_FALSE(ChannelFactory::Create(token_without_tls).ok());
}

}  // namespace
}  // namespace shardtrain::client
