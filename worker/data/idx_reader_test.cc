#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/idx_test_util.h"

namespace shardtrain::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;


std::string Path(const std::string& name) {
  return ::testing::TempDir() + "/idx_reader_test_" + name;
}



std::string Images() {
  // 2 images of 2x3.
  std::string bytes = IdxHeader({2, 2, 3});
  for (int i = 0; i < 12; ++i) bytes.push_back(static_cast<char>(i * 20));
  return bytes;
}

TEST(IdxReaderTest, ReadsPlainAndGzippedImages) {
  for (bool gzip : {false, true}) {
    const std::string path = Path(gzip ? "images.gz" : "images");
    gzip ? WriteGzipFile(path, Images()) : WritePlainFile(path, Images());
    auto array = ReadIdx(path);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_THAT(array->dims, ElementsAre(2, 2, 3));
    ASSERT_EQ(array->data.size(), 12u);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(array->data[i], i * 20);
  }
}

TEST(IdxReaderTest, ReadsLabels) {
  std::string bytes = IdxHeader({5});
  bytes += std::string{0, 9, 3, 3, 7};
  WriteGzipFile(Path("labels.gz"), bytes);
  auto array = ReadIdx(Path("labels.gz"));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(5));
  EXPECT_THAT(array->data, ElementsAre(0, 9, 3, 3, 7));
}

TEST(IdxReaderTest, ReadsLargerThanOneChunk) {
  const uint32_t n = (1u << 20) + 12345;
  std::string bytes = IdxHeader({n});
  for (uint32_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>(i % 251));
  WriteGzipFile(Path("big.gz"), bytes);
  auto array = ReadIdx(Path("big.gz"));
  ASSERT_TRUE(array.ok()) << array.status();
  ASSERT_EQ(array->data.size(), n);
  EXPECT_EQ(array->data[n - 1], (n - 1) % 251);
}

TEST(IdxReaderTest, MissingFileIsNotFound) {
  auto array = ReadIdx(Path("does-not-exist.gz"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(array.status().message(), HasSubstr("does-not-exist"));
}

void ExpectDataLoss(const std::string& name, const std::string& bytes,
                    bool gzip, const std::string& message) {
  const std::string path = Path(name);
  gzip ? WriteGzipFile(path, bytes) : WritePlainFile(path, bytes);
  auto array = ReadIdx(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss)
      << name << ": " << array.status();
  EXPECT_THAT(array.status().message(), HasSubstr(message)) << name;
}

TEST(IdxReaderTest, CorruptFilesAreDataLoss) {
  const std::string images = Images();
  for (bool gzip : {false, true}) {
    ExpectDataLoss("empty", "", gzip, "truncated");
    ExpectDataLoss("short_header", images.substr(0, 6), gzip, "truncated");
    ExpectDataLoss("short_data", images.substr(0, images.size() - 1), gzip,
                   "truncated");
    ExpectDataLoss("trailing", images + "x", gzip, "size mismatch");
    ExpectDataLoss("bad_magic", "\x01\x02" + images.substr(2), gzip,
                   "bad IDX magic");
    std::string floats = images;
    floats[2] = 0x0D;
    ExpectDataLoss("float_type", floats, gzip, "unsupported IDX element type");
    std::string no_dims = images;
    no_dims[3] = 0;
    ExpectDataLoss("no_dims", no_dims, gzip, "0 dimensions");
    ExpectDataLoss("huge", IdxHeader({0xFFFFFFF0u, 0xFFFFFFF0u}), gzip,
                   "too large");
    ExpectDataLoss("many", IdxHeader({1u << 30, 1u << 30}), gzip,
                   "too many elements");
  }
}

TEST(IdxReaderTest, TruncatedGzipStreamIsDataLoss) {
  const std::string full = Path("full.gz");
  WriteGzipFile(full, Images());
  FILE* f = std::fopen(full.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  std::string compressed(4096, '\0');
  compressed.resize(std::fread(compressed.data(), 1, compressed.size(), f));
  std::fclose(f);
  // Cutting the gzip trailer and part of the deflate stream.
  WritePlainFile(Path("cut.gz"), compressed.substr(0, compressed.size() - 12));
  auto array = ReadIdx(Path("cut.gz"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss)
      << array.status();
}

}  // namespace
}  // namespace shardtrain::worker
