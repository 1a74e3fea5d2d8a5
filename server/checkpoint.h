// Checkpoints of one shard: periodic, on demand and at shutdown; restored
// at start.
//
// A checkpoint is one file, shard-<k>-of-<n>-<sequence>.ckpt, holding an
// 8-byte magic and then frames of [u32 length][u32 crc32][protobuf]: a
// CheckpointHeader, then one CheckpointRecord per partition. It is written
// to a temporary file, fsynced, renamed into place and the directory
// fsynced, so a crash leaves either the old or the new file. The newest
// `keep` checkpoints are kept; at start the newest one that reads back whole
// is loaded, so a torn or corrupted file falls back to the one before.
//
// Thread-safe: writes are serialised.
#ifndef SHARDTRAIN_SERVER_CHECKPOINT_H_
#define SHARDTRAIN_SERVER_CHECKPOINT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/shardtrain.pb.h"
#include "server/shard.h"
#include "server/shard_metrics.h"

namespace shardtrain::server {

struct CheckpointFile {
  CheckpointHeader header;
  std::vector<CheckpointRecord> records;
};

// Writes `file` to `path` atomically (temporary file, fsync, rename).
absl::Status WriteCheckpointFile(const std::string& path,
                                 const CheckpointFile& file);
// Reads a whole checkpoint: NOT_FOUND if missing, DATA_LOSS if torn, corrupt
// or of another format.
absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path);

class Checkpointer {
 public:
  struct Options {
    std::string dir;
    int keep = 2;  // checkpoints kept on disk
  };

  // `shard` and `metrics` are not owned and must outlive this.
  Checkpointer(Options options, Shard* shard, ShardMetrics* metrics);

  // Writes a checkpoint of the shard now.
  absl::StatusOr<CheckpointResponse> Write();

  // Loads the newest good checkpoint of this shard into the (fresh) shard.
  // Returns its path, or "" if there is none. Corrupt files are skipped with
  // a warning; one that belongs to another configuration is an error.
  absl::StatusOr<std::string> RestoreLatest();

  // Time of the last successful write or restore; InfinitePast if none.
  absl::Time last_success() const;
  const std::string& dir() const { return options_.dir; }

 private:
  // Checkpoint files of this shard, oldest first.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> List() const;
  std::string Prefix() const;

  const Options options_;
  Shard* const shard_;
  ShardMetrics* const metrics_;

  mutable absl::Mutex mu_;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_success_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_CHECKPOINT_H_
