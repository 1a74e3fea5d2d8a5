#include "server/checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include <prometheus/registry.h>

#include "common/payload.h"
#include "common/testing/status_matchers.h"
#include "server/checkpoint_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "wire/testing/flatten.h"

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
  absl::StatusOr<std::unique_ptr<Shard>> NewShard(
      const std::string& optimizer = "adam", int num_shards = 1,
      ConsistencyMode mode = ConsistencyMode::kAsync) {
    ShardOptions options;
    options.optimizer.name = optimizer;
    options.partitioning.num_shards = num_shards;
    options.mode = mode;
    return Shard::Create(options, &metrics_);
  }

  // Registers "w" (several partitions) and applies `steps` more updates.
  // A checkpointer that starts fresh on `dir` and writes one checkpoint
  // of `shard`.
  void WriteOneCheckpoint(const std::string& dir, Shard* shard) {
    Checkpointer writer({dir}, shard, &metrics_);
    ASSERT_TRUE(writer.RestoreLatest().ok());
    ASSERT_TRUE(writer.Write().ok());
  }

  // Registers a second tensor "b" (10 elements) on `shard`.
  void RegisterBias(Shard& shard) {
    RegisterRequest request;
    TensorSpec* spec = request.add_tensors();
    spec->set_name("b");
    spec->add_shape(10);
    spec->set_dtype(DTYPE_F32);
    RegisterResponse registered;
    ASSERT_TRUE(shard.Register(request, &registered).ok());
  }

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
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Train(*shard, 3);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
  auto written = writer.Write();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->partitions(), 3);
  EXPECT_GT(written->bytes(), 3 * 40000 * 4);

  ASSERT_OK_AND_ASSIGN(auto restored, NewShard());
  Checkpointer reader({dir}, restored.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, written->path());
  EXPECT_EQ(restored->Checksum(), shard->Checksum());
  EXPECT_NE(reader.last_success(), absl::InfinitePast());
}

TEST_F(CheckpointTest, KeepsTheNewestTwoAndFallsBackPastACorruptOne) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
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
  ASSERT_OK_AND_ASSIGN(auto restored, NewShard());
  Checkpointer reader({dir}, restored.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_NE(*path, newest->path());
  EXPECT_EQ(restored->Checksum(), second_state);
}

TEST_F(CheckpointTest, TruncatedAndForeignFilesAreDataLoss) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Train(*shard, 1);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
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
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard("adam"));
  Train(*shard, 1);
  WriteOneCheckpoint(dir, shard.get());
  const auto before = DirectoryFiles(dir);
  ASSERT_OK_AND_ASSIGN(auto other, NewShard("sgd"));
  Checkpointer reader({dir}, other.get(), &metrics_);
  auto path = reader.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("optimizer adam (this shard: sgd)"));
  EXPECT_THAT(path.status().message(), HasSubstr("--allow_fresh_start"));
  // Nothing can be written by a checkpointer that did not open.
  Train(*other, 1);
  EXPECT_EQ(reader.Write().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(reader.WriteFinal().ok());
  EXPECT_EQ(DirectoryFiles(dir), before);
}

// A job checkpointed by async shards running heavy-ball momentum, restarted
// by a release whose async default is Delayed Nesterov: refused with the
// flag that resumes it.
TEST_F(CheckpointTest, HeavyBallCheckpointNamesTheFlagThatResumesIt) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard("momentum"));
  Train(*shard, 1);
  WriteOneCheckpoint(dir, shard.get());
  ASSERT_OK_AND_ASSIGN(auto delayed, NewShard("delayed_nesterov"));
  Checkpointer reader({dir}, delayed.get(), &metrics_);
  auto path = reader.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("--async_momentum=heavy_ball"));
}

TEST_F(CheckpointTest, NoDirectoryMeansAFreshStart) {
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Checkpointer reader({TempDir() + "/absent"}, shard.get(), &metrics_);
  auto path = reader.RestoreLatest();
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, "");
}

TEST(CheckpointNames, ParseOnlyCheckpointFiles) {
  auto name = ParseCheckpointName("shard-1-of-3-000000000042.ckpt");
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->shard, 1);
  EXPECT_EQ(name->num_shards, 3);
  EXPECT_EQ(name->sequence, 42);
  EXPECT_FALSE(ParseCheckpointName("shard-1-of-3-000000000042.ckpt.tmp.77").has_value());
  EXPECT_FALSE(ParseCheckpointName("shard-1-of-3-.ckpt").has_value());
  EXPECT_FALSE(ParseCheckpointName("notes.txt").has_value());
  EXPECT_FALSE(ParseCheckpointName("shard-1-of-0-000000000001.ckpt").has_value());
}

TEST(CheckpointPruning, KeepsTheNewestAndAnythingBigger) {
  // Oldest first; the last is the newest written.
  std::vector<CheckpointSize> files = {
      {1, "a", 3, 300}, {2, "b", 4, 100}, {3, "c", 3, 301}, {4, "d", 3, 300},
      {5, "e", 3, 300}, {6, "f", 3, 300}};
  // a: same size, pruned; b: more records, kept; c: more elements, kept;
  // d: pruned; e and f: the newest two.
  EXPECT_EQ(FilesToPrune(files, 2), (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(FilesToPrune(files, 6), std::vector<std::string>{});
  EXPECT_EQ(FilesToPrune({{1, "x", 1, 1}}, 2), std::vector<std::string>{});
  // keep < 1 still keeps the newest.
  EXPECT_EQ(FilesToPrune({{1, "x", 1, 1}, {2, "y", 1, 1}}, 0),
            std::vector<std::string>{"x"});
}

TEST_F(CheckpointTest, ASmallerCheckpointDoesNotPruneABiggerOne) {
  // An older checkpoint of this shard with two tensors, a newer one with
  // one (each written by its own shard elsewhere, then moved here).
  const std::string dir = TempDir();
  auto write_elsewhere = [&](bool with_bias, const std::string& name) {
    const std::string other = TempDir();
    ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
    Train(*shard, 1);
    if (with_bias) RegisterBias(*shard);
    Checkpointer writer({other}, shard.get(), &metrics_);
    ASSERT_TRUE(writer.RestoreLatest().ok());
    auto written = writer.Write();
    ASSERT_TRUE(written.ok());
    ASSERT_EQ(rename(written->path().c_str(), (dir + "/" + name).c_str()), 0);
  };
  write_elsewhere(true, "shard-0-of-1-000000000000.ckpt");
  write_elsewhere(false, "shard-0-of-1-000000000001.ckpt");

  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Checkpointer writer({dir}, shard.get(), &metrics_);
  auto path = writer.RestoreLatest();
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, dir + "/shard-0-of-1-000000000001.ckpt");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer.Write().ok());
  // The newest two, and the bigger old one.
  EXPECT_EQ(CountFiles(dir), 3);
  EXPECT_EQ(DirectoryFiles(dir).count("shard-0-of-1-000000000000.ckpt"), 1u);
  EXPECT_EQ(DirectoryFiles(dir).count("shard-0-of-1-000000000001.ckpt"), 0u);
}

TEST_F(CheckpointTest, ABiggerCheckpointPrunesOlderOnes) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto big, NewShard());
  Train(*big, 1);
  {
    Checkpointer writer({dir}, big.get(), &metrics_);
    ASSERT_TRUE(writer.RestoreLatest().ok());
    ASSERT_TRUE(writer.Write().ok());
    ASSERT_TRUE(writer.Write().ok());
  }
  const auto old_files = DirectoryFiles(dir);
  ASSERT_EQ(old_files.size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto restored, NewShard());
  Checkpointer writer({dir}, restored.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
  RegisterBias(*restored);
  ASSERT_TRUE(writer.Write().ok());
  ASSERT_TRUE(writer.Write().ok());
  const auto now = DirectoryFiles(dir);
  EXPECT_EQ(now.size(), 2u);
  for (const auto& [name, bytes] : old_files) EXPECT_EQ(now.count(name), 0u) << name;
}

TEST_F(CheckpointTest, NoEmptyCheckpointIsEverWritten) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
  auto written = writer.Write();
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(written.status().message(), HasSubstr("no tensors"));
  EXPECT_TRUE(writer.WriteFinal().ok());
  EXPECT_EQ(CountFiles(dir), 0);
}

TEST_F(CheckpointTest, AllFilesUnreadableIsAnErrorUnlessAllowed) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Train(*shard, 1);
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_TRUE(writer.RestoreLatest().ok());
  auto first = writer.Write();
  auto second = writer.Write();
  ASSERT_TRUE(first.ok() && second.ok());
  CorruptMiddleByte(first->path());
  CorruptMiddleByte(second->path());
  const auto before = DirectoryFiles(dir);

  ASSERT_OK_AND_ASSIGN(auto refused, NewShard());
  Checkpointer reader({dir}, refused.get(), &metrics_);
  auto path = reader.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr(first->path()));
  EXPECT_THAT(path.status().message(), HasSubstr(second->path()));
  EXPECT_EQ(DirectoryFiles(dir), before);

  // Allowed: fresh, and new checkpoints never prune the unreadable ones.
  ASSERT_OK_AND_ASSIGN(auto fresh, NewShard());
  Checkpointer allowed({dir, 2, /*allow_fresh_start=*/true}, fresh.get(), &metrics_);
  path = allowed.RestoreLatest();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, "");
  Train(*fresh, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(allowed.Write().ok());
  const auto after = DirectoryFiles(dir);
  EXPECT_EQ(after.size(), 4u);
  for (const auto& [name, bytes] : before) {
    ASSERT_EQ(after.count(name), 1u) << name;
    EXPECT_EQ(after.at(name), bytes) << name;
  }
}

TEST_F(CheckpointTest, AnotherShardCountIsRefusedAndFreshStartLeavesItsFiles) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard("adam", /*num_shards=*/1));
  Train(*shard, 1);
  WriteOneCheckpoint(dir, shard.get());
  const auto before = DirectoryFiles(dir);

  ASSERT_OK_AND_ASSIGN(auto two, NewShard("adam", /*num_shards=*/2));
  Checkpointer refused({dir}, two.get(), &metrics_);
  auto path = refused.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("cluster with 1 shards"));
  EXPECT_THAT(path.status().message(), HasSubstr("--num_shards=2"));

  Checkpointer allowed({dir, 2, true}, two.get(), &metrics_);
  ASSERT_TRUE(allowed.RestoreLatest().ok());
  EXPECT_EQ(DirectoryFiles(dir), before);
}

TEST_F(CheckpointTest, AnotherModeIsRefused) {
  const std::string dir = TempDir();
  ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
  Train(*shard, 1);
  WriteOneCheckpoint(dir, shard.get());
  ASSERT_OK_AND_ASSIGN(auto sync, NewShard("adam", 1, ConsistencyMode::kSync));
  Checkpointer reader({dir}, sync.get(), &metrics_);
  auto path = reader.RestoreLatest();
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(path.status().message(), HasSubstr("mode async (this shard: sync)"));
}

TEST_F(CheckpointTest, AnUnwritableDirectoryIsRefused) {
  const std::string file = TempDir() + "/plain-file";
  std::ofstream(file) << "x";
  for (const std::string& dir : {file, file + "/sub"}) {
    ASSERT_OK_AND_ASSIGN(auto shard, NewShard());
    Checkpointer reader({dir}, shard.get(), &metrics_);
    auto path = reader.RestoreLatest();
    EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition) << dir;
    EXPECT_THAT(path.status().message(), HasSubstr(dir)) << path.status();
  }
}

// A sync job's step checkpoint holds its tables as they were at its step,
// not as they are when the file is written: a job resumed from step T must
// not find table rows some steps past T beside its dense model at T.
TEST_F(CheckpointTest, AStepCheckpointHoldsTheTablesAsTheyWereAtItsStep) {
  const std::string dir = TempDir();
  auto new_shard = [this]() -> std::unique_ptr<Shard> {
    ShardOptions options;
    options.mode = ConsistencyMode::kSync;
    options.optimizer.name = "sgd";
    options.optimizer.learning_rate = 1.0f;
    options.checkpoint_every_steps = 2;
    auto shard = Shard::Create(options, &metrics_);
    EXPECT_TRUE(shard.ok()) << shard.status();
    RegisterTablesRequest tables;
    TableSpec* spec = tables.add_tables();
    spec->set_name("t");
    spec->set_dim(1);
    spec->set_optimizer("sgd");
    spec->set_learning_rate(1.0f);
    spec->set_init(TableSpec::INIT_ZEROS);  // an async table: PERSIA's hybrid
    EXPECT_TRUE((*shard)->tables().Register(tables).ok());
    return *std::move(shard);
  };
  const uint64_t id = 7;
  const std::string id_bytes(reinterpret_cast<const char*>(&id), sizeof(id));
  auto table_row = [&](Shard& shard) {
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(id_bytes);
    wire::LookupResponseBuilder builder;
    EXPECT_TRUE(shard.tables().Lookup(lookup, &builder).ok());
    grpc::ByteBuffer buffer;
    builder.Finish(&buffer);
    LookupResponse response;
    EXPECT_TRUE(response.ParseFromString(wire::Flatten(buffer)));
    float row = 0;
    std::memcpy(&row, response.rows().data(), sizeof(row));
    return row;
  };

  std::unique_ptr<Shard> shard = new_shard();
  Checkpointer writer({dir}, shard.get(), &metrics_);
  ASSERT_OK(writer.RestoreLatest().status());
  RegisterRequest request;
  TensorSpec* w = request.add_tensors();
  w->set_name("w");
  w->add_shape(4);
  w->set_dtype(DTYPE_F32);
  RegisterResponse registered;
  ASSERT_OK(shard->Register(request, &registered));
  // Each step: the row's gradient (1), then the dense one, as
  // shardtrain.torch sends them.
  for (int step = 1; step <= 3; ++step) {
    LookupRequest lookup;
    lookup.set_table("t");
    lookup.set_ids(id_bytes);
    lookup.set_train(true);
    lookup.set_clock(step);
    wire::LookupResponseBuilder rows;
    ASSERT_OK(shard->tables().Lookup(lookup, &rows));
    PushSparseRequest table_push;
    table_push.set_table("t");
    table_push.set_ids(id_bytes);
    const float one = 1.0f;
    table_push.set_grads(std::string(reinterpret_cast<const char*>(&one), sizeof(one)));
    table_push.set_clock(step);
    PushSparseResponse table_response;
    ASSERT_OK(shard->tables().PushSparse(table_push, &table_response));
    PushRequest push;
    push.set_clock(step);
    GradientPart* part = push.add_parts();
    part->mutable_key()->set_tensor("w");
    part->set_version(step - 1);
    part->mutable_grad()->set_dtype(DTYPE_F32);
    common::EncodeDense(std::vector<float>(4, 1.0f), DTYPE_F32,
                        part->mutable_grad()->mutable_data());
    PushResponse response;
    ASSERT_OK(shard->Push(push, &response));
  }
  EXPECT_EQ(table_row(*shard), -3.0f);
  ASSERT_OK(writer.Write().status());  // the step 2 copy

  std::unique_ptr<Shard> resumed = new_shard();
  Checkpointer reader({dir}, resumed.get(), &metrics_);
  ASSERT_OK(reader.RestoreLatest().status());
  StatusResponse status;
  resumed->FillStatus(StatusRequest(), &status);
  EXPECT_EQ(status.max_version(), 2);
  EXPECT_EQ(table_row(*resumed), -2.0f);
}

}  // namespace
}  // namespace shardtrain::server
