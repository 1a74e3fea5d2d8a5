// ReadIdx: reads an IDX file (the MNIST / Fashion-MNIST container format).
//
// An IDX file is a big-endian header -- two zero bytes, a type byte, a
// dimension count, then one uint32 per dimension -- followed by the elements
// in row-major order. Only unsigned-byte elements (type 0x08) are supported,
// which covers labels (magic 0x00000801) and images (0x00000803). Files are
// read through zlib, so gzipped and plain files both work.
//
// Example:
//   ASSIGN_OR_RETURN(IdxArray labels,
//                    ReadIdx("/data/t10k-labels-idx1-ubyte.gz"));
//   labels.dims;  // {10000}
#ifndef SHARDTRAIN_WORKER_DATA_IDX_READER_H_
#define SHARDTRAIN_WORKER_DATA_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/huge_page_allocator.h"

namespace shardtrain::worker {

// A plain value; thread-compatible.
struct IdxArray {
  std::vector<int> dims;      // Outermost first, e.g. {n, rows, cols}.
  // Product of dims elements, row-major (in huge pages when large).
  std::vector<uint8_t, HugePageAllocator<uint8_t>> data;
};

// Reads the whole file at `path`. Errors: NOT_FOUND if it does not exist,
// another errno-derived code if it cannot be opened, DATA_LOSS for a bad
// magic number, an unsupported element type, a truncated or corrupt stream,
// or trailing bytes after the declared elements. Thread-safe.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DATA_IDX_READER_H_
