#include "worker/model/pipeline/nccl_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/device/cuda/cuda_status.h"

namespace shardtrain::worker::pipeline {

absl::StatusOr<std::unique_ptr<StageTransport>> NcclTransport::Create(
    std::vector<Backend*> stage_backends) {
  if (stage_backends.empty()) {
    return absl::InvalidArgumentError("NcclTransport: no stages");
  }
  std::unique_ptr<NcclTransport> transport(new NcclTransport());
  std::vector<int> devices;
  for (size_t s = 0; s < stage_backends.size(); ++s) {
    auto* cuda_backend = dynamic_cast<CudaBackend*>(stage_backends[s]);
    if (cuda_backend == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NcclTransport: stage ", s, " does not run on a CUDA backend"));
    }
    const int device = cuda_backend->options().device;
    auto it = std::find(devices.begin(), devices.end(), device);
    transport->rank_of_stage_.push_back(static_cast<int>(it - devices.begin()));
    if (it == devices.end()) devices.push_back(device);
    transport->backends_.push_back(cuda_backend);
  }
  ASSIGN_OR_RETURN(transport->comms_, cuda::NcclComm::CreateAll(devices));
  return std::unique_ptr<StageTransport>(std::move(transport));
}

NcclTransport::~NcclTransport() {
  // Staging buffers may still be read by queued copies.
  for (CudaBackend* backend : backends_) {
    backend->Synchronize().IgnoreError();
  }
}

absl::Status NcclTransport::CheckTag(const MessageTag& tag) const {
  const int stages = num_stages();
  const int step = tag.payload == Payload::kActivation ? 1 : -1;
  if (tag.from_stage < 0 || tag.from_stage >= stages || tag.to_stage < 0 ||
      tag.to_stage >= stages || tag.to_stage != tag.from_stage + step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclTransport: cannot carry ", TagName(tag), " between ", stages,
        " stages"));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Send(const MessageTag& tag, const float* src,
                                 size_t n) {
  RETURN_IF_ERROR(CheckTag(tag));
  Mailbox& box = mailboxes_[tag.Key()];
  if (box.pending) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclTransport: ", TagName(tag), " sent twice without a receive"));
  }
  CudaBackend* from = backends_[tag.from_stage];
  CudaBackend* to = backends_[tag.to_stage];
  const int from_rank = rank_of_stage_[tag.from_stage];
  const int to_rank = rank_of_stage_[tag.to_stage];
  // On a shared GPU both halves go on the sender's stream: one communicator's
  // operations in a group stay on one stream.
  const cudaStream_t recv_stream =
      from_rank == to_rank ? from->stream() : to->stream();

  CUDA_RETURN_IF_ERROR(cudaSetDevice(to->options().device));
  if (box.staging.size() < n) {
    if (box.consumed_recorded) {
      RETURN_IF_ERROR(box.consumed.Synchronize());
    }
    ASSIGN_OR_RETURN(box.staging, cuda::DeviceMemory<float>::Create(n));
    box.consumed_recorded = false;
  }
  if (box.arrived.get() == nullptr) {
    ASSIGN_OR_RETURN(box.arrived, cuda::CudaEvent::Create());
    ASSIGN_OR_RETURN(box.consumed, cuda::CudaEvent::Create());
  }
  // The previous message with this tag must have been copied out.
  if (box.consumed_recorded) {
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(recv_stream, box.consumed.get()));
  }
  if (n > 0) {
    NCCL_RETURN_IF_ERROR(ncclGroupStart());
    const ncclResult_t send = ncclSend(src, n, ncclFloat, to_rank,
                                       comms_[from_rank].get(), from->stream());
    const ncclResult_t recv =
        ncclRecv(box.staging.data(), n, ncclFloat, from_rank,
                 comms_[to_rank].get(), recv_stream);
    NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    NCCL_RETURN_IF_ERROR(send);
    NCCL_RETURN_IF_ERROR(recv);
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(to->options().device));
  RETURN_IF_ERROR(box.arrived.Record(recv_stream));
  box.pending = true;
  box.n = n;
  return absl::OkStatus();
}

absl::Status NcclTransport::Recv(const MessageTag& tag, float* dst, size_t n) {
  RETURN_IF_ERROR(CheckTag(tag));
  auto it = mailboxes_.find(tag.Key());
  if (it == mailboxes_.end() || !it->second.pending) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclTransport: receive of ", TagName(tag), " before its send"));
  }
  Mailbox& box = it->second;
  if (box.n != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclTransport: ", TagName(tag), " has ", box.n,
                     " floats, receiver expects ", n));
  }
  CudaBackend* to = backends_[tag.to_stage];
  CUDA_RETURN_IF_ERROR(cudaSetDevice(to->options().device));
  CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(to->stream(), box.arrived.get()));
  if (n > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, box.staging.data(),
                                         n * sizeof(float),
                                         cudaMemcpyDeviceToDevice,
                                         to->stream()));
  }
  RETURN_IF_ERROR(box.consumed.Record(to->stream()));
  box.consumed_recorded = true;
  box.pending = false;
  return absl::OkStatus();
}

bool NcclTransport::Arrived(const MessageTag& tag) {
  auto it = mailboxes_.find(tag.Key());
  return it != mailboxes_.end() && it->second.pending;
}

void NcclTransport::Reset() {
  for (auto& [key, box] : mailboxes_) box.pending = false;
}

}  // namespace shardtrain::worker::pipeline
