// RAII owners: move semantics, failure codes, and the status macros. Tests
// that touch the device skip themselves where there is none.
#include "worker/device/cuda/device_memory.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device/cuda/cublas_handle.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/cuda/cuda_test_util.h"

namespace shardtrain::worker::cuda {
namespace {

absl::Status FailWith(cudaError_t code) {
  CUDA_RETURN_IF_ERROR(code);
  return absl::OkStatus();
}

absl::Status FailWithCublas(cublasStatus_t code) {
  CUBLAS_RETURN_IF_ERROR(code);
  return absl::OkStatus();
}

// Host-only: the macros need no device, so this one runs everywhere.
TEST(CudaStatusMacros, MapCodesAndKeepTheErrorString) {
  EXPECT_TRUE(FailWith(cudaSuccess).ok());
  const absl::Status oom = FailWith(cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"),
            absl::string_view::npos) << oom;
  // The failed expression and where it failed.
  EXPECT_NE(oom.message().find("code failed"), absl::string_view::npos) << oom;
  EXPECT_NE(oom.message().find("device_memory_test.cc:"),
            absl::string_view::npos) << oom;
  EXPECT_EQ(FailWith(cudaErrorNoDevice).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(FailWith(cudaErrorInvalidValue).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FailWith(cudaErrorHostMemoryAlreadyRegistered).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FailWithCublas(CUBLAS_STATUS_SUCCESS).ok());
  EXPECT_EQ(FailWithCublas(CUBLAS_STATUS_ALLOC_FAILED).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FailWithCublas(CUBLAS_STATUS_INVALID_VALUE).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMemoryTest, MoveTransfersOwnership) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto created = DeviceMemory<float>::Create(1024);
  ASSERT_TRUE(created.ok()) << created.status();
  DeviceMemory<float> a = std::move(created).value();
  float* const p = a.data();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.size(), 1024u);
  EXPECT_EQ(a.bytes(), 4096u);

  DeviceMemory<float> b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 1024u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT: moved-from is empty by contract.
  EXPECT_TRUE(a.empty());

  auto other = DeviceMemory<float>::Create(8);
  ASSERT_TRUE(other.ok());
  DeviceMemory<float> c = std::move(other).value();
  c = std::move(b);  // Frees c's old memory, takes b's.
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(b.empty());

  // The memory is real device memory: a round trip through it works.
  std::vector<float> in(1024, 3.5f), out(1024);
  ASSERT_EQ(cudaMemcpy(c.data(), in.data(), c.bytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), c.data(), c.bytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(out, in);
}

TEST(DeviceMemoryTest, ZeroCountIsEmpty) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto empty = DeviceMemory<int32_t>::Create(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(empty->data(), nullptr);
}

TEST(DeviceMemoryTest, AbsurdAllocationIsResourceExhausted) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Larger than any GPU's memory: refused before asking the driver.
  auto huge = DeviceMemory<float>::Create(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted)
      << huge.status();
  // count * sizeof(T) overflows size_t.
  auto overflow = DeviceMemory<double>::Create(SIZE_MAX / 4);
  EXPECT_EQ(overflow.status().code(), absl::StatusCode::kResourceExhausted);
  // The device is still fine afterwards.
  EXPECT_TRUE(DeviceMemory<float>::Create(16).ok());
}

TEST(PinnedBufferTest, MoveTransfersOwnershipAndHostCanWrite) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto created = PinnedBuffer<int32_t>::Create(100);
  ASSERT_TRUE(created.ok()) << created.status();
  PinnedBuffer<int32_t> a = std::move(created).value();
  for (int i = 0; i < 100; ++i) a.data()[i] = i;
  int32_t* const p = a.data();
  PinnedBuffer<int32_t> b;
  b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[99], 99);
  EXPECT_TRUE(a.empty());
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, b.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
}

// The lock moves with the owner and is undone once, by the last one.
TEST(HostRegistrationTest, MoveTransfersTheLock) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<float> host(4096);
  auto locked = [&] {
    cudaPointerAttributes attributes{};
    EXPECT_EQ(cudaPointerGetAttributes(&attributes, host.data()), cudaSuccess);
    return attributes.type == cudaMemoryTypeHost;
  };
  auto a = HostRegistration::Create(host.data(), host.size() * sizeof(float));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->data(), host.data());
  HostRegistration b(std::move(a).value());
  EXPECT_TRUE(locked());
  {
    HostRegistration c;
    c = std::move(b);
    EXPECT_EQ(b.data(), nullptr);  // NOLINT: moved-from is empty by contract.
    EXPECT_TRUE(locked());
  }
  EXPECT_FALSE(locked());
}

TEST(CudaStreamTest, MoveAndOrderWithEvents) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto s1 = CudaStream::Create();
  auto s2 = CudaStream::Create();
  ASSERT_TRUE(s1.ok() && s2.ok());
  cudaStream_t raw = s1->get();
  CudaStream moved(std::move(*s1));
  EXPECT_EQ(moved.get(), raw);
  EXPECT_EQ(s1->get(), nullptr);

  auto start = CudaEvent::Create(/*timing=*/true);
  auto stop = CudaEvent::Create(/*timing=*/true);
  ASSERT_TRUE(start.ok() && stop.ok());
  auto memory = DeviceMemory<float>::Create(1 << 20);
  ASSERT_TRUE(memory.ok());
  ASSERT_TRUE(start->Record(moved.get()).ok());
  ASSERT_EQ(cudaMemsetAsync(memory->data(), 0, memory->bytes(), moved.get()),
            cudaSuccess);
  ASSERT_TRUE(stop->Record(moved.get()).ok());
  ASSERT_TRUE(s2->Wait(*stop).ok());
  ASSERT_TRUE(s2->Synchronize().ok());
  auto ms = stop->ElapsedMsSince(*start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);

  CudaEvent moved_event = std::move(*stop);
  EXPECT_EQ(stop->get(), nullptr);
  EXPECT_EQ(stop->Record(moved.get()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(moved_event.Synchronize().ok());
}

TEST(CublasHandleTest, MoveTransfersOwnership) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  auto handle = CublasHandle::Create(stream->get());
  ASSERT_TRUE(handle.ok()) << handle.status();
  cublasHandle_t raw = handle->get();
  CublasHandle moved;
  moved = std::move(*handle);
  EXPECT_EQ(moved.get(), raw);
  EXPECT_EQ(handle->get(), nullptr);
  cudaStream_t bound = nullptr;
  ASSERT_EQ(cublasGetStream(moved.get(), &bound), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(bound, stream->get());
}

}  // namespace
}  // namespace shardtrain::worker::cuda
