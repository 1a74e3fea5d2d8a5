// A server interceptor that answers a request body which does not parse as
// the method's request message with INVALID_ARGUMENT and a message naming
// the type ("request body is not a valid shardtrain.PushRequest").
//
// Why an interceptor: gRPC 1.51's callback handlers
// (grpcpp/impl/codegen/server_callback_handlers.h, CallbackUnaryHandler::
// RunHandler) drop the deserialisation status and finish such a call with
// UNIMPLEMENTED and an empty message, which reads as "wrong server". The
// server sees the failure as a POST_RECV_MESSAGE interception whose message
// is null; this interceptor remembers that and rewrites the status at
// PRE_SEND_STATUS. Handlers never see the request, so no state changes.
// Calls whose body parses pay only for the interceptor's bookkeeping.
#ifndef SHARDTRAIN_SERVER_BAD_BODY_INTERCEPTOR_H_
#define SHARDTRAIN_SERVER_BAD_BODY_INTERCEPTOR_H_

#include <memory>
#include <string>

#include <grpcpp/support/server_interceptor.h>

namespace shardtrain::server {

class BadBodyInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

// "shardtrain.PushRequest" for "/shardtrain.ParameterServer/Push" (from the
// generated descriptor pool); empty for a method it does not know or one
// whose client streams (where a missing message is no error).
std::string RequestTypeOf(const char* method);

}  // namespace shardtrain::server

#endif  // SHARDTRAIN_SERVER_BAD_BODY_INTERCEPTOR_H_
