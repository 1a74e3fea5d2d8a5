// Scratch directories and whole-file reads for tests and benchmarks.
// Thread-safe.
#ifndef SHARDTRAIN_TESTING_FILES_H_
#define SHARDTRAIN_TESTING_FILES_H_

#include <string>

namespace shardtrain::testutil {

// A fresh directory $TMPDIR/<prefix>XXXXXX (/tmp without TMPDIR); "" if it
// cannot be made.
std::string MakeTempDir(const std::string& prefix);

// The whole file; "" if it cannot be read.
std::string ReadFile(const std::string& path);

}  // namespace shardtrain::testutil

#endif  // SHARDTRAIN_TESTING_FILES_H_
