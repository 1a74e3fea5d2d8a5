// data_port_fuzz_seeds DIR: writes the seed corpus of data_port_fuzz into
// DIR: connections that send each data-path call to the fuzzer's shard
// (server/fuzz/data_port_frames.h), alone, one after another, pipelined,
// and with a pull that has to wait.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/payload.h"
#include "proto/shardtrain.pb.h"
#include "server/fuzz/data_port_frames.h"

namespace shardtrain::server::fuzz {
namespace {

PushRequest Push(int64_t version) {
  PushRequest push;
  push.set_clock(version + 1);
  GradientPart* part = push.add_parts();
  part->mutable_key()->set_tensor("w");
  part->set_version(version);
  std::vector<float> grad(kDataPortElements, 0.01f);
  common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
  part->mutable_grad()->set_dtype(DTYPE_F32);
  return push;
}

PullRequest Pull(int64_t min_version) {
  PullRequest pull;
  pull.set_min_version(min_version);
  pull.add_parts()->set_tensor("w");
  return pull;
}

int WriteSeeds(const std::string& dir) {
  using wire::DataMethod;
  PushPullRequest push_pull;
  *push_pull.mutable_push() = Push(0);
  *push_pull.mutable_pull() = Pull(0);
  LookupRequest lookup;
  lookup.set_table("t");
  lookup.set_ids(std::string("\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0", 16));
  PushSparseRequest sparse;
  sparse.set_table("t");
  sparse.set_ids(std::string("\x01\0\0\0\0\0\0\0", 8));
  std::vector<float> grads(4, 0.5f);
  sparse.set_grads(std::string(reinterpret_cast<const char*>(grads.data()), 16));
  const std::vector<std::string> seeds = {
      RequestFrame(DataMethod::kPush, 1, 1000, Push(0).SerializeAsString()),
      RequestFrame(DataMethod::kPull, 1, 1000, Pull(0).SerializeAsString()),
      RequestFrame(DataMethod::kPushPull, 1, 1000, push_pull.SerializeAsString()),
      RequestFrame(DataMethod::kLookup, 1, 1000, lookup.SerializeAsString()),
      RequestFrame(DataMethod::kPushSparse, 1, 1000, sparse.SerializeAsString()),
      RequestFrame(DataMethod::kReplicate, 1, 1000, Push(0).SerializeAsString()),
      // Pipelined: a pull that waits for a version nobody pushes, then a
      // push and a pull answered before it.
      RequestFrame(DataMethod::kPull, 1, 5000, Pull(1000).SerializeAsString()) +
          RequestFrame(DataMethod::kPush, 2, 1000, Push(0).SerializeAsString()) +
          RequestFrame(DataMethod::kPull, 3, 1000, Pull(0).SerializeAsString()),
      // A client's token that this (plaintext) shard does not ask for,
      // first, then a call; and a hello after a call, which ends the
      // connection.
      RequestFrame(DataMethod::kHello, 0, 0, "a-token") +
          RequestFrame(DataMethod::kPush, 1, 1000, Push(0).SerializeAsString()),
      RequestFrame(DataMethod::kPush, 1, 1000, Push(0).SerializeAsString()) +
          RequestFrame(DataMethod::kHello, 0, 0, "a-token"),
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(dir + "/seed_" + std::to_string(i), std::ios::binary);
    out << seeds[i];
    if (!out) {
      std::fprintf(stderr, "data_port_fuzz_seeds: cannot write into %s\n", dir.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace shardtrain::server::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: data_port_fuzz_seeds DIR\n");
    return 2;
  }
  return shardtrain::server::fuzz::WriteSeeds(argv[1]);
}
