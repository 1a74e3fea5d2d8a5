// ServerCall: one data-path call being answered (a Push, Pull, PushPull,
// Lookup or PushSparse), whichever transport carries it: a gRPC reactor
// (GrpcServerCall below) or a frame on the shard's data port
// (server/data_port.h). The service (server/parameter_server_service.h)
// parses the request, writes the answer into response() and calls Finish
// once; a call that must wait is parked with its waiting state held by the
// call (Hold), so that the state lives exactly as long as the call.
//
//   ServerCall* call = ...;            // the transport's
//   call->response()->...;             // the answer, if OK
//   call->Finish(grpc::Status::OK);    // sends it; `call` may be gone now
//
// If the client goes away first, the transport calls the held state's
// OnCancel (once, on any thread, maybe while another thread answers the
// call); the call is destroyed only after both Finish has been called and
// that OnCancel, if any, has returned. Thread-safe as described.
#ifndef SHARDTRAIN_SERVER_SERVER_CALL_H_
#define SHARDTRAIN_SERVER_SERVER_CALL_H_

#include <atomic>
#include <memory>

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>
#include <grpcpp/support/status.h>

#include "absl/time/time.h"

namespace shardtrain::server {

class ServerCall {
 public:
  // What a parked call holds while it waits; owned by the call.
  class Parked {
   public:
    virtual ~Parked() = default;
    // The client went away before the call was answered.
    virtual void OnCancel() = 0;
  };

  ServerCall() = default;
  ServerCall(const ServerCall&) = delete;
  ServerCall& operator=(const ServerCall&) = delete;

  // When the client stops waiting (InfiniteFuture: no deadline).
  virtual absl::Time deadline() const = 0;
  // Where the answer is written; sent by an OK Finish.
  virtual grpc::ByteBuffer* response() = 0;
  // Ends the call with `status`; exactly once. The call may be destroyed
  // before this returns.
  virtual void Finish(const grpc::Status& status) = 0;

  // Gives the call its waiting state (at most once, before it is parked).
  void Hold(std::unique_ptr<Parked> parked) { parked_.store(parked.release()); }

 protected:
  virtual ~ServerCall() { delete parked_.load(); }
  // For the transport: the client went away.
  void Cancelled() {
    if (Parked* parked = parked_.load()) parked->OnCancel();
  }

 private:
  std::atomic<Parked*> parked_{nullptr};
};

// A data-path call of the gRPC callback API: the reactor its handler
// returns. Owned by gRPC; deleted in OnDone, which comes after OnCancel.
class GrpcServerCall final : public grpc::ServerUnaryReactor, public ServerCall {
 public:
  // `response` is gRPC's response message, alive until OnDone.
  GrpcServerCall(grpc::CallbackServerContext* context, grpc::ByteBuffer* response)
      : deadline_(absl::FromChrono(context->deadline())), response_(response) {}

  absl::Time deadline() const override { return deadline_; }
  grpc::ByteBuffer* response() override { return response_; }
  void Finish(const grpc::Status& status) override { grpc::ServerUnaryReactor::Finish(status); }

  void OnCancel() override { Cancelled(); }
  void OnDone() override { delete this; }

 private:
  ~GrpcServerCall() override = default;

  const absl::Time deadline_;
  grpc::ByteBuffer* const response_;
};

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_SERVER_CALL_H_
