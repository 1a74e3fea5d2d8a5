#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardtrain::worker {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
// MNIST-style data has at most 3 dimensions; a few more cost nothing and a
// corrupt byte here is caught by the size checks anyway.
constexpr int kMaxDims = 8;
// Reading in bounded chunks means a corrupt header claiming terabytes makes
// the reader fail at end of file instead of allocating up front.
constexpr size_t kChunkBytes = size_t{1} << 20;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to n bytes; returns how many were read (short only at EOF).
absl::StatusOr<size_t> ReadSome(gzFile f, const std::string& path, void* dst,
                                size_t n) {
  size_t done = 0;
  while (done < n) {
    const unsigned want = static_cast<unsigned>(
        std::min<size_t>(n - done, std::numeric_limits<int>::max()));
    const int got = gzread(f, static_cast<char*>(dst) + done, want);
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      return absl::DataLossError(
          absl::StrCat(path, ": corrupt compressed data: ", msg));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

absl::Status ReadExactly(gzFile f, const std::string& path, void* dst, size_t n,
                         const char* what) {
  ASSIGN_OR_RETURN(size_t got, ReadSome(f, path, dst, n));
  if (got != n) {
    return absl::DataLossError(absl::StrCat(path, ": truncated while reading ",
                                            what, " (", got, " of ", n,
                                            " bytes)"));
  }
  return absl::OkStatus();
}

// The most bytes the file at `path` can decompress to: deflate's limit of
// 1032 output bytes per input byte (zlib's technical notes), 1 MB when its
// size is unknown.
uint64_t MostElementsIn(const std::string& path) {
  constexpr uint64_t kMostDeflateRatio = 1032;
  std::error_code error;
  const uintmax_t bytes = std::filesystem::file_size(path, error);
  if (error) return kChunkBytes;
  return std::max<uint64_t>(bytes * kMostDeflateRatio, kChunkBytes);
}

uint32_t BigEndian32(const uint8_t* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    // gzopen leaves errno from open(); 0 means zlib itself ran out of memory.
    const int err = errno;
    if (err == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": zlib could not allocate a reader"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }

  uint8_t magic[4];
  RETURN_IF_ERROR(ReadExactly(file.get(), path, magic, 4, "the magic number"));
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": bad IDX magic number 0x",
                     absl::Hex(BigEndian32(magic), absl::kZeroPad8)));
  }
  if (magic[2] != kTypeUnsignedByte) {
    return absl::DataLossError(absl::StrCat(
        path, ": unsupported IDX element type 0x",
        absl::Hex(magic[2], absl::kZeroPad2), " (only unsigned bytes, 0x08)"));
  }
  const int num_dims = magic[3];
  if (num_dims < 1 || num_dims > kMaxDims) {
    return absl::DataLossError(
        absl::StrCat(path, ": IDX header declares ", num_dims, " dimensions"));
  }

  IdxArray array;
  uint64_t total = 1;
  for (int i = 0; i < num_dims; ++i) {
    uint8_t dim_bytes[4];
    RETURN_IF_ERROR(
        ReadExactly(file.get(), path, dim_bytes, 4, "the dimensions"));
    const uint32_t dim = BigEndian32(dim_bytes);
    if (dim > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
      return absl::DataLossError(
          absl::StrCat(path, ": dimension ", i, " is ", dim, ", too large"));
    }
    array.dims.push_back(static_cast<int>(dim));
    total *= dim;
    // 2^40 bytes is far beyond any real IDX file and keeps total exact.
    if (total > (uint64_t{1} << 40)) {
      return absl::DataLossError(
          absl::StrCat(path, ": IDX header declares too many elements"));
    }
  }

  // One allocation for the elements, not a doubling vector's seven (each
  // a fresh mapping to fault in and copy into: 0.6 of a worker's 1.1 CPU
  // seconds to load Fashion-MNIST's training images). The header is
  // trusted only as far as the file could hold: deflate expands at most
  // ~1032x; past that the loop grows as it reads.
  array.data.reserve(std::min<uint64_t>(total, MostElementsIn(path)));
  while (array.data.size() < total) {
    const size_t old_size = array.data.size();
    const size_t want = std::min<uint64_t>(kChunkBytes, total - old_size);
    array.data.resize(old_size + want);
    ASSIGN_OR_RETURN(size_t got, ReadSome(file.get(), path,
                                          array.data.data() + old_size, want));
    if (got != want) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: header declares ", total,
                       " elements, file has ", old_size + got));
    }
  }
  uint8_t extra;
  ASSIGN_OR_RETURN(size_t trailing, ReadSome(file.get(), path, &extra, 1));
  if (trailing != 0) {
    return absl::DataLossError(
        absl::StrCat(path, ": size mismatch: bytes follow the ", total,
                     " elements the header declares"));
  }
  return array;
}

}  // namespace shardtrain::worker
