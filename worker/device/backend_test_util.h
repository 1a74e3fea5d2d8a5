// Test helpers: moving host vectors in and out of a Backend.
#ifndef SHARDTRAIN_WORKER_DEVICE_BACKEND_TEST_UTIL_H_
#define SHARDTRAIN_WORKER_DEVICE_BACKEND_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/backend.h"

namespace shardtrain::worker {

// n values uniform in [lo, hi), the same for the same seed.
inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// One backend (owned) and copies to and from it that fail the test, not
// the process, on error.
struct BackendIo {
  std::unique_ptr<Backend> backend;

  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& host) {
    auto buffer = backend->Allocate(host.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(backend->CopyFromHost(host, buffer->get(), 0).ok());
    return std::move(buffer).value();
  }
  std::unique_ptr<DeviceLabelBuffer> UploadLabels(const std::vector<int32_t>& host) {
    auto buffer = backend->AllocateLabels(host.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(backend->CopyLabelsFromHost(host, buffer->get(), 0).ok());
    return std::move(buffer).value();
  }
  std::vector<float> Download(const DeviceBuffer& buffer) {
    std::vector<float> host(buffer.size());
    EXPECT_TRUE(backend->CopyToHost(buffer, 0, absl::MakeSpan(host)).ok());
    return host;
  }
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_BACKEND_TEST_UTIL_H_
