// HostPin: host memory of the caller's that a backend has made faster to
// copy to and from (Backend::PinHost, Model::PinParamHost): page-locked on a
// GPU, untouched on the CPU. The destructor undoes it; the memory stays the
// caller's and must outlive the pin.
//
// Thread-compatible. Move-only owner (held by unique_ptr).
//
// Example:
//   std::vector<float> values(n);
//   ASSIGN_OR_RETURN(std::unique_ptr<HostPin> pin,
//                    backend->PinHost(absl::MakeSpan(values)));
//   RETURN_IF_ERROR(backend->CopyFromHost(values, buffer, 0));  // at DMA speed
#ifndef SHARDTRAIN_WORKER_DEVICE_HOST_PIN_H_
#define SHARDTRAIN_WORKER_DEVICE_HOST_PIN_H_

namespace shardtrain::worker {

class HostPin {
 public:
  virtual ~HostPin() = default;
  HostPin(const HostPin&) = delete;
  HostPin& operator=(const HostPin&) = delete;

 protected:
  HostPin() = default;
};

}  // namespace shardtrain::worker

#endif  // SHARDTRAIN_WORKER_DEVICE_HOST_PIN_H_
