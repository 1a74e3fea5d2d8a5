#include "common/atomic_file.h"

#include <dirent.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace shardtrain::common {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

int Entries(const std::string& dir) {
  int count = 0;
  DIR* d = opendir(dir.c_str());
  while (const dirent* e = readdir(d)) count += e->d_name[0] != '.';
  closedir(d);
  return count;
}

TEST(AtomicFileTest, WritesAndReplacesLeavingNoTemporary) {
  std::string dir = ::testing::TempDir() + "/atomicXXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/ports";
  ASSERT_TRUE(WriteFileAtomically(path, "7000 9100\n").ok());
  EXPECT_EQ(Read(path), "7000 9100\n");
  ASSERT_TRUE(WriteFileAtomically(path, "1").ok());
  EXPECT_EQ(Read(path), "1");
  EXPECT_EQ(Entries(dir), 1);
}

TEST(AtomicFileTest, MissingDirectoryIsAnError) {
  const absl::Status status =
      WriteFileAtomically(::testing::TempDir() + "/no/such/dir/file", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("cannot create"), absl::string_view::npos);
}

}  // namespace
}  // namespace shardtrain::common
