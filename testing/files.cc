#include "testing/files.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shardtrain::testutil {

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string path =
      absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp", "/", prefix, "XXXXXX");
  if (mkdtemp(path.data()) == nullptr) return "";
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace shardtrain::testutil
