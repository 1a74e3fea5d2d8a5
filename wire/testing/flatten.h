// The bytes of a grpc::ByteBuffer as one string, for comparing what a test
// wrote with what it read: empty for a buffer that is not valid (nothing
// was read into it).
//
//   EXPECT_EQ(Flatten(body), expected);
#ifndef SHARDTRAIN_WIRE_TESTING_FLATTEN_H_
#define SHARDTRAIN_WIRE_TESTING_FLATTEN_H_

#include <string>

#include <grpcpp/support/byte_buffer.h>

namespace shardtrain::wire {

std::string Flatten(const grpc::ByteBuffer& buffer);

}  // namespace shardtrain::wire

#endif  // SHARDTRAIN_WIRE_TESTING_FLATTEN_H_
