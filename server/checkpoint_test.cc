#include "server/checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardtrain::server {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string dir = ::testing::TempDir() + "/ckptXXXXXX";
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

int CountFiles(const std::string& dir) {
  int count = 0;
  DIR* d = opendir(dir.c_str());
  while (const dirent* entry = readdir(d)) count += entry->d_name[0] != '.';
  closedir(d);
  return count;
}

class CheckpointTest : public ::testing::Test {
 protected:
  std::unique_ptr<Shard> NewShard(const std::string& optimizer = "adam") {
    ShardOptions options;
    options.optimizer.name = optimizer;
    auto shard = Shard::Create(options, &metrics_);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return std::move(*shard);
  }

  // Registers "w" (several partitions) and applies `steps` more updates.
  void Train(Shard& shard, int steps) {
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("w");
    spec->add_shape(40000);
    spec->set_dtype(DTYPE_F32);
    spec->mutable_init()->set_kind(Initializer::KIND_UNIFORM);
    spec->mutable_init()->set_scale(0.5f);
    RegisterResponse registered;
    ASSERT_TRUE(shard.Register(request, &registered).ok());
    for (int i = 0; i < steps; ++i) {
      PushRequest push;
      push.set_worker(0);
      for (const PartitionInfo& info : registered.partitions()) {
        GradientPart* part = push.add_parts();
        part->mutable_key()->set_tensor("w");
        part->mutable_key()->set_partition(info.partition());
        part->set_version(info.version() + i);
        part->mutable_grad()->set_dtype(DTYPE_F32);
        std::vector<float> grad(info.size(), 0.01f * (info.version() + i + 1));
        common::EncodeDense(grad, DTYPE_F32, part->mutable_grad()->mutable_data());
        push.set_clock(info.version() + i + 1);
      }
      PushResponse response;
      ASSERT_TRUE(shard.Push(push, &response).ok());
    }
  }

  prometheus::Registry registry_;
  ShardMetrics metrics_{registry_};
};

TEST_F(CheckpointTest, RestoreGivesBackTheExactState) {
  const std::string dir = TempDir();
  auto shard = NewShard();
  Train(*shard, 3);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  auto written = writer.Write();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->partitions(), 3);
  EXPECT_GT(written->bytes(), 3 * 40000 * 4);

  auto restored = NewShard();
  Checkpointer reader({dir}, restored.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, written->path());
  EXPECT_EQ(restored->Checksum(), shard->Checksum());
  EXPECT_NE(reader.last_success(), absl::InfinitePast());
}

TEST_F(CheckpointTest, KeepsTheNewestTwoAndFallsBackPastACorruptOne) {
  const std::string dir = TempDir();
  auto shard = NewShard();
  Checkpointer writer({dir}, shard.get(), &metrics_);
  Train(*shard, 1);
  ASSERT_TRUE(writer.Write().ok());
  Train(*shard, 1);
  ASSERT_TRUE(writer.Write().ok());
  const uint64_t second_state = shard->Checksum();
  Train(*shard, 1);
  auto newest = writer.Write();
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(CountFiles(dir), 2);

  // Corrupt one byte in the middle of the newest file.
  {
    std::fstream file(newest->path(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(newest->bytes() / 2);
    file.put('\x7f');
  }
  auto restored = NewShard();
  Checkpointer reader({dir}, restored.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_NE(*path, newest->path());
  EXPECT_EQ(restored->Checksum(), second_state);
}

TEST_F(CheckpointTest, TruncatedAndForeignFilesAreDataLoss) {
  const std::string dir = TempDir();
  auto shard = NewShard();
  Train(*shard, 1);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  auto written = writer.Write();
  ASSERT_TRUE(written.ok());
  ASSERT_EQ(truncate(written->path().c_str(), written->bytes() - 10), 0);
  EXPECT_EQ(ReadCheckpointFile(written->path()).status().code(),
            absl::StatusCode::kDataLoss);
  std::ofstream(dir + "/foreign") << "not a checkpoint at all";
  EXPECT_EQ(ReadCheckpointFile(dir + "/foreign").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpointFile(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, AnotherOptimizerIsRefused) {
  const std::string dir = TempDir();
  auto shard = NewShard("adam");
  Train(*shard, 1);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.Write().ok());
  auto other = NewShard("sgd");
  Checkpointer reader({dir}, other.get(), &metrics_);
  auto path = reader.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("optimizer adam"));
}

TEST_F(CheckpointTest, NoDirectoryMeansAFreshStart) {
  auto shard = NewShard();
  Checkpointer reader({TempDir() + "/absent"}, shard.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, "");
}

}  // namespace
}  // namespace shardtrain::server
