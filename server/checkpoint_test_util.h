// Test helpers for checkpoints: the files of a directory, a corrupted byte,
// and a sync push of one step to every partition of a tensor. Header-only;
// for tests.
#ifndef SHARDTRAIN_SERVER_CHECKPOINT_TEST_UTIL_H_
#define SHARDTRAIN_SERVER_CHECKPOINT_TEST_UTIL_H_

#include <dirent.h>

#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "common/payload.h"
#include "proto/shardtrain.pb.h"

namespace shardtrain::server {

// Name -> contents of every file in `dir` (empty if it cannot be read).
inline std::map<std::string, std::string> DirectoryFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (const dirent* entry = readdir(d)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream in(dir + "/" + entry->d_name, std::ios::binary);
    files[entry->d_name] = std::string(std::istreambuf_iterator<char>(in), {});
  }
  closedir(d);
  return files;
}

// Flips bits of the byte in the middle of `path`.
inline void CorruptMiddleByte(const std::string& path) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  file.seekp(size / 2);
  const char byte = static_cast<char>(file.peek());
  file.seekp(size / 2);
  file.put(static_cast<char>(byte ^ 0x5a));
}

// Worker 0's sync push for `step` to every partition in `registered` of
// tensor `tensor`, each gradient element `value`.
inline PushRequest SyncPushOfEveryPartition(const RegisterResponse& registered,
                                            const std::string& tensor, int64_t step,
                                            float value) {
  PushRequest push;
  push.set_worker(0);
  push.set_clock(step + 1);
  for (const PartitionInfo& info : registered.partitions()) {
    GradientPart* part = push.add_parts();
    part->mutable_key()->set_tensor(tensor);
    part->mutable_key()->set_partition(info.partition());
    part->set_version(step);
    part->mutable_grad()->set_dtype(DTYPE_F32);
    std::vector<float> grad(info.size(), value);
    common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
  }
  return push;
}

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_CHECKPOINT_TEST_UTIL_H_
