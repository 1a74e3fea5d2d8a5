// NcclComm on the GPUs of this machine (one is enough): creation, move
// semantics and an all-reduce. Skipped without a CUDA device.
#include "worker/device/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/cuda/device_memory.h"

namespace shardtrain::worker::cuda {
namespace {

absl::Status FailWith(ncclResult_t code) {
  NCCL_RETURN_IF_ERROR(code);
  return absl::OkStatus();
}

TEST(NcclStatusMacro, MapsCodes) {
  EXPECT_TRUE(FailWith(ncclSuccess).ok());
  EXPECT_EQ(FailWith(ncclInvalidArgument).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FailWith(ncclSystemError).code(), absl::StatusCode::kInternal);
}

TEST(NcclCommTest, EmptyDeviceListIsInvalid) {
  EXPECT_EQ(NcclComm::CreateAll({}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommTest, AllReduceAcrossTheLocalGpus) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device on this machine";
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::vector<int> devices;
  for (int d = 0; d < count; ++d) devices.push_back(d);
  auto comms = NcclComm::CreateAll(devices);
  ASSERT_TRUE(comms.ok()) << comms.status();
  ASSERT_EQ(comms->size(), devices.size());

  NcclComm moved(std::move((*comms)[0]));
  EXPECT_EQ((*comms)[0].get(), nullptr);
  EXPECT_EQ(moved.rank(), 0);
  EXPECT_EQ(moved.size(), count);
  (*comms)[0] = std::move(moved);

  constexpr int kN = 1000;
  std::vector<DeviceMemory<float>> buffers;
  std::vector<CudaStream> streams;
  for (int d = 0; d < count; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    auto buffer = DeviceMemory<float>::Create(kN);
    auto stream = CudaStream::Create();
    ASSERT_TRUE(buffer.ok() && stream.ok());
    std::vector<float> host(kN, static_cast<float>(d + 1));
    // On the stream the all-reduce runs on, so it is ordered before it (a
    // plain cudaMemcpy runs on the legacy stream, which non-blocking
    // streams do not wait for).
    ASSERT_EQ(cudaMemcpyAsync(buffer->data(), host.data(), buffer->bytes(),
                              cudaMemcpyHostToDevice, stream->get()),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
    buffers.push_back(std::move(buffer).value());
    streams.push_back(std::move(stream).value());
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < count; ++d) {
    ASSERT_EQ(ncclAllReduce(buffers[d].data(), buffers[d].data(), kN,
                            ncclFloat, ncclSum, (*comms)[d].get(),
                            streams[d].get()),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const float want = count * (count + 1) / 2.0f;
  for (int d = 0; d < count; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_TRUE(streams[d].Synchronize().ok());
    std::vector<float> host(kN);
    ASSERT_EQ(cudaMemcpy(host.data(), buffers[d].data(), buffers[d].bytes(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(host.front(), want);
    EXPECT_EQ(host.back(), want);
  }
}

}  // namespace
}  // namespace shardtrain::worker::cuda
