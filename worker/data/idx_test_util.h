// Writing IDX files (the Fashion-MNIST format of worker/data/idx_reader.h) for
// tests. Header-only; for tests.
#ifndef SHARDTRAIN_WORKER_DATA_IDX_TEST_UTIL_H_
#define SHARDTRAIN_WORKER_DATA_IDX_TEST_UTIL_H_

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardtrain::worker {

// The big-endian IDX header of an unsigned-byte array with `dims`.
inline std::string IdxHeader(const std::vector<uint32_t>& dims) {
  std::string h = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      h.push_back(static_cast<char>((d >> shift) & 0xff));
    }
  }
  return h;
}

// Writes `bytes` to `path` as they are. Call through ASSERT_NO_FATAL_FAILURE.
inline void WritePlainFile(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

// Writes `bytes` to `path` gzip-compressed, as the data set ships.
inline void WriteGzipFile(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DATA_IDX_TEST_UTIL_H_
