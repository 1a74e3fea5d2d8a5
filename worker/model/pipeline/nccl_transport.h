// NcclTransport: the StageTransport between pipeline stages on CUDA devices,
// over NCCL point-to-point (ncclSend/ncclRecv inside ncclGroupStart/End).
//
// Built only when CUDA and NCCL are found (SHARDTRAIN_HAVE_NCCL). One
// communicator per distinct GPU of the stages comes from ncclCommInitAll;
// stages that share a GPU share its rank, so with one GPU every transfer is a
// one-rank communicator sending to itself, which still runs through NCCL.
//
// Buffered-send semantics (transport.h) on the device: Send posts, in one
// NCCL group, the send on the sender backend's stream and the matching
// receive into a staging buffer on the receiver's GPU; Recv makes the
// receiver backend's stream wait for that transfer and copies staging into
// dst on that stream. Everything is stream-ordered, nothing blocks the host.
// One staging buffer per message tag is kept and reused every step (about
// one activation per microbatch per stage boundary).
//
// Not for concurrent stages: one host thread drives every communicator, as
// NCCL groups spanning several communicators require; PipelineModel then
// interleaves the stages on its calling thread. Thread-compatible.
//
// Example:
//   TransportFactory nccl = [](std::vector<Backend*> backends) {
//     return NcclTransport::Create(std::move(backends));
//   };
//   ASSIGN_OR_RETURN(auto model, PipelineModel::Create(spec,
//       std::move(cuda_backends), 64, options, nccl));
#ifndef SHARDTRAIN_WORKER_MODEL_PIPELINE_NCCL_TRANSPORT_H_
#define SHARDTRAIN_WORKER_MODEL_PIPELINE_NCCL_TRANSPORT_H_

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/device/backend.h"
#include "worker/device/cuda/cuda_backend.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/cuda/device_memory.h"
#include "worker/device/cuda/nccl_comm.h"
#include "worker/model/pipeline/transport.h"

namespace shardtrain::worker::pipeline {

class NcclTransport final : public StageTransport {
 public:
  // stage_backends[s] must be a CudaBackend (not owned, outlives the
  // transport). INVALID_ARGUMENT if empty, null or not CUDA; NCCL and CUDA
  // errors from creating the communicators.
  static absl::StatusOr<std::unique_ptr<StageTransport>> Create(
      std::vector<Backend*> stage_backends);

  ~NcclTransport() override;

  int num_stages() const override {
    return static_cast<int>(backends_.size());
  }
  absl::Status Send(const MessageTag& tag, const float* src,
                    size_t n) override;
  // Never waits on the host: INVALID_ARGUMENT if the message has not been
  // sent yet (the single driving thread must Send first).
  absl::Status Recv(const MessageTag& tag, float* dst, size_t n) override;
  bool Arrived(const MessageTag& tag) override;
  bool SupportsConcurrentStages() const override { return false; }
  void Cancel() override {}
  void Reset() override;

 private:
  // One message tag's staging buffer and the events ordering its use.
  struct Mailbox {
    cuda::DeviceMemory<float> staging;  // On the receiver's GPU.
    cuda::CudaEvent arrived;   // Recorded after the NCCL receive.
    cuda::CudaEvent consumed;  // Recorded after Recv copied staging out.
    bool consumed_recorded = false;
    bool pending = false;  // Sent, not yet received.
    size_t n = 0;          // Floats in the pending message.
  };

  NcclTransport() = default;
  absl::Status CheckTag(const MessageTag& tag) const;

  std::vector<CudaBackend*> backends_;  // Not owned.
  std::vector<cuda::NcclComm> comms_;         // One per distinct device.
  std::vector<int> rank_of_stage_;            // Index into comms_.
  std::map<std::tuple<int, int, int, int>, Mailbox> mailboxes_;
};

}  // namespace shardtrain::worker::pipeline

#endif  // SHARDTRAIN_WORKER_MODEL_PIPELINE_NCCL_TRANSPORT_H_
