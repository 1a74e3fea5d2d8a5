#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <glog/logging.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

Checkpointer::Checkpointer(Options options, Shard* shard, ShardMetrics* metrics)
    : options_(std::move(options)), shard_(shard), metrics_(metrics) {}

std::string Checkpointer::Prefix() const {
  const ShardOptions& shard = shard_->options();
  return absl::StrFormat("shard-%d-of-%d-", shard.shard_index,
                         shard.partitioning.num_shards);
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> Checkpointer::List()
    const {
  DIR* dir = opendir(options_.dir.c_str());
  if (dir == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot read directory ", options_.dir,
                                               ": ", std::strerror(errno)));
  }
  const std::string prefix = Prefix();
  std::vector<std::pair<int64_t, std::string>> files;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, kSuffix)) continue;
    int64_t sequence;
    const std::string middle = name.substr(
        prefix.size(), name.size() - prefix.size() - std::strlen(kSuffix));
    if (!absl::SimpleAtoi(middle, &sequence)) continue;
    files.emplace_back(sequence, options_.dir + "/" + name);
  }
  closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<CheckpointResponse> Checkpointer::Write() {
  absl::MutexLock lock(&mu_);
  const absl::Time start = absl::Now();
  auto fail = [this](absl::Status status) {
    metrics_->checkpoints("error").Increment();
    LOG(WARNING) << "checkpoint failed: " << status;
    return status;
  };
  if (mkdir(options_.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return fail(absl::UnavailableError(absl::StrCat(
        "cannot create ", options_.dir, ": ", std::strerror(errno))));
  }
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> existing = List();
  if (!existing.ok()) return fail(existing.status());
  if (!existing->empty()) {
    next_sequence_ = std::max(next_sequence_, existing->back().first + 1);
  }
  CheckpointFile file;
  file.records = shard_->Snapshot();
  const ShardOptions& shard = shard_->options();
  file.header.set_shard(static_cast<uint32_t>(shard.shard_index));
  file.header.set_num_shards(static_cast<uint32_t>(shard.partitioning.num_shards));
  file.header.set_max_partition_elements(shard.partitioning.max_partition_elements);
  file.header.set_optimizer(shard.optimizer.name);
  file.header.set_records(static_cast<int64_t>(file.records.size()));
  file.header.set_unix_seconds(absl::ToUnixSeconds(start));
  const std::string path = absl::StrFormat("%s/%s%012d%s", options_.dir, Prefix(),
                                           next_sequence_, kSuffix);
  absl::Status written = WriteCheckpointFile(path, file);
  if (!written.ok()) return fail(written);
  ++next_sequence_;
  existing->emplace_back(0, path);
  for (size_t i = 0; i + options_.keep < existing->size(); ++i) {
    unlink((*existing)[i].second.c_str());
  }
  struct stat info {};
  stat(path.c_str(), &info);
  last_success_ = absl::Now();
  metrics_->checkpoints("ok").Increment();
  metrics_->last_checkpoint_timestamp().Set(absl::ToDoubleSeconds(
      last_success_ - absl::UnixEpoch()));
  LOG(INFO) << "checkpoint " << path << ": " << file.records.size()
            << " partitions, " << info.st_size << " bytes in "
            << absl::FormatDuration(last_success_ - start);
  CheckpointResponse response;
  response.set_path(path);
  response.set_bytes(info.st_size);
  response.set_partitions(static_cast<int64_t>(file.records.size()));
  return response;
}

absl::StatusOr<std::string> Checkpointer::RestoreLatest() {
  absl::MutexLock lock(&mu_);
  if (access(options_.dir.c_str(), F_OK) != 0) return std::string();
  ASSIGN_OR_RETURN(auto files, List());
  if (!files.empty()) next_sequence_ = files.back().first + 1;
  const ShardOptions& shard = shard_->options();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    absl::StatusOr<CheckpointFile> file = ReadCheckpointFile(it->second);
    if (!file.ok()) {
      LOG(WARNING) << "skipping unreadable checkpoint: " << file.status();
      continue;
    }
    const CheckpointHeader& header = file->header;
    if (header.max_partition_elements() != shard.partitioning.max_partition_elements ||
        header.optimizer() != shard.optimizer.name) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s was written with max_partition_elements=%d and optimizer %s; this "
          "shard has %d and %s",
          it->second, header.max_partition_elements(), header.optimizer(),
          shard.partitioning.max_partition_elements, shard.optimizer.name));
    }
    RETURN_IF_ERROR(shard_->Restore(file->records));
    last_success_ = absl::FromUnixSeconds(header.unix_seconds());
    metrics_->last_checkpoint_timestamp().Set(static_cast<double>(header.unix_seconds()));
    LOG(INFO) << "restored " << file->records.size() << " partitions from "
              << it->second;
    return it->second;
  }
  return std::string();
}

absl::Time Checkpointer::last_success() const {
  absl::MutexLock lock(&mu_);
  return last_success_;
}

}  // namespace shardtrain::server
