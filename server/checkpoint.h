// Checkpoints of one shard: restored at start, written on demand, and
//  - async mode: every checkpoint_interval and at shutdown; each partition
//    is copied under its own lock, so a checkpoint is self-consistent per
//    partition;
//  - sync mode: at step boundaries only, every checkpoint_every_steps steps,
//    from the copies server/step_snapshot.h collects. Every shard copies the
//    same steps, so their checkpoints form one model (header.step = T).
//
// A checkpoint is one file, shard-<k>-of-<n>-<sequence>.ckpt, holding an
// 8-byte magic and then frames of [u32 length][u32 crc32][protobuf]: a
// CheckpointHeader, then one CheckpointRecord per partition. It is written
// to a temporary file, fsynced, renamed into place and the directory
// fsynced, so a crash leaves either the old or the new file.
//
// A checkpoint never loses a model:
//  - nothing is written before RestoreLatest() succeeded (a shard that fails
//    to start writes nothing), and a checkpoint with no records is never
//    written;
//  - only files this shard restored, read back as matching, or wrote are
//    ever deleted: the newest `keep` are kept, and an older one holding more
//    records or elements than the newest written is kept too;
//  - at start the newest file of this shard that reads back whole decides:
//    one written with another optimizer, partition size, mode or shard
//    count, files of another shard count newer than this shard's own, or
//    files that are all unreadable are an error naming the mismatch, unless
//    allow_fresh_start, which starts fresh and leaves every file untouched.
//
// Thread-safe: writes are serialised.
#ifndef SHARDTRAIN_SERVER_CHECKPOINT_H_
#define SHARDTRAIN_SERVER_CHECKPOINT_H_

#include <optional>
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

// The parts of a checkpoint file name, shard-<k>-of-<n>-<sequence>.ckpt.
struct CheckpointName {
  int shard = 0;
  int num_shards = 0;
  int64_t sequence = 0;
};
std::optional<CheckpointName> ParseCheckpointName(const std::string& name);

// What a checkpoint file of this shard holds, for pruning.
struct CheckpointSize {
  int64_t sequence = 0;
  std::string path;
  int64_t records = 0;
  int64_t elements = 0;  // parameters over all records
};
// The pruning rule: of `files` (oldest first; the last one is the newest
// written), those to delete: all but the newest `keep`, except any holding
// more records or more elements than the newest.
std::vector<std::string> FilesToPrune(const std::vector<CheckpointSize>& files,
                                      int keep);

class Checkpointer {
 public:
  struct Options {
    std::string dir;
    int keep = 2;  // checkpoints kept on disk
    // Start fresh instead of refusing when the directory's checkpoints do
    // not match this shard or cannot be read; they are left on disk.
    bool allow_fresh_start = false;
  };

  // `shard` and `metrics` are not owned and must outlive this.
  Checkpointer(Options options, Shard* shard, ShardMetrics* metrics);

  // At start, into the fresh shard: creates the directory and checks that a
  // file can be written and synced there, checks the directory's
  // checkpoints against the shard (see above) and loads the newest good one
  // with its worker clocks. Returns its path, or "" for a fresh start. Only
  // after this succeeded can anything be written.
  absl::StatusOr<std::string> RestoreLatest();

  // The Checkpoint RPC. async: writes a checkpoint of the shard now. sync:
  // writes the newest complete step copy if it is not on disk yet, else
  // FAILED_PRECONDITION (sync checkpoints are taken at step boundaries).
  // FAILED_PRECONDITION too when the shard holds no tensors.
  absl::StatusOr<CheckpointResponse> Write();

  // sync, from the housekeeping thread: writes the newest complete step if
  // it is newer than the one on disk. nullopt when there is none.
  absl::StatusOr<std::optional<CheckpointResponse>> WriteCompletedStep();

  // At shutdown, after the last RPC: async writes a final checkpoint (none
  // if the shard holds no tensors); sync writes a complete step not yet on
  // disk and logs which step is on disk and how many steps are not in it.
  // An error means the newest state could not be saved.
  absl::Status WriteFinal();

  // Time of the last successful write or of the restored checkpoint;
  // InfinitePast if none.
  absl::Time last_success() const;
  // sync: the step of the newest step checkpoint on disk; 0 if none.
  int64_t step_on_disk() const;
  const std::string& dir() const { return options_.dir; }

 private:
  struct Listed {
    CheckpointName name;
    std::string path;
    absl::Time modified;
  };
  bool sync() const;
  std::string Prefix() const;
  // Every shard-*-of-*-*.ckpt file in the directory.
  absl::StatusOr<std::vector<Listed>> ListAll() const;
  absl::Status PrepareDirectory() const;
  // "" if `header` fits this shard, else what differs.
  std::string Mismatch(const CheckpointHeader& header) const;
  absl::StatusOr<std::string> StartFresh(const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeVersions() const;

  absl::StatusOr<std::optional<CheckpointResponse>> WriteSnapshotLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<CheckpointResponse>> WriteStepLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CheckpointResponse> WriteFileLocked(CheckpointFile file)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PruneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  Shard* const shard_;
  ShardMetrics* const metrics_;

  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_success_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Files of this shard that may be pruned, oldest first.
  std::vector<CheckpointSize> known_ ABSL_GUARDED_BY(mu_);
  int64_t step_on_disk_ ABSL_GUARDED_BY(mu_) = 0;
  std::string step_path_ ABSL_GUARDED_BY(mu_);
  // sync: the newest complete step could not be written.
  absl::Status step_failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_CHECKPOINT_H_
