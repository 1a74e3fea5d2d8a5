#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace shardtrain::server {
namespace {

constexpr char kMagic[] = "SHTCKPT1";
constexpr size_t kMagicSize = 8;
constexpr char kSuffix[] = ".ckpt";

void PutU32(std::string* out, uint32_t value) {
  char bytes[4];
  std::memcpy(bytes, &value, 4);  // little-endian hosts only (common/payload.h)
  out->append(bytes, 4);
}

uint32_t Crc(const std::string& bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()),
            static_cast<uInt>(bytes.size())));
}

void AppendFrame(const google::protobuf::Message& message, std::string* out) {
  const std::string bytes = message.SerializeAsString();
  PutU32(out, static_cast<uint32_t>(bytes.size()));
  PutU32(out, Crc(bytes));
  out->append(bytes);
}

// Reads the frame at *offset into `message`, advancing *offset.
absl::Status ReadFrame(const std::string& data, size_t* offset,
                       google::protobuf::Message* message) {
  if (data.size() - *offset < 8) return absl::DataLossError("truncated frame header");
  uint32_t length, crc;
  std::memcpy(&length, data.data() + *offset, 4);
  std::memcpy(&crc, data.data() + *offset + 4, 4);
  *offset += 8;
  if (data.size() - *offset < length) return absl::DataLossError("truncated frame");
  const std::string bytes = data.substr(*offset, length);
  *offset += length;
  if (Crc(bytes) != crc) return absl::DataLossError("frame checksum mismatch");
  if (!message->ParseFromString(bytes)) return absl::DataLossError("unparsable frame");
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", dir));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) return absl::UnavailableError(absl::StrCat("cannot fsync ", dir));
  return absl::OkStatus();
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::Status WriteCheckpointFile(const std::string& path,
                                 const CheckpointFile& file) {
  std::string data(kMagic, kMagicSize);
  AppendFrame(file.header, &data);
  for (const CheckpointRecord& record : file.records) AppendFrame(record, &data);
  RETURN_IF_ERROR(common::WriteFileAtomically(path, data));
  return SyncDirectory(DirOf(path));
}

absl::StatusOr<CheckpointFile> ReadCheckpointFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string data = buffer.str();
  if (data.size() < kMagicSize || data.compare(0, kMagicSize, kMagic) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not a shardtrain checkpoint"));
  }
  size_t offset = kMagicSize;
  CheckpointFile file;
  absl::Status status = ReadFrame(data, &offset, &file.header);
  for (int64_t i = 0; status.ok() && i < file.header.records(); ++i) {
    status = ReadFrame(data, &offset, &file.records.emplace_back());
  }
  if (status.ok() && offset != data.size()) {
    status = absl::DataLossError("trailing bytes after the last record");
  }
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

std::optional<CheckpointName> ParseCheckpointName(const std::string& name) {
  CheckpointName parsed;
  long long sequence = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "shard-%d-of-%d-%lld.ckpt%n", &parsed.shard,
                  &parsed.num_shards, &sequence, &consumed) != 3 ||
      consumed != static_cast<int>(name.size()) || parsed.shard < 0 ||
      parsed.num_shards < 1 || sequence < 0) {
    return std::nullopt;
  }
  parsed.sequence = sequence;
  return parsed;
}

std::vector<std::string> FilesToPrune(const std::vector<CheckpointSize>& files,
                                      int keep) {
  std::vector<std::string> doomed;
  if (files.empty()) return doomed;
  const CheckpointSize& newest = files.back();
  const size_t keep_count = static_cast<size_t>(std::max(1, keep));
  for (size_t i = 0; i + keep_count < files.size(); ++i) {
    if (files[i].records <= newest.records && files[i].elements <= newest.elements) {
      doomed.push_back(files[i].path);
    }
  }
  return doomed;
}

namespace {

int64_t Elements(const std::vector<CheckpointRecord>& records) {
  int64_t elements = 0;
  for (const CheckpointRecord& record : records) {
    elements += static_cast<int64_t>(record.params().size() / sizeof(float));
  }
  return elements;
}

absl::Status MakeDirectories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create checkpoint directory ", prefix, ": ", std::strerror(errno)));
    }
    if (slash == std::string::npos) break;
  }
  struct stat info {};
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", dir, " is not a directory"));
  }
  return absl::OkStatus();
}

std::string ModeName(ConsistencyMode mode) {
  return mode == ConsistencyMode::kSync ? "sync" : "async";
}

}  // namespace

Checkpointer::Checkpointer(Options options, Shard* shard, ShardMetrics* metrics)
    : options_(std::move(options)), shard_(shard), metrics_(metrics) {}

bool Checkpointer::sync() const {
  return shard_->options().mode == ConsistencyMode::kSync;
}

std::string Checkpointer::Prefix() const {
  const ShardOptions& shard = shard_->options();
  return absl::StrFormat("shard-%d-of-%d-", shard.shard_index,
                         shard.partitioning.num_shards);
}

absl::StatusOr<std::vector<Checkpointer::Listed>> Checkpointer::ListAll() const {
  DIR* dir = opendir(options_.dir.c_str());
  if (dir == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot read checkpoint directory ",
                                               options_.dir, ": ", std::strerror(errno)));
  }
  std::vector<Listed> files;
  while (const dirent* entry = readdir(dir)) {
    std::optional<CheckpointName> name = ParseCheckpointName(entry->d_name);
    if (!name) continue;
    Listed listed{*name, options_.dir + "/" + entry->d_name, absl::InfinitePast()};
    struct stat info {};
    if (stat(listed.path.c_str(), &info) == 0) {
      listed.modified = absl::TimeFromTimespec(info.st_mtim);
    }
    files.push_back(std::move(listed));
  }
  closedir(dir);
  std::sort(files.begin(), files.end(), [](const Listed& a, const Listed& b) {
    return a.name.sequence < b.name.sequence;
  });
  return files;
}

absl::Status Checkpointer::PrepareDirectory() const {
  RETURN_IF_ERROR(MakeDirectories(options_.dir));
  std::random_device random;
  const std::string probe = absl::StrFormat("%s/.write-probe-%d-%08x", options_.dir,
                                            getpid(), random());
  auto fail = [&](const char* what) {
    const int err = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint directory ", options_.dir, " is not writable: cannot ", what, " ",
        probe, ": ", std::strerror(err)));
  };
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail("create");
  const char bytes[] = "shardtrain write probe\n";
  const bool ok = write(fd, bytes, sizeof(bytes) - 1) ==
                      static_cast<ssize_t>(sizeof(bytes) - 1) &&
                  fsync(fd) == 0;
  absl::Status status = ok ? absl::OkStatus() : fail("write and fsync");
  close(fd);
  if (unlink(probe.c_str()) != 0 && status.ok()) status = fail("remove");
  if (status.ok()) status = SyncDirectory(options_.dir);
  return status;
}

std::string Checkpointer::Mismatch(const CheckpointHeader& header) const {
  const ShardOptions& shard = shard_->options();
  std::vector<std::string> differences;
  if (header.num_shards() != static_cast<uint32_t>(shard.partitioning.num_shards) ||
      header.shard() != static_cast<uint32_t>(shard.shard_index)) {
    differences.push_back(absl::StrFormat(
        "shard %d of %d (this shard: %d of %d)", header.shard(), header.num_shards(),
        shard.shard_index, shard.partitioning.num_shards));
  }
  if (header.max_partition_elements() != shard.partitioning.max_partition_elements) {
    differences.push_back(absl::StrFormat(
        "max_partition_elements=%d (this shard: %d)", header.max_partition_elements(),
        shard.partitioning.max_partition_elements));
  }
  if (header.optimizer() != shard.optimizer.name) {
    // Async momentum became Delayed Nesterov (server/update_rule.h); a job
    // checkpointed with the heavy-ball rule resumes with it.
    const bool heavy_ball = shard.optimizer.name == "delayed_nesterov" &&
                            (header.optimizer() == "momentum" || header.optimizer() == "nesterov");
    differences.push_back(absl::StrFormat(
        "optimizer %s (this shard: %s%s)", header.optimizer(), shard.optimizer.name,
        heavy_ball ? "; resume with --async_momentum=heavy_ball, the rule the job ran" : ""));
  }
  // Files from before modes were recorded were written by async shards.
  const std::string mode = header.mode().empty() ? "async" : header.mode();
  if (mode != ModeName(shard.mode)) {
    differences.push_back(
        absl::StrFormat("mode %s (this shard: %s)", mode, ModeName(shard.mode)));
  }
  return absl::StrJoin(differences, ", ");
}

absl::StatusOr<std::string> Checkpointer::StartFresh(const std::string& why) {
  if (!options_.allow_fresh_start) {
    return absl::FailedPreconditionError(absl::StrCat(
        why, ". Nothing was changed on disk. Start the shard with the flags the "
             "checkpoints were written with, or pass --allow_fresh_start to start "
             "with fresh parameters (the existing files are then left untouched)"));
  }
  LOG(WARNING) << why << "; starting with fresh parameters as --allow_fresh_start "
               << "asks. The existing files are left untouched.";
  ready_ = true;
  return std::string();
}

std::string Checkpointer::DescribeVersions() const {
  StatusResponse status;
  shard_->FillStatus(StatusRequest(), &status);
  if (status.num_partitions() == 0) return "no partitions";
  return absl::StrFormat("partitions at versions %d..%d", status.min_version(),
                         status.max_version());
}

absl::StatusOr<std::string> Checkpointer::RestoreLatest() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(PrepareDirectory());
  ASSIGN_OR_RETURN(std::vector<Listed> all, ListAll());
  const ShardOptions& shard = shard_->options();
  std::vector<Listed> own;
  std::vector<Listed> other_counts;
  for (Listed& file : all) {
    if (file.name.num_shards != shard.partitioning.num_shards) {
      other_counts.push_back(std::move(file));
    } else if (file.name.shard == shard.shard_index) {
      own.push_back(std::move(file));
    }
  }
  if (!own.empty()) next_sequence_ = own.back().name.sequence + 1;

  // Files of another shard count that are newer than this shard's own mean
  // --num_shards changed since the last checkpoint; older ones are leftovers
  // of an earlier configuration.
  absl::Time own_newest = absl::InfinitePast();
  for (const Listed& file : own) own_newest = std::max(own_newest, file.modified);
  std::vector<std::string> newer;
  for (const Listed& file : other_counts) {
    if (own.empty() || file.modified >= own_newest) newer.push_back(file.path);
  }
  if (!newer.empty()) {
    const Listed& example = *std::find_if(
        other_counts.begin(), other_counts.end(),
        [&](const Listed& f) { return f.path == newer.front(); });
    return StartFresh(absl::StrFormat(
        "--checkpoint_dir %s holds checkpoints of a cluster with %d shards (%d "
        "file(s), e.g. %s)%s, but this shard was started with --num_shards=%d",
        options_.dir, example.name.num_shards, newer.size(), example.path,
        own.empty() ? "" : " newer than this shard's own", shard.partitioning.num_shards));
  }
  for (const Listed& file : other_counts) {
    LOG(WARNING) << "ignoring " << file.path << ": written for "
                 << file.name.num_shards << " shards, older than this shard's checkpoints";
  }

  std::vector<std::string> unreadable;
  for (auto it = own.rbegin(); it != own.rend(); ++it) {
    absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(it->path);
    if (!file.ok()) {
      LOG(WARNING) << "skipping unreadable checkpoint: " << file.status();
      unreadable.push_back(std::string(file.status().message()));
      continue;
    }
    const CheckpointHeader& header = file->header;
    const std::string mismatch = Mismatch(header);
    if (!mismatch.empty()) {
      return StartFresh(absl::StrCat("the newest readable checkpoint ", it->path,
                                     " does not match this shard: it was written with ",
                                     mismatch));
    }
    if (file->records.empty()) {
      return StartFresh(absl::StrCat("the newest readable checkpoint ", it->path,
                                     " holds no partitions"));
    }
    RETURN_IF_ERROR(shard_->Restore(file->records));
    shard_->RestoreWorkerClocks(
        std::vector<int64_t>(header.worker_clocks().begin(), header.worker_clocks().end()),
        std::vector<int64_t>(header.worker_clock_offsets().begin(),
                             header.worker_clock_offsets().end()));
    int64_t low = INT64_MAX, high = 0;
    for (const CheckpointRecord& record : file->records) {
      if (record.has_table()) continue;
      low = std::min(low, record.version());
      high = std::max(high, record.version());
    }
    const absl::Time written = absl::FromUnixSeconds(header.unix_seconds());
    last_success_ = written;
    metrics_->last_checkpoint_timestamp().Set(static_cast<double>(header.unix_seconds()));
    if (sync()) {
      step_on_disk_ = header.step();
      step_path_ = it->path;
    }
    LOG(WARNING) << "restored " << file->records.size() << " partitions from "
                 << it->path << " (" << (sync() ? absl::StrCat("sync step ", header.step(), ", ") : "")
                 << "versions " << (low == INT64_MAX ? 0 : low) << ".." << high << "), written "
                 << absl::FormatTime(written) << ", "
                 << absl::FormatDuration(absl::Trunc(absl::Now() - written, absl::Seconds(1)))
                 << " ago: updates applied after it was written are lost";
    known_.push_back(CheckpointSize{it->name.sequence, it->path,
                                    static_cast<int64_t>(file->records.size()),
                                    Elements(file->records)});
    // Older files of this shard that match may be pruned later; others are
    // left alone.
    for (auto older = std::next(it); older != own.rend(); ++older) {
      absl::StatusOr<CheckpointFile> old = ReadCheckpointFile(older->path);
      if (!old.ok() || !Mismatch(old->header).empty()) continue;
      known_.insert(known_.begin(),
                    CheckpointSize{older->name.sequence, older->path,
                                   static_cast<int64_t>(old->records.size()),
                                   Elements(old->records)});
    }
    ready_ = true;
    return it->path;
  }
  if (!unreadable.empty()) {
    return StartFresh(absl::StrCat("no checkpoint of this shard in ", options_.dir,
                                   " can be read: ", absl::StrJoin(unreadable, "; ")));
  }
  ready_ = true;
  return std::string();
}

absl::StatusOr<CheckpointResponse> Checkpointer::Write() {
  absl::MutexLock lock(&mu_);
  if (!ready_) {
    return absl::FailedPreconditionError(
        "no checkpoint is written before the shard has restored or initialised its state");
  }
  if (sync()) {
    ASSIGN_OR_RETURN(std::optional<CheckpointResponse> written, WriteStepLocked());
    if (written) return *std::move(written);
    const int64_t every = shard_->step_snapshot().every_steps();
    if (every <= 0) {
      return absl::FailedPreconditionError(
          "sync mode takes checkpoints only at step boundaries, and they are off "
          "(--checkpoint_every_steps=0)");
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "sync mode takes checkpoints only at step boundaries, every %d steps "
        "(--checkpoint_every_steps); %s and no newer step is complete (%s)",
        every,
        step_on_disk_ > 0 ? absl::StrCat("step ", step_on_disk_, " is on disk (",
                                         step_path_, ")")
                          : std::string("no step checkpoint is on disk yet"),
        DescribeVersions()));
  }
  ASSIGN_OR_RETURN(std::optional<CheckpointResponse> written, WriteSnapshotLocked());
  if (!written) {
    return absl::FailedPreconditionError(
        "the shard holds no tensors yet: nothing to checkpoint (a checkpoint "
        "without records is never written)");
  }
  return *std::move(written);
}

absl::StatusOr<std::optional<CheckpointResponse>> Checkpointer::WriteCompletedStep() {
  absl::MutexLock lock(&mu_);
  if (!ready_ || !sync()) return std::optional<CheckpointResponse>();
  return WriteStepLocked();
}

absl::Status Checkpointer::WriteFinal() {
  absl::MutexLock lock(&mu_);
  if (!ready_) return absl::OkStatus();  // nothing was restored or initialised
  if (!sync()) {
    ASSIGN_OR_RETURN(std::optional<CheckpointResponse> written, WriteSnapshotLocked());
    if (!written) LOG(INFO) << "no tensors registered: no final checkpoint written";
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<CheckpointResponse>> written = WriteStepLocked();
  if (step_on_disk_ > 0) {
    LOG(INFO) << "sync: step checkpoint " << step_on_disk_ << " is on disk ("
              << step_path_ << "); " << DescribeVersions()
              << ": the steps after " << step_on_disk_ << " are not in it";
  } else {
    LOG(INFO) << "sync: no step checkpoint is on disk (one is written every "
              << shard_->step_snapshot().every_steps() << " steps); "
              << DescribeVersions();
  }
  if (!written.ok()) return written.status();
  return step_failure_;
}

absl::StatusOr<std::optional<CheckpointResponse>> Checkpointer::WriteSnapshotLocked() {
  CheckpointFile file;
  file.records = shard_->Snapshot();
  if (file.records.empty()) return std::optional<CheckpointResponse>();
  file.header.set_mode("async");
  file.header.set_step(0);
  for (int64_t clock : shard_->WorkerClocks()) file.header.add_worker_clocks(clock);
  for (int64_t offset : shard_->WorkerClockOffsets()) {
    file.header.add_worker_clock_offsets(offset);
  }
  ASSIGN_OR_RETURN(CheckpointResponse response, WriteFileLocked(std::move(file)));
  return std::optional<CheckpointResponse>(std::move(response));
}

absl::StatusOr<std::optional<CheckpointResponse>> Checkpointer::WriteStepLocked() {
  std::optional<StepSnapshot::Step> step = shard_->step_snapshot().TakeCompleted();
  if (!step || step->step <= step_on_disk_ || step->records.empty()) {
    return std::optional<CheckpointResponse>();
  }
  CheckpointFile file;
  // The step's partitions, and its tables as they were when it completed.
  file.records = std::move(step->records);
  file.header.set_mode("sync");
  file.header.set_step(step->step);
  // The workers had finished at most step T when the copies were taken.
  for (int64_t clock : shard_->WorkerClocks()) {
    file.header.add_worker_clocks(std::min(clock, step->step));
  }
  absl::StatusOr<CheckpointResponse> written = WriteFileLocked(std::move(file));
  if (!written.ok()) {
    step_failure_ = absl::Status(written.status().code(),
                                 absl::StrCat("step checkpoint ", step->step,
                                              " was not written: ",
                                              written.status().message()));
    return step_failure_;
  }
  step_failure_ = absl::OkStatus();
  step_on_disk_ = step->step;
  step_path_ = written->path();
  return std::optional<CheckpointResponse>(*std::move(written));
}

absl::StatusOr<CheckpointResponse> Checkpointer::WriteFileLocked(CheckpointFile file) {
  const absl::Time start = absl::Now();
  auto fail = [this](absl::Status status) {
    metrics_->checkpoints("error").Increment();
    LOG(ERROR) << "checkpoint failed: " << status;
    return status;
  };
  if (file.records.empty()) {
    return absl::InternalError("refusing to write a checkpoint without records");
  }
  // Never reuse a sequence number, also if another process wrote one.
  absl::StatusOr<std::vector<Listed>> existing = ListAll();
  if (!existing.ok()) return fail(existing.status());
  const std::string prefix = Prefix();
  for (const Listed& listed : *existing) {
    if (listed.path.substr(options_.dir.size() + 1, prefix.size()) == prefix) {
      next_sequence_ = std::max(next_sequence_, listed.name.sequence + 1);
    }
  }
  const ShardOptions& shard = shard_->options();
  file.header.set_shard(static_cast<uint32_t>(shard.shard_index));
  file.header.set_num_shards(static_cast<uint32_t>(shard.partitioning.num_shards));
  file.header.set_max_partition_elements(shard.partitioning.max_partition_elements);
  file.header.set_optimizer(shard.optimizer.name);
  file.header.set_records(static_cast<int64_t>(file.records.size()));
  file.header.set_unix_seconds(absl::ToUnixSeconds(start));
  const std::string path = absl::StrFormat("%s/%s%012d%s", options_.dir, prefix,
                                           next_sequence_, kSuffix);
  absl::Status written = WriteCheckpointFile(path, file);
  if (!written.ok()) return fail(written);
  known_.push_back(CheckpointSize{next_sequence_, path,
                                  static_cast<int64_t>(file.records.size()),
                                  Elements(file.records)});
  ++next_sequence_;
  PruneLocked();
  struct stat info {};
  stat(path.c_str(), &info);
  last_success_ = absl::Now();
  metrics_->checkpoints("ok").Increment();
  metrics_->last_checkpoint_timestamp().Set(absl::ToDoubleSeconds(
      last_success_ - absl::UnixEpoch()));
  LOG(INFO) << "checkpoint " << path << ": "
            << (file.header.mode() == "sync" ? absl::StrCat("step ", file.header.step(), ", ")
                                             : "")
            << file.records.size() << " partitions, " << info.st_size << " bytes in "
            << absl::FormatDuration(last_success_ - start);
  CheckpointResponse response;
  response.set_path(path);
  response.set_bytes(info.st_size);
  response.set_partitions(static_cast<int64_t>(file.records.size()));
  return response;
}

void Checkpointer::PruneLocked() {
  const std::vector<std::string> doomed = FilesToPrune(known_, options_.keep);
  const CheckpointSize& newest = known_.back();
  for (size_t i = 0; i + std::max(1, options_.keep) < known_.size(); ++i) {
    if (std::find(doomed.begin(), doomed.end(), known_[i].path) == doomed.end()) {
      LOG(WARNING) << "keeping " << known_[i].path << ": it holds more data ("
                   << known_[i].records << " partitions, " << known_[i].elements
                   << " elements) than the newest checkpoint " << newest.path << " ("
                   << newest.records << ", " << newest.elements << ")";
    }
  }
  for (const std::string& path : doomed) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      LOG(WARNING) << "cannot remove old checkpoint " << path << ": " << std::strerror(errno);
      continue;
    }
    known_.erase(std::find_if(known_.begin(), known_.end(),
                              [&](const CheckpointSize& f) { return f.path == path; }));
  }
}

absl::Time Checkpointer::last_success() const {
  absl::MutexLock lock(&mu_);
  return last_success_;
}

int64_t Checkpointer::step_on_disk() const {
  absl::MutexLock lock(&mu_);
  return step_on_disk_;
}

}  // namespace shardtrain::server
