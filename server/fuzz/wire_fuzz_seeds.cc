// wire_fuzz_seeds DIR: writes the seed corpus of wire_fuzz into DIR: the
// sample messages of wire/testing/wire_samples.h in every dtype and
// encoding, each whole and cut into a few slices (format in
// server/fuzz/wire_fuzz_input.h).
#include <cstdio>
#include <fstream>
#include <string>

#include "proto/shardtrain.pb.h"
#include "server/fuzz/wire_fuzz_input.h"
#include "wire/testing/wire_samples.h"

namespace shardtrain::server::fuzz {
namespace {

int WriteSeeds(const std::string& dir) {
  int written = 0;
  auto write = [&](WireMessage message, const std::string& bytes, uint32_t seed) {
    for (int variant = 0; variant < 2; ++variant) {
      WireInput input;
      input.message = message;
      input.bytes = bytes;
      if (variant == 1) input.cuts = {1, bytes.size() / 3, bytes.size() / 2 + seed % 7};
      std::ofstream out(dir + "/seed_" + std::to_string(written++), std::ios::binary);
      out << WriteWireInput(input);
      if (!out) return false;
    }
    return true;
  };
  uint32_t seed = 0;
  for (DType dtype : {DTYPE_F32, DTYPE_F16, DTYPE_BF16}) {
    for (Encoding encoding : {ENCODING_DENSE, ENCODING_SPARSE}) {
      ++seed;
      PushPullRequest push_pull;
      *push_pull.mutable_push() = wire::SamplePush(dtype, encoding, seed);
      *push_pull.mutable_pull() = wire::SamplePullRequest(seed);
      PushPullResponse response;
      *response.mutable_push() = wire::SamplePushResponse(seed);
      *response.mutable_pull() = wire::SamplePullResponse(dtype, encoding, seed);
      if (!write(WireMessage::kPushRequest, push_pull.push().SerializeAsString(), seed) ||
          !write(WireMessage::kPushPullRequest, push_pull.SerializeAsString(), seed) ||
          !write(WireMessage::kPullResponse, response.pull().SerializeAsString(), seed) ||
          !write(WireMessage::kPushPullResponse, response.SerializeAsString(), seed)) {
        std::fprintf(stderr, "wire_fuzz_seeds: cannot write into %s\n", dir.c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardtrain::server::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: wire_fuzz_seeds DIR\n");
    return 2;
  }
  return shardtrain::server::fuzz::WriteSeeds(argv[1]);
}
